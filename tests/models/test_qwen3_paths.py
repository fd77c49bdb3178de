"""Qwen3 (per-head q/k RMSNorm before RoPE) on every fast path, against
transformers' own forward on random tiny configs: the lean forward (logits
and gradients), the shared-prompt pass (use_remove_padding), the native
engine's fast decode loop, continuous batching's slots, and LoRA's factored
projections."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from thinkrl.models.forward import response_logprobs
from thinkrl.models.lean_decoder import decoder_logits, lean_spec, padding_attention_mask

V = 48


def _qwen3(**extra) -> Qwen3ForCausalLM:
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,  # head_dim != hidden / heads
                      max_position_embeddings=64, initializer_range=0.3, tie_word_embeddings=False,
                      eos_token_id=1, **extra)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # norms away from 1, so that a skipped q/k norm shows
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


def _batch():
    ids = torch.randint(3, V, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :1] = 0, 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_qwen3_has_a_lean_spec_with_its_qk_norm():
    spec = lean_spec(_qwen3())
    assert spec is not None and spec.qk_norm and spec.head_dim == 16


def test_lean_forward_logits_and_gradients_equal_transformers():
    model = _qwen3()
    ids, mask, pos = _batch()
    hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -5:]
    real = mask[:, -5:].bool()
    hf[real].logsumexp(-1).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lean = decoder_logits(lean_spec(model), ids, pos, padding_attention_mask(mask, 9), keep=5)
    lean[real].logsumexp(-1).sum().backward()
    assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4), name


def test_the_shared_prompt_pass_equals_the_padded_forward():
    model = _qwen3()
    g, r = 3, 6
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, V, (2, 5), generator=gen)
    prompt_mask = torch.ones(2, 5, dtype=torch.long)
    prompt_mask[1, :2] = 0
    response_mask = (torch.arange(r)[None] < torch.tensor([6, 2, 4, 1, 3, 2])[:, None]).long()
    responses = torch.randint(3, V, (2 * g, r), generator=gen) * response_mask
    ids = torch.cat((prompts.repeat_interleave(g, 0) * prompt_mask.repeat_interleave(g, 0), responses), 1)
    mask = torch.cat((prompt_mask.repeat_interleave(g, 0), response_mask), 1)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        padded, _ = response_logprobs(model, ids, mask, pos, response_length=r, temperature=0.8)
        shared, _ = response_logprobs(model, ids, mask, pos, response_length=r, temperature=0.8,
                                      remove_padding=True)
    real = response_mask.bool()
    assert torch.allclose(shared[real], padded[real], atol=2e-6)


@torch.no_grad()
def _greedy(model, prompt: list[int], steps: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(steps):
        token = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token == 1:
            break
    return out


def test_the_native_engines_fast_loop_decodes_what_transformers_does():
    from thinkrl.records import PromptBatch, Sample
    from thinkrl.rollout.base import SamplingParams
    from thinkrl.rollout.native import NativeEngine

    model = _qwen3().eval()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16]]
    width = max(map(len, prompts))
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):], mask[row, width - len(p):] = torch.tensor(p), 1
    batch = PromptBatch(input_ids=ids, attention_mask=mask,
                        samples=[Sample(data_source="s", ground_truth="0", prompt_text="p", index=i)
                                 for i in range(3)])
    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=0)
    assert engine._lean is not None  # the fast loop, not the padded one
    out = engine.generate(batch, SamplingParams(n=1, max_tokens=10, temperature=0.0, do_sample=False))
    for row, p in enumerate(prompts):
        got = out.response_ids[row][out.response_mask[row].bool()].tolist()
        assert got == _greedy(model, p, 10), row


@pytest.mark.parametrize("rank", [4])
def test_lora_factored_projections_equal_the_merged_model(rank):
    peft = pytest.importorskip("peft")
    model = _qwen3()
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=rank, lora_alpha=8, target_modules="all-linear",
                                                         init_lora_weights=False))
    ids, mask, pos = _batch()
    inner = adapted.base_model.model
    with torch.no_grad():
        hf = inner(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -5:]
        spec = lean_spec(inner)
        assert spec is not None and spec.qk_norm
        lean = decoder_logits(spec, ids, pos, padding_attention_mask(mask, 9), keep=5)
    real = mask[:, -5:].bool()
    assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)


def test_continuous_batching_slots_give_transformers_logits():
    from thinkrl.rollout.continuous import SlotDecoder

    model = _qwen3().eval()
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, V, (n,), generator=generator) for n in (7, 12, 5)]

    def reference(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids[None]).logits[0, -1]

    with torch.no_grad():
        decoder = SlotDecoder(lean_spec(model), slots=3, device=torch.device("cpu"))
        rows = torch.tensor([0, 1, 2])
        logits = decoder.prefill(rows, sequences)
        for step in range(3):
            token = logits.argmax(-1)
            sequences = [torch.cat([s, token[i:i + 1]]) for i, s in enumerate(sequences)]
            logits = decoder.step(rows, token)
            for i, s in enumerate(sequences):
                assert torch.allclose(logits[i], reference(s), atol=1e-4), (step, i)


def test_the_padding_free_pass_trains_like_the_padded_forward_without_a_note(caplog):
    """model.use_remove_padding=True on Qwen3: the shared-prompt pass, silently (no
    fallback note), with the padded forward's gradients of (log-prob - 0.1 entropy)."""
    ids, mask, pos = _batch()
    real = mask[:, -4:].bool()

    def grads(remove_padding: bool):
        model = _qwen3()
        logp, ent = response_logprobs(model, ids, mask, pos, response_length=4, temperature=0.9,
                                      with_entropy=True, entropy_grad=True, remove_padding=remove_padding)
        ((logp - 0.1 * ent) * real).sum().backward()
        return [p.grad for p in model.parameters()]
    with caplog.at_level("WARNING", logger="thinkrl"):
        shared = grads(True)
    assert not [r for r in caplog.records if "use_remove_padding" in r.getMessage()]
    for a, b in zip(shared, grads(False)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_a_model_the_pass_does_not_compute_says_so_once(caplog):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import thinkrl.models.forward as forward

    forward._SAID.discard("qwen2")
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu"))
    ids, mask, pos = _batch()
    with caplog.at_level("WARNING", logger="thinkrl"), torch.no_grad():
        for _ in range(2):
            response_logprobs(model, ids, mask, pos, response_length=4, temperature=1.0, remove_padding=True)
    said = [r.getMessage() for r in caplog.records if "use_remove_padding" in r.getMessage()]
    assert len(said) == 1 and "qwen2 models take (the pass computes" in said[0]
