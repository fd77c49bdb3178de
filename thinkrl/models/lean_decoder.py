"""A lean forward pass for Llama/Qwen2/Qwen3-family decoders, on the module's own weights.

Why: at the sizes thinkrl trains on a CPU (hidden 128-1024), a Hugging Face
decoder spends as long in Python, mask building and small unfused kernels
as in its matrix products. This is the same computation written as one
function over the same parameters (so gradients reach them and the
optimizer, FSDP and checkpoints see nothing new), with
- q/k/v as one matrix product and gate/up as one (the weights concatenated
  per call: a copy of the layer's weights, small next to a CPU run's
  activations; a training forward on accelerators or FSDP2 shards takes
  the parameters unconcatenated instead, `split_weights_of`);
- rotary tables built once per call, not once per layer.
Decoding runs its layers over a key/value cache of slots
(`thinkrl.rollout.continuous.SlotDecoder`, from `project_qkv`,
`attend_one` and `finish_layer` here).

Only the plain architecture is covered (`thinkrl.models.lean_spec` says
None otherwise: sliding windows, scaled RoPE, other activations, remote
code, quantized layers; Qwen3's per-head q/k norm is covered); a LoRA-adapted projection (PEFT's lora.Linear) counts as
plain, its weight being W + s B A (`projection_weight`), or W while the
adapter is switched off;
callers then take Hugging Face's forward. Results equal Hugging Face's up
to float32 rounding (different summation order inside fused products:
observed <= 2e-6 relative on logits, see tests/models/test_lean_decoder.py).

Shapes: N rows, S tokens per row, H heads (K of them key/value heads), D
head dim, E hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl.models.lean_moe import ExpertWeights, expert_weights_of, is_sparse_block, sparse_mlp
from thinkrl.models.lean_spec import LeanSpec, lean_spec  # noqa: F401  (callers import them from here)
from thinkrl.models.lora import merged_weight


def projection_weight(module: torch.nn.Module) -> Tensor:
    """A projection's weight [out, in] as its forward applies it: a plain
    nn.Linear's, or LoRA's W + s B A (W while the adapter is switched off),
    in the autograd graph (the gradient reaches A and B)."""
    if type(module) is torch.nn.Linear:
        return module.weight
    weight = module.base_layer.weight
    if module.disable_adapters:
        return weight
    (name,) = module.active_adapters
    return merged_weight(weight, module.lora_A[name].weight, module.lora_B[name].weight, module.scaling[name])


def projection_bias(module: torch.nn.Module) -> Tensor | None:
    return module.bias if type(module) is torch.nn.Linear else module.base_layer.bias


class LowRank(NamedTuple):
    """A LoRA projection kept factored: x W^T + scale (x A^T) B^T. For
    training forwards that must not hold a merged [out, in] copy of each
    weight until the backward (accelerators, FSDP2 shards: `split_weights_of`);
    its backward computes gradients for A and B alone."""

    weight: Tensor
    a: Tensor
    b: Tensor
    scale: float


def split_projection(module: torch.nn.Module) -> Tensor | LowRank:
    """A projection's weight as `split_weights_of` keeps it: the parameter
    itself, or a LoRA one factored (`LowRank`), or W while its adapter is off."""
    if type(module) is torch.nn.Linear or module.disable_adapters:
        return projection_weight(module)
    (name,) = module.active_adapters
    return LowRank(module.base_layer.weight, module.lora_A[name].weight, module.lora_B[name].weight,
                   module.scaling[name])


def project(x: Tensor, weight: Tensor | LowRank, bias: Tensor | None = None) -> Tensor:
    """x W^T + b, for a weight or a factored LoRA one."""
    if isinstance(weight, LowRank):
        return F.linear(x, weight.weight, bias) + weight.scale * F.linear(F.linear(x, weight.a), weight.b)
    return F.linear(x, weight, bias)


def rotary_tables(spec: LeanSpec, position_ids: Tensor, dtype: torch.dtype
                  ) -> tuple[Tensor, Tensor]:
    """cos, sin [N, S, 1, D] for positions [N, S]: angle_{p, i} = p * theta^(-2i/D),
    the two halves of D repeated (the rotate-half convention). Positions
    [1, C] give the table of a whole decode (`RopeTable`)."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float,
                                                       device=position_ids.device) / d))
    freqs = position_ids[..., None].float() * inv_freq  # [N, S, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, :, None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, x [N, S, h, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _rms_norm(x: Tensor, norm: torch.nn.Module, eps: float) -> Tensor:
    """weight * x / sqrt(mean(x^2) + eps), computed in float32 as Hugging Face does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * xf.to(x.dtype)


def padding_attention_mask(attention_mask: Tensor, queries: int) -> Tensor:
    """Boolean [N, 1, Q, S] mask for the last `queries` of S positions: query
    i sees key j when j <= i (causal) and j is a real token. A padding query
    sees itself only, so no softmax row is empty (its output is never read)."""
    n, s = attention_mask.shape
    key_pos = torch.arange(s, device=attention_mask.device)
    query_pos = key_pos[s - queries:]
    causal = key_pos[None, :] <= query_pos[:, None]  # [Q, S]
    mask = causal[None] & attention_mask.bool()[:, None, :]
    mask = mask | (key_pos[None, :] == query_pos[:, None])[None]
    return mask[:, None]


@dataclass(frozen=True, slots=True)
class FusedWeights:
    """One layer's q/k/v and gate/up weights, concatenated (see `fused_weights`)."""

    qkv: Tensor | tuple[Tensor, ...]  # [(H + 2K) D, E], or (q, k, v) unconcatenated
    qkv_bias: Tensor | tuple[Tensor, ...] | None
    gate_up: Tensor | tuple[Tensor, ...] | None  # [2 I, E], or (gate, up); None in a sparse layer
    o: Tensor  # [E, H D]
    o_bias: Tensor | None
    down: Tensor | None  # [E, I]; None in a sparse layer
    experts: ExpertWeights | None = None
    """A mixture-of-experts layer's router and experts (`thinkrl.models.lean_moe`)."""


