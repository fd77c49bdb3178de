"""Which models the lean forward (`thinkrl.models.lean_decoder`) computes
exactly, and what it needs to know about them: `lean_spec(model)` is their
LeanSpec, or None for any other architecture (the caller then takes the
model's own forward)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


# model_type values whose decoder layer is exactly: RMSNorm -> attention with
# RoPE (q/k/v biases optional) -> residual -> RMSNorm -> SiLU-gated MLP -> residual.
# Qwen3 adds an RMSNorm over each head's queries and keys before RoPE (q_norm, k_norm).
# Qwen3-MoE and Qwen2-MoE are those layers with a sparse block of experts in
# place of the MLP (`thinkrl.models.lean_moe`; Qwen2-MoE's with a gated shared expert).
_PLAIN_DECODERS = ("llama", "qwen2", "mistral", "qwen3", "qwen3_moe", "qwen2_moe")
_QK_NORM_DECODERS = ("qwen3", "qwen3_moe")


@dataclass(frozen=True, slots=True)
class LeanSpec:
    """What the lean forward needs to know about a model (weights stay in it)."""

    model: torch.nn.Module  # the *ForCausalLM module
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float
    qk_norm: bool = False
    """Qwen3: each head's queries and keys pass an RMSNorm (self_attn.q_norm, k_norm) before RoPE."""


def lean_spec(model: torch.nn.Module) -> LeanSpec | None:
    """The model's LeanSpec, or None when its architecture is not the plain
    decoder this module computes exactly (the caller then uses the model's
    own forward)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not plain_decoder_config(cfg):
        return None
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(model, "lm_head"):
        return None
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    if not all(_plain_layer(layer) for layer in inner.layers):
        return None
    qk_norm = cfg.model_type in _QK_NORM_DECODERS
    if qk_norm and not all(hasattr(layer.self_attn, "q_norm") and hasattr(layer.self_attn, "k_norm")
                           for layer in inner.layers):
        return None
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return LeanSpec(model=model, heads=cfg.num_attention_heads,
                    kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                    eps=cfg.rms_norm_eps, rope_theta=float(theta), qk_norm=qk_norm)


def plain_decoder_config(cfg) -> bool:
    """What the config alone says of `lean_spec`'s conditions (the doctor
    judges a model from its config.json): a plain decoder type, default RoPE,
    SiLU, no sliding window, full attention everywhere, no MLP bias."""
    if getattr(cfg, "model_type", None) not in _PLAIN_DECODERS:
        return False
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default" or rope.get("rope_theta", getattr(cfg, "rope_theta", None)) is None:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "use_sliding_window", False):
        return False
    if getattr(cfg, "sliding_window", None) and cfg.model_type == "mistral":
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False
    return not getattr(cfg, "mlp_bias", False) and getattr(cfg, "pretraining_tp", 1) == 1


def _plain_layer(layer: torch.nn.Module) -> bool:
    """Whether every projection is a plain nn.Linear, or a LoRA one over it
    (`_lora_linear`): quantized modules and other adapters compute something
    else from their weights."""
    from thinkrl.models.lean_moe import is_sparse_block

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return False
    projections = [(attn, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    if hasattr(mlp, "experts") and not is_sparse_block(mlp):
        return False  # experts wrapped (PEFT's LoRA on their fused parameters): transformers' forward
    if not is_sparse_block(mlp):
        projections += [(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")]
    elif hasattr(mlp, "shared_expert"):  # Qwen2-MoE: a plain MLP beside the experts, and its gate
        projections += [(mlp.shared_expert, name) for name in ("gate_proj", "up_proj", "down_proj")]
        projections.append((mlp, "shared_expert_gate"))
    return all(type(getattr(module, name, None)) is torch.nn.Linear or _lora_linear(getattr(module, name))
               for module, name in projections)


def _lora_linear(module: torch.nn.Module) -> bool:
    """PEFT's lora.Linear over a plain nn.Linear with one active adapter, no
    dropout, no DoRA and nothing merged in: x (W + s B A)^T + b exactly."""
    if type(module).__name__ != "Linear" or not type(module).__module__.startswith("peft.tuners.lora"):
        return False
    active = list(getattr(module, "active_adapters", ()))
    return (type(getattr(module, "base_layer", None)) is torch.nn.Linear and len(active) == 1
            and not module.merged and not any(module.use_dora.values()) and not module.lora_variant
            and not any(module.lora_bias.values())
            and type(module.lora_dropout[active[0]]) is torch.nn.Identity)
