"""The native rollout engine against references that share none of its code:
an unpadded, cache-free loop of full forward passes, transformers' own
`generate`, and hand-worked top-k / top-p filters.

Shapes: B prompts, G = params.n, N = B*G rows, P prompt columns, R response columns.
"""

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine, filter_logits

PAD = 0
# Three prompts of different lengths, so the batch is left-padded (P = 6).
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16]]
# Eight of the 64 ids end a sampled response, so that within 12 tokens some
# rows stop and some do not (the test checks that seed 2 gives both).
MANY_EOS = list(range(1, 9))


@pytest.fixture(scope="module")
def model():
    # Untied embeddings and a wide init: with tied ones a random model's argmax
    # just repeats its input token, and a greedy comparison would test little.
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, initializer_range=0.3, eos_token_id=1,
                      pad_token_id=PAD)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def prompt_batch(prompts=PROMPTS) -> PromptBatch:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    samples = [Sample(data_source="s", ground_truth=str(i), prompt_text=f"p{i}", index=i)
               for i in range(len(prompts))]
    return PromptBatch(input_ids=ids, attention_mask=mask, samples=samples)


@torch.no_grad()
def greedy_reference(model, prompt: list[int], *, max_tokens: int, eos: set[int]) -> list[int]:
    """argmax of a full forward over the unpadded sequence, one token at a time, no cache."""
    seq, out = list(prompt), []
    for _ in range(max_tokens):
        token = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token in eos:
            break
    return out


def padded(rows: list[list[int]], width: int) -> torch.Tensor:
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


# ---------------------------------------------------------------- greedy decoding

def test_greedy_fixed_length_matches_cache_free_loop(model):
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD)
    r = engine.generate(prompt_batch(), SamplingParams(max_tokens=10, do_sample=False, ignore_eos=True))
    expected = [greedy_reference(model, p, max_tokens=10, eos=set()) for p in PROMPTS]
    assert r.response_ids.tolist() == expected
    assert len(set(sum(expected, []))) > 5  # the model does not just repeat one token


def test_greedy_with_eos_matches_reference_and_hf_generate(model):
    free = [greedy_reference(model, p, max_tokens=10, eos=set()) for p in PROMPTS]
    # Make row 1's third greedy token the EOS: the model does not know which id
    # is EOS, so the tokens before the stop are unchanged. Row 1 then stops after
    # 3 tokens; the check below makes sure another row runs to the limit.
    eos = free[1][2]
    expected = [greedy_reference(model, p, max_tokens=10, eos={eos}) for p in PROMPTS]
    assert len(expected[1]) == 3 and any(len(e) == 10 for e in expected)

    engine = NativeEngine(model, eos_token_ids=[eos], pad_token_id=PAD)
    r = engine.generate(prompt_batch(), SamplingParams(max_tokens=10, do_sample=False))
    assert r.response_ids.tolist() == padded(expected, 10).tolist()
    assert r.finish_reasons == [FINISH_STOP if len(e) < 10 or e[-1] == eos else FINISH_LENGTH
                                for e in expected]

    batch = prompt_batch()
    hf = model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        do_sample=False, max_new_tokens=10, eos_token_id=eos, pad_token_id=PAD)
    assert hf[:, batch.input_ids.shape[1]:].tolist() == r.response_ids.tolist()


def test_greedy_logprobs_are_temperature_one(model):
    # Greedy ignores the temperature: log-probs are log_softmax(logits) at the argmax.
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD)
    r = engine.generate(prompt_batch([PROMPTS[0]]),
                        SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    logits = model(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1]
    assert torch.allclose(r.rollout_logprobs[0, 0], torch.log_softmax(logits, -1).max(), atol=1e-5)


def test_top_k_one_samples_the_greedy_tokens(model):
    # top_k=1 leaves one token to sample from, so any seed gives the greedy
    # answer; the log-prob stays that of the unfiltered softmax(logits / T) (< 0).
    greedy = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD).generate(
        prompt_batch(), SamplingParams(max_tokens=6, do_sample=False, ignore_eos=True))
    sampled = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD, seed=3).generate(
        prompt_batch(), SamplingParams(n=2, max_tokens=6, temperature=0.7, top_k=1, ignore_eos=True))
    assert sampled.response_ids.tolist() == greedy.response_ids.repeat_interleave(2, 0).tolist()
    assert (sampled.rollout_logprobs < 0).all()


# ---------------------------------------------------------------- sampled rollouts

@pytest.fixture(scope="module")
def sampled(model):
    engine = NativeEngine(model, eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=2)
    return engine.generate(prompt_batch(), SamplingParams(n=3, max_tokens=12, temperature=0.7))


