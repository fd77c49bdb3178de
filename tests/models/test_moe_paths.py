"""Qwen3-MoE and Qwen2-MoE (a sparse block of experts in place of the MLP;
Qwen2-MoE's with a gated shared expert) on every fast path, against
transformers' own forward on random tiny configs: the lean forward (logits
and gradients, the router's included), the shared-prompt pass
(use_remove_padding), the native engine's decode loop, continuous batching's
slots, and LoRA on the attention and shared-expert projections."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from thinkrl.models.forward import response_logprobs
from thinkrl.models.lean_decoder import decoder_logits, lean_spec, padding_attention_mask

from fast_paths import (assert_fast_loop_decodes_greedily, assert_slots_give_transformers_logits,
                        lean_forward_gradients)

V = 48
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3,
              tie_word_embeddings=False, eos_token_id=1, num_experts=6, num_experts_per_tok=2,
              moe_intermediate_size=16, mlp_only_layers=[1])  # layer 1 dense: both kinds in one model


def _model(kind: str):
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(head_dim=16, norm_topk_prob=True, **COMMON))
    else:
        model = Qwen2MoeForCausalLM(Qwen2MoeConfig(shared_expert_intermediate_size=24, norm_topk_prob=False,
                                                   **COMMON))
    with torch.no_grad():  # a random router (transformers starts it at zero: every expert tied)
        for layer in model.model.layers:
            if hasattr(layer.mlp, "experts"):
                layer.mlp.gate.weight.normal_(0, 0.5)
    return model


KINDS = ["qwen3_moe", "qwen2_moe"]


def _batch():
    ids = torch.randint(3, V, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :1] = 0, 0
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@pytest.mark.parametrize("kind", KINDS)
def test_lean_forward_logits_and_gradients_equal_transformers(kind):
    model = _model(kind)
    assert lean_spec(model) is not None
    want = lean_forward_gradients(model, *_batch())
    assert want["model.layers.0.mlp.gate.weight"].abs().sum() > 0  # the router learns through the weights


@pytest.mark.parametrize("kind", KINDS)
def test_the_shared_prompt_pass_trains_like_the_padded_forward(kind):
    ids, mask, pos = _batch()
    real = mask[:, -4:].bool()

    def run(remove_padding: bool):
        model = _model(kind)
        logp, ent = response_logprobs(model, ids, mask, pos, response_length=4, temperature=0.9,
                                      with_entropy=True, entropy_grad=True, remove_padding=remove_padding)
        ((logp - 0.1 * ent) * real).sum().backward()
        return logp.detach(), [p.grad for p in model.parameters()]

    (shared, shared_grads), (padded, padded_grads) = run(True), run(False)
    assert torch.allclose(shared[real], padded[real], atol=2e-6)
    for a, b in zip(shared_grads, padded_grads):  # float32 rounding, relative to the tensor's scale
        assert (a - b).abs().max() <= 2e-5 * b.abs().max()


@pytest.mark.parametrize("kind", KINDS)
def test_the_native_engine_decodes_what_transformers_does(kind):
    assert_fast_loop_decodes_greedily(_model(kind).eval())


@pytest.mark.parametrize("kind", KINDS)
def test_continuous_batching_slots_give_transformers_logits(kind):
    assert_slots_give_transformers_logits(_model(kind).eval(), V)


@pytest.mark.parametrize("kind", KINDS)
def test_lora_on_attention_and_shared_projections_equals_the_merged_model(kind):
    peft = pytest.importorskip("peft")
    # Qwen2-MoE's shared expert is a plain MLP; the fused experts themselves are left out here
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"] + (["shared_expert.gate_proj", "shared_expert.up_proj",
                                                          "shared_expert.down_proj"] if kind == "qwen2_moe" else [])
    adapted = peft.get_peft_model(_model(kind), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    ids, mask, pos = _batch()
    inner = adapted.base_model.model
    with torch.no_grad():
        hf = inner(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -5:]
        spec = lean_spec(inner)
        assert spec is not None
        lean = decoder_logits(spec, ids, pos, padding_attention_mask(mask, 9), keep=5)
    real = mask[:, -5:].bool()
    assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)


def test_experts_under_peft_lora_take_transformers_forward():
    """PEFT wraps the fused experts' parameters themselves (its ParamWrapper)
    when gate/up/down are targeted: the lean forward does not compute that, so
    the model takes transformers' forward, which does."""
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(_model("qwen3_moe"), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]))
    assert lean_spec(adapted.base_model.model) is None
