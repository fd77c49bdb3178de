"""The mixture-of-experts MLP of the lean forward (`thinkrl.models.lean_decoder`):
Qwen3-MoE's and Qwen2-MoE's sparse blocks, on the module's own parameters.

Routing, as transformers computes it (its `*TopKRouter`), for tokens x [T, E]:

    logits = x W_r^T                         [T, X]  (x's dtype; X experts)
    p      = softmax(logits) in float32
    w, i   = top-k of p                      [T, k]  (k = num_experts_per_tok)
    w      = w / sum(w)                      with norm_topk_prob
    out_t  = sum_j w_tj * down_i(silu(gate_i x_t) * up_i x_t)     (i = i_tj)
    Qwen2-MoE adds sigmoid(x_t w_s) * shared_mlp(x_t).

Experts are stored fused per layer (transformers 5): gate_up [X, 2I, E],
down [X, E, I]. Each expert's tokens go through its two products as one
batch, in expert order (transformers' eager order, so results agree to
float32 rounding).

Shapes: T tokens, E hidden, X experts, I expert width, k experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor


TAPE_ATTR = "_thinkrl_route_tape"
"""The attribute `thinkrl.models.routing.install` puts on each router: (tape, layer index)."""


def tape_of(gate: torch.nn.Module):
    """The route tape and layer index installed on a router, if any (`thinkrl.models.routing`)."""
    return getattr(gate, TAPE_ATTR, None)


@dataclass(frozen=True, slots=True)
class ExpertWeights:
    """One sparse block's weights (the parameters themselves, or cast copies)."""

    router: Tensor  # [X, E]
    gate_up: Tensor  # [X, 2I, E]
    down: Tensor  # [X, E, I]
    top_k: int
    norm_topk_prob: bool
    shared_gate_up: Tensor | tuple | None = None  # Qwen2-MoE: [2 I_s, E] or (gate, up)
    shared_down: Tensor | None = None  # [E, I_s]
    shared_gate: Tensor | None = None  # [1, E]
    gate: torch.nn.Module | None = None
    """The router module: a `RouteTape` installed on it records or replays (`thinkrl.models.routing`)."""

    def to(self, dtype: torch.dtype) -> "ExpertWeights":
        """The weights cast once (a decode's loop under autocast); the router stays as it is."""
        cast = (lambda w: None if w is None else
                tuple(x.to(dtype) for x in w) if isinstance(w, tuple) else w.to(dtype))
        return replace(self, gate_up=cast(self.gate_up), down=cast(self.down),  # gate: the module itself
                       shared_gate_up=cast(self.shared_gate_up), shared_down=cast(self.shared_down),
                       shared_gate=cast(self.shared_gate))


def is_sparse_block(mlp: torch.nn.Module) -> bool:
    """A Qwen3-MoE / Qwen2-MoE sparse block: a top-k router and fused experts."""
    gate, experts = getattr(mlp, "gate", None), getattr(mlp, "experts", None)
    return (isinstance(getattr(gate, "weight", None), torch.nn.Parameter) and hasattr(gate, "top_k")
            and isinstance(getattr(experts, "gate_up_proj", None), torch.nn.Parameter)
            and isinstance(getattr(experts, "down_proj", None), torch.nn.Parameter))


def expert_weights_of(mlp: torch.nn.Module, *, fuse: bool, weight, bias) -> ExpertWeights:
    """A sparse block's weights; `weight`/`bias` read a projection (plain or
    LoRA, `lean_decoder.projection_weight` or `split_projection`); `fuse`
    concatenates the shared expert's gate and up."""
    shared = getattr(mlp, "shared_expert", None)
    gate_up = down = gate = None
    if shared is not None:
        parts = (weight(shared.gate_proj), weight(shared.up_proj))
        gate_up = torch.cat(parts) if fuse else parts
        down, gate = weight(shared.down_proj), weight(mlp.shared_expert_gate)
    return ExpertWeights(router=mlp.gate.weight, gate_up=mlp.experts.gate_up_proj, down=mlp.experts.down_proj,
                         top_k=mlp.gate.top_k, norm_topk_prob=bool(mlp.gate.norm_topk_prob),
                         shared_gate_up=gate_up, shared_down=down, shared_gate=gate, gate=mlp.gate)


def route(x: Tensor, weights: ExpertWeights) -> tuple[Tensor, Tensor]:
    """Routing weights [T, k] (x's dtype) and experts [T, k] of tokens x [T, E]."""
    logits = F.linear(x, weights.router.to(x.dtype))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    chosen = torch.topk(probs, weights.top_k, dim=-1).indices
    return taped_choice(weights.gate, probs, chosen, norm_topk_prob=weights.norm_topk_prob, dtype=logits.dtype)


def taped_choice(gate: torch.nn.Module | None, probs: Tensor, native: Tensor, *, norm_topk_prob: bool,
                 dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The experts [T, k] a router uses, its own top-k `native` unless a tape on
    it (router replay) chooses others, and their weights [T, k] in `dtype`: this
    pass's probabilities [T, X] gathered there (so the router keeps its
    gradient), renormalised with norm_topk_prob. Both the lean forward and the
    hook on transformers' router (`thinkrl.models.routing`) route through it."""
    tapped = None if gate is None else tape_of(gate)
    chosen = native if tapped is None else tapped[0].choose(tapped[1], probs, native)
    top = probs.gather(-1, chosen)
    if norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(dtype), chosen


def sparse_mlp(x: Tensor, weights: ExpertWeights, linear) -> Tensor:
    """The block's output for x [N, S, E]; `linear(x, w, b)` applies a
    (possibly split) projection (lean_decoder._linear)."""
    n, s, e = x.shape
    tokens = x.reshape(n * s, e)
    scores, chosen = route(tokens, weights)
    out = torch.zeros_like(tokens)
    flat = chosen.reshape(-1)
    for expert in torch.unique(flat).tolist():
        hits = (flat == expert).nonzero().squeeze(-1)
        token, slot = hits // weights.top_k, hits % weights.top_k
        gate, up = F.linear(tokens[token], weights.gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, weights.down[expert]) * scores[token, slot, None]
        out.index_add_(0, token, y.to(out.dtype))
    if weights.shared_down is not None:
        gate, up = linear(tokens, weights.shared_gate_up, None).chunk(2, dim=-1)
        shared = linear(F.silu(gate) * up, weights.shared_down, None)
        out = out + torch.sigmoid(linear(tokens, weights.shared_gate, None)) * shared
    return out.reshape(n, s, e)