def test_rollout_logprobs_equal_a_cache_free_forward_at_temperature(model, sampled):
    # For each row, unpadded: logits at column P_i - 1 + t predict response token t,
    # and the engine's log-prob is log_softmax(logits / 0.7) there.
    checked = 0
    for row in range(len(sampled)):
        prompt = sampled.prompt_ids[row][sampled.prompt_mask[row].bool()].tolist()
        length = int(sampled.response_mask[row].sum())
        response = sampled.response_ids[row, :length].tolist()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + response])).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1:-1] / 0.7, -1)
        expected = logp.gather(-1, torch.tensor(response)[:, None])[:, 0]
        assert torch.allclose(sampled.rollout_logprobs[row, :length], expected, atol=1e-4), row
        assert (sampled.rollout_logprobs[row, length:] == 0).all()
        checked += length
    assert checked > 20


def test_rollout_logprobs_equal_response_logprobs_on_the_padded_batch(model, sampled):
    from thinkrl.models.forward import response_logprobs

    input_ids, attention_mask, position_ids = sampled.sequences()
    with torch.no_grad():
        logp, _ = response_logprobs(model, input_ids, attention_mask, position_ids,
                                    response_length=sampled.response_ids.shape[1], temperature=0.7)
    mask = sampled.response_mask.bool()
    assert torch.allclose(logp[mask], sampled.rollout_logprobs[mask], atol=1e-4)


def test_mask_padding_and_finish_reasons(sampled):
    eos = set(MANY_EOS)
    n, width = sampled.response_ids.shape
    assert n == 9 and width <= 12
    reasons = set()
    for row, (ids, mask) in enumerate(zip(sampled.response_ids.tolist(),
                                          sampled.response_mask.tolist())):
        first = next((t for t, tok in enumerate(ids) if tok in eos), None)
        if first is None:  # ran to the limit: every column is a real token
            assert width == 12 and mask == [1] * 12
            assert sampled.finish_reasons[row] == FINISH_LENGTH
        else:  # 1 up to and including the first EOS, then pad tokens under mask 0
            assert mask == [1] * (first + 1) + [0] * (width - first - 1)
            assert ids[first + 1:] == [PAD] * (width - first - 1)
            assert sampled.finish_reasons[row] == FINISH_STOP
        reasons.add(sampled.finish_reasons[row])
    assert reasons == {FINISH_STOP, FINISH_LENGTH}  # the seed exercises both cases


def test_groups_samples_and_shapes(sampled):
    n, width = sampled.response_ids.shape
    assert sampled.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [s.index for s in sampled.samples] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    batch = prompt_batch()
    assert torch.equal(sampled.prompt_ids, batch.input_ids.repeat_interleave(3, 0))  # [9, 6]
    assert torch.equal(sampled.prompt_mask, batch.attention_mask.repeat_interleave(3, 0))
    for t in (sampled.response_mask, sampled.rollout_logprobs):
        assert t.shape == (n, width)
    assert sampled.response_mask.dtype == torch.long
    assert len(sampled.finish_reasons) == len(sampled.samples) == len(sampled) == 9
    assert sampled.sequences()[0].shape == (9, 6 + width)
    assert all(t.device.type == "cpu" for t in (sampled.response_ids, sampled.rollout_logprobs))


def test_ignore_eos_runs_to_max_tokens(model):
    engine = NativeEngine(model, eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=0)
    r = engine.generate(prompt_batch(), SamplingParams(n=3, max_tokens=12, temperature=0.7,
                                                       ignore_eos=True))
    assert r.response_ids.shape == (9, 12)
    assert (r.response_mask == 1).all()
    assert r.finish_reasons == [FINISH_LENGTH] * 9
    assert torch.isin(r.response_ids, torch.tensor(MANY_EOS)).any()  # it did write EOS ids
    assert (r.rollout_logprobs < 0).all()


# ---------------------------------------------------------------- seeding

def _sample(model, seed):
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD, seed=seed)
    return engine.generate(prompt_batch(), SamplingParams(n=4, max_tokens=8, temperature=1.0))


def test_same_seed_same_rollouts_other_seed_differs(model):
    a, b, c = _sample(model, 7), _sample(model, 7), _sample(model, 8)
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.rollout_logprobs, b.rollout_logprobs)
    assert not torch.equal(a.response_ids, c.response_ids)
    # The G samples of one prompt are different draws, not copies.
    assert not torch.equal(a.response_ids[0], a.response_ids[1])


def test_generator_state_replays_a_call(model):
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD, seed=5)
    params = SamplingParams(n=2, max_tokens=6)
    state = engine.generator_state()
    first = engine.generate(prompt_batch(), params)
    second = engine.generate(prompt_batch(), params)
    engine.set_generator_state(state)
    assert torch.equal(engine.generate(prompt_batch(), params).response_ids, first.response_ids)
    assert not torch.equal(first.response_ids, second.response_ids)


