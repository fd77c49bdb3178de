"""The slot decoder's batch loop (prefill once per prompt, a cache of slots,
finished rows leaving the batch: `thinkrl.rollout.continuous.decode`)
against the padded loop, which test_native.py checks against references
sharing none of its code.

Shapes: B prompts, G = params.n, N = B*G rows, R response columns.
"""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from thinkrl.models.lean_decoder import lean_spec
from thinkrl.rollout import continuous
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine

from tests.rollout.test_native import MANY_EOS, PAD, model, prompt_batch  # noqa: F401  (fixture)


def both(model, params: SamplingParams, *, eos=MANY_EOS, seed=2, prompts=None):
    """The fast and the padded engine's rollouts of the same prompts, same seed."""
    out = []
    for fast in (True, False):
        engine = NativeEngine(model, eos_token_ids=eos, pad_token_id=PAD, seed=seed, fast=fast)
        assert (engine._lean is not None) == fast
        out.append(engine.generate(prompt_batch() if prompts is None else prompt_batch(prompts),
                                   params))
    return out


@pytest.mark.parametrize("params", [
    SamplingParams(n=3, max_tokens=12, temperature=0.7),  # rows stop early: compaction runs
    SamplingParams(n=4, max_tokens=9, temperature=1.0, top_k=5, top_p=0.9, min_p=0.05),
    SamplingParams(n=2, max_tokens=10, do_sample=False),
    SamplingParams(n=3, max_tokens=7, temperature=0.7, ignore_eos=True),
], ids=["eos", "filters", "greedy", "ignore_eos"])
def test_fast_loop_samples_what_the_padded_loop_samples(model, params):
    fast, padded = both(model, params)
    assert torch.equal(fast.response_ids, padded.response_ids)
    assert torch.equal(fast.response_mask, padded.response_mask)
    assert fast.finish_reasons == padded.finish_reasons
    # float32 rounding of a different summation order only (observed <= 1e-6)
    assert torch.allclose(fast.rollout_logprobs, padded.rollout_logprobs, atol=1e-5, rtol=0)
    assert torch.equal(fast.prompt_ids, padded.prompt_ids)


def test_one_token_prompts(model):
    # The prefill is then one token per row too: it must not take the decode-step path.
    fast, padded = both(model, SamplingParams(n=2, max_tokens=6, temperature=0.7),
                        prompts=[[5], [7]])
    assert torch.equal(fast.response_ids, padded.response_ids)
    assert torch.allclose(fast.rollout_logprobs, padded.rollout_logprobs, atol=1e-5, rtol=0)


def test_compaction_happened_and_kept_late_rows_exact(model):
    # MANY_EOS with seed 2: some rows stop within a few tokens, some run to 12,
    # so the batch is cut at least once and the survivors must still match.
    fast, padded = both(model, SamplingParams(n=3, max_tokens=12, temperature=0.7))
    lengths = fast.response_mask.sum(-1)
    assert lengths.min() <= 3 and lengths.max() == 12
    assert (lengths <= 9).sum() >= continuous.COMPACT_SHARE * len(lengths)


def test_sample_rows_draws_like_multinomial_over_all_rows():
    probs = torch.softmax(torch.randn(6, 11, generator=torch.Generator().manual_seed(0)), -1)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    full = torch.multinomial(probs, 1, generator=g1)[:, 0]
    rows = torch.tensor([1, 4, 5])
    part = continuous.sample_rows(probs[rows].log(), rows, 6, generator=g2,
                                   probs_of=lambda z: torch.softmax(z, -1))
    assert part.tolist() == full[rows].tolist()
    assert torch.equal(g1.get_state(), g2.get_state())  # the stream stays in step


def test_kept_slots_are_renumbered_and_go_on_as_they_were(model):
    # Compaction (keep) and growth past the preallocated capacity must leave
    # every kept slot continuing exactly as it would have without them.
    spec = lean_spec(model)
    sequences = [torch.tensor([5, 6, 7]), torch.tensor([8, 9]), torch.tensor([3, 4, 5, 6])]
    whole = continuous.SlotDecoder(spec, slots=3, device=torch.device("cpu"), capacity=4)
    kept = continuous.SlotDecoder(spec, slots=3, device=torch.device("cpu"), capacity=4)
    with torch.no_grad():
        whole.prefill(torch.arange(3), sequences)
        kept.prefill(torch.arange(3), sequences)
        kept.keep(torch.tensor([0, 2]))
        assert kept.slots == 2 and kept.lengths.tolist() == [3, 4]
        for token in (11, 12, 13):  # past capacity 4: the cache grows, keeping what it holds
            expected = whole.step(torch.arange(3), torch.full((3,), token))
            got = kept.step(torch.arange(2), torch.full((2,), token))
            assert torch.allclose(got, expected[[0, 2]], atol=1e-5, rtol=0)  # batch size: rounding only
    assert kept.capacity > 4 and kept.lengths.tolist() == [6, 7]


def test_other_architectures_take_the_padded_loop():
    # A sliding window is not what the lean forward computes: the engine falls back.
    cfg = MistralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, sliding_window=4)
    model = MistralForCausalLM(cfg)
    assert lean_spec(model) is None
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD)
    assert engine._lean is None
    r = engine.generate(prompt_batch(), SamplingParams(max_tokens=3, ignore_eos=True))
    assert r.response_ids.shape == (3, 3)