def fused_weights(spec: LeanSpec, dtype: torch.dtype | None = None) -> list[FusedWeights]:
    """Every layer's fused weights, built once: for a loop of forwards over
    unchanging weights (decoding). They are copies: rebuild after an update.
    `dtype` casts them once (under autocast, instead of once per product)."""
    out = []
    for layer in spec.model.model.layers:
        fused = fused_weights_of(layer)
        if dtype is not None:
            fused = FusedWeights(*(None if w is None else w.to(dtype) for w in (
                fused.qkv, fused.qkv_bias, fused.gate_up, fused.o, fused.o_bias, fused.down, fused.experts)))
        out.append(fused)
    return out


def one_query_bias(mask: Tensor, spec: LeanSpec, dtype: torch.dtype) -> Tensor:
    """The additive form of a decode step's mask [N, 1, 1, T] (True = attend):
    0 or -inf, [N K, H/K, T] as `attend_one` adds it. Built once per step,
    shared by every layer."""
    n, _, _, t = mask.shape
    bias = torch.zeros(n, 1, 1, t, dtype=dtype, device=mask.device)
    bias.masked_fill_(~mask, float("-inf"))
    group = spec.heads // spec.kv_heads
    return bias.expand(n, spec.kv_heads, group, t).reshape(n * spec.kv_heads, group, t)