def test_generate_restores_train_mode(model):
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=PAD)
    model.train()
    try:
        engine.generate(prompt_batch(), SamplingParams(max_tokens=2))
        assert model.training
    finally:
        model.eval()


# ---------------------------------------------------------------- filter_logits

def test_top_k_by_hand():
    # logits [1, 3, 2, 0.5]: the two largest are 3 (id 1) and 2 (id 2).
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.5]])
    out = filter_logits(logits, top_k=2, top_p=1.0)
    assert out.tolist() == [[-math.inf, 3.0, 2.0, -math.inf]]
    # top_k = -1 or >= V keeps everything.
    assert torch.equal(filter_logits(logits, top_k=-1, top_p=1.0), logits)
    assert torch.equal(filter_logits(logits, top_k=4, top_p=1.0), logits)


def test_top_p_by_hand():
    # probs [0.5, 0.3, 0.15, 0.05] (given in the shuffled order of `ids`).
    # Mass of the tokens ranked above each one: [0, 0.5, 0.8, 0.95]; a token is
    # dropped when that mass already reaches top_p.
    #   top_p 0.45 -> only 0.5 (nothing above it, so the top token always stays)
    #   top_p 0.75 -> 0.5, 0.3            top_p 0.85 -> 0.5, 0.3, 0.15
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])  # ranks: 0.5 (id 1), 0.3 (id 3), 0.15 (id 0)
    logits = probs.log()[None]

    def kept(top_p):
        return torch.isfinite(filter_logits(logits, top_k=-1, top_p=top_p))[0].nonzero()[:, 0].tolist()

    assert kept(0.45) == [1]
    assert kept(0.75) == [1, 3]
    assert kept(0.85) == [0, 1, 3]
    assert kept(0.99) == [0, 1, 2, 3]
    assert kept(0.01) == [1]


def test_top_p_boundary_keeps_the_smallest_set_reaching_p():
    # logits [3, 2, 1, 1] * ln 2 -> probs [8, 4, 2, 2] / 16 = [0.5, 0.25, 0.125, 0.125],
    # exact in float32. With top_p = 0.75 the first two reach 0.75 exactly, so the
    # third is dropped (the same rule as transformers' TopPLogitsWarper).
    logits = torch.tensor([[3.0, 2.0, 1.0, 1.0]]) * math.log(2)
    out = filter_logits(logits, top_k=-1, top_p=0.75)
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    assert torch.equal(out[0, :2], logits[0, :2])  # kept logits are untouched


def test_filters_match_transformers_warpers():
    gen = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(8, 50, generator=gen)
    for top_k, top_p in [(5, 1.0), (-1, 0.9), (-1, 0.3), (10, 0.8)]:
        expected = logits.clone()
        if top_k > 0:
            expected = TopKLogitsWarper(top_k)(None, expected)
        expected = TopPLogitsWarper(top_p)(None, expected) if top_p < 1 else expected
        out = filter_logits(logits, top_k=top_k, top_p=top_p)
        assert torch.equal(torch.isfinite(out), torch.isfinite(expected)), (top_k, top_p)
        assert (torch.isfinite(out).sum(-1) >= 1).all()
        # the most likely token of every row survives
        assert torch.isfinite(out.gather(-1, logits.argmax(-1, keepdim=True))).all()


def test_min_p_by_hand():
    # probs [0.5, 0.3, 0.15, 0.05] (ids 1, 3, 0, 2). min_p keeps p_i >= min_p * 0.5:
    #   min_p 0.2 -> floor 0.1: drops 0.05     min_p 0.5 -> floor 0.25: keeps 0.5, 0.3
    #   min_p 0.7 -> floor 0.35: keeps 0.5     min_p 0 -> keeps all
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = probs.log()[None]

    def kept(**kw):
        out = filter_logits(logits, **{"top_k": -1, "top_p": 1.0, **kw})
        return torch.isfinite(out)[0].nonzero()[:, 0].tolist()

    assert kept(min_p=0.2) == [0, 1, 3]
    assert kept(min_p=0.5) == [1, 3]
    assert kept(min_p=0.7) == [1]
    assert kept(min_p=0.0) == [0, 1, 2, 3]
    assert torch.equal(filter_logits(logits, top_k=-1, top_p=1.0, min_p=0.2)[0, :2], logits[0, :2])
    # min_p first, then top_p on what is left: after min_p 0.2 the kept probs are
    # [0.5, 0.3, 0.15] / 0.95, so the mass above 0.15 is 0.8 / 0.95 = 0.842 >= 0.83
    # and it goes; without min_p that mass is 0.8 < 0.83 and it stays.
    assert kept(min_p=0.2, top_p=0.83) == [1, 3]
    assert kept(top_p=0.83) == [0, 1, 3]
    # with top_k 1 only the most likely token is left, whatever min_p says
    assert kept(min_p=0.2, top_k=1) == [1]
