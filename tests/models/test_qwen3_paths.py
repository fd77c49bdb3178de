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

from fast_paths import (assert_fast_loop_decodes_greedily, assert_slots_give_transformers_logits,
                        lean_forward_gradients)

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
    lean_forward_gradients(_qwen3(), *_batch())


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


def test_the_native_engines_fast_loop_decodes_what_transformers_does():
    assert_fast_loop_decodes_greedily(_qwen3().eval())


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
    assert_slots_give_transformers_logits(_qwen3().eval(), V)


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