def attend_one(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Attention of one new query per row, q [N, H, 1, D] over k, v [N, K, T, D]
    (a cache's filled part), bias [N K, H/K, T] (`one_query_bias`):
    softmax(q k^T / sqrt(D) + bias) v, [N, H, 1, D] in q's dtype, computed in
    the cache's dtype. The H/K query heads that share a key head go in one
    product (no repeated keys); scale and mask ride in that product
    (baddbmm). On a CPU this beats the SDPA kernel, which tiles for long
    queries (120 vs 306 us for 64 rows x 4 heads x 60 keys, one thread)."""
    n, h, _, d = q.shape
    kv, t = k.shape[1], k.shape[2]
    with torch.autocast(q.device.type, enabled=False):
        qg = q.to(k.dtype).reshape(n * kv, h // kv, d)
        scores = torch.baddbmm(bias, qg, k.reshape(n * kv, t, d).transpose(1, 2), alpha=d ** -0.5)
        out = torch.bmm(torch.softmax(scores, dim=-1), v.reshape(n * kv, t, d))  # [N K, H/K, D]
    return out.reshape(n, h, 1, d).to(q.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D), masked) v: q [N, H, S, D], k, v [N, K, T, D]
    (K divides H), mask a boolean [N, 1, S, T] (True = attend) or None for
    causal; returns [N, H, S, D] in q's dtype.

    On a CPU it runs in float32 whatever the autocast dtype: PyTorch's CPU
    attention kernels are slower in bfloat16 than in float32 at these sizes
    (a training forward + backward of the small bench model: 240 vs 160 ms;
    decode-step scores: 206 vs 57 us, hence `SlotDecoder`'s float32 cache
    on a CPU), and float32 is the more exact of the two.
    Elsewhere it runs in `attention_dtype`'s choice."""
    dtype, device = q.dtype, q.device.type
    compute = attention_dtype(device, q.dtype, torch.get_autocast_dtype(device)
                              if torch.is_autocast_enabled(device) else None)
    with torch.autocast(device, enabled=False):
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             enable_gqa=k.shape[1] != q.shape[1])
    return out.to(dtype)


def attention_dtype(device_type: str, q_dtype: torch.dtype,
                    autocast_dtype: torch.dtype | None) -> torch.dtype:
    """What `attention` computes in: float32 on a CPU; elsewhere the autocast
    dtype when autocast is on (q/k come out of the rotation in float32,
    v in the autocast dtype), else the queries' dtype."""
    if device_type == "cpu":
        return torch.float32
    return autocast_dtype or q_dtype


def decoder_logits(spec: LeanSpec, input_ids: Tensor, position_ids: Tensor, attn_mask: Tensor | None,
                   *, keep: int, weights: list[FusedWeights] | None = None) -> Tensor:
    """Logits of the last `keep` positions [N, keep, V] for input_ids [N, S].

    `attn_mask` is a boolean [N, 1, S, S] mask (True = attend), or None for
    plain causal attention. `weights`: each layer's (`fused_weights_of`, the
    default, or `split_weights_of`)."""
    model = spec.model.model
    h = model.embed_tokens(input_ids)  # [N, S, E]
    cos, sin = rotary_tables(spec, position_ids, h.dtype)
    for index, layer in enumerate(model.layers):
        fused = weights[index] if weights is not None else fused_weights_of(layer)
        q, k, v = project_qkv(spec, layer, fused, h, cos, sin)
        h = finish_layer(layer, fused, h, attention(q, k, v, attn_mask), spec.eps)
    return final_logits(spec, h[:, -keep:])


def project_qkv(spec: LeanSpec, layer: torch.nn.Module, fused: FusedWeights, h: Tensor,
                cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A layer's rotated queries [N, H, S, D], keys and values [N, K, S, D] of h [N, S, E]."""
    n, s, _ = h.shape
    q_size, kv_size = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
    x = _rms_norm(h, layer.input_layernorm, spec.eps)
    qkv = _linear(x, fused.qkv, fused.qkv_bias)  # [N, S, (H + 2K) D]
    qk, v = qkv.split((q_size + kv_size, kv_size), dim=-1)
    qk = qk.view(n, s, spec.heads + spec.kv_heads, spec.head_dim)
    if spec.qk_norm:  # Qwen3: per-head RMSNorm of queries and keys, before RoPE
        q, k = qk.split((spec.heads, spec.kv_heads), dim=2)
        qk = torch.cat((_rms_norm(q, layer.self_attn.q_norm, spec.eps),
                        _rms_norm(k, layer.self_attn.k_norm, spec.eps)), dim=2)
    # Queries and keys rotate by the same angles: one pass over both (half the small ops).
    qk = _rotate(qk, cos, sin)
    q, k = qk.split((spec.heads, spec.kv_heads), dim=2)
    v = v.view(n, s, spec.kv_heads, spec.head_dim).transpose(1, 2)
    return q.transpose(1, 2), k.transpose(1, 2), v


def finish_layer(layer: torch.nn.Module, fused: FusedWeights, h: Tensor, attended: Tensor,
                 eps: float) -> Tensor:
    """The rest of a layer after attention: output projection and residual,
    then the SiLU-gated MLP (or the sparse experts' block) and residual.
    attended [N, H, S, D] -> h [N, S, E]."""
    n, heads, s, d = attended.shape
    out = attended.transpose(1, 2).reshape(n, s, heads * d)
    h = h + project(out, fused.o, fused.o_bias)
    x = _rms_norm(h, layer.post_attention_layernorm, eps)
    if fused.experts is not None:
        return h + sparse_mlp(x, fused.experts, _linear)
    gate, up = _linear(x, fused.gate_up, None).chunk(2, -1)
    return h + project(F.silu(gate) * up, fused.down)


def final_logits(spec: LeanSpec, h: Tensor) -> Tensor:
    """Final norm and output head: h [N, S, E] -> logits [N, S, V]."""
    return head_logits(spec, final_hidden(spec, h))


def final_hidden(spec: LeanSpec, h: Tensor) -> Tensor:
    """The final norm alone: what the output head multiplies, [N, S, E]."""
    return _rms_norm(h, spec.model.model.norm, spec.eps)


def head_logits(spec: LeanSpec, h: Tensor) -> Tensor:
    """The output head alone: final-normed h [N, S, E] -> logits [N, S, V]."""
    return F.linear(h, spec.model.lm_head.weight, spec.model.lm_head.bias)


def _linear(x: Tensor, weight: Tensor | tuple[Tensor, ...],
            bias: Tensor | tuple[Tensor, ...] | None) -> Tensor:
    """x W^T + b for one weight, or for parts [W_1; W_2; ..] as one output."""
    if isinstance(weight, (Tensor, LowRank)):
        return project(x, weight, bias)
    biases = bias if bias is not None else (None,) * len(weight)
    return torch.cat([project(x, w, b) for w, b in zip(weight, biases)], dim=-1)


def split_weights_of(layer: torch.nn.Module) -> FusedWeights:
    """One layer's weights as the parameters themselves, unconcatenated: for
    a training forward on accelerators or FSDP2 shards, where a product's
    backward keeps its weight. Kept, a parameter costs nothing more (FSDP2
    frees a gathered one after the layer and gathers it again for the
    backward); a concatenated copy would stay whole on the device until the
    backward, for every layer (a whole model's q/k/v and gate/up weights)."""
    attn, mlp = layer.self_attn, layer.mlp
    w, b = split_projection, projection_bias
    bias = None if b(attn.q_proj) is None else (b(attn.q_proj), b(attn.k_proj), b(attn.v_proj))
    qkv = (w(attn.q_proj), w(attn.k_proj), w(attn.v_proj))
    if is_sparse_block(mlp):
        return FusedWeights(qkv=qkv, qkv_bias=bias, gate_up=None, o=w(attn.o_proj), o_bias=b(attn.o_proj),
                            down=None, experts=expert_weights_of(mlp, fuse=False, weight=w, bias=b))
    return FusedWeights(qkv=qkv, qkv_bias=bias, gate_up=(w(mlp.gate_proj), w(mlp.up_proj)),
                        o=w(attn.o_proj), o_bias=b(attn.o_proj), down=w(mlp.down_proj))


def fused_weights_of(layer: torch.nn.Module) -> FusedWeights:
    """One layer's fused weights, concatenated in the autograd graph (training)."""
    attn, mlp = layer.self_attn, layer.mlp
    w, b = projection_weight, projection_bias
    bias = (None if b(attn.q_proj) is None
            else torch.cat((b(attn.q_proj), b(attn.k_proj), b(attn.v_proj))))
    qkv = torch.cat((w(attn.q_proj), w(attn.k_proj), w(attn.v_proj)))
    if is_sparse_block(mlp):
        return FusedWeights(qkv=qkv, qkv_bias=bias, gate_up=None, o=w(attn.o_proj), o_bias=b(attn.o_proj),
                            down=None, experts=expert_weights_of(mlp, fuse=True, weight=w, bias=b))
    return FusedWeights(qkv=qkv, qkv_bias=bias, gate_up=torch.cat((w(mlp.gate_proj), w(mlp.up_proj))),
                        o=w(attn.o_proj), o_bias=b(attn.o_proj), down=w(mlp.down_proj))
