"""The load-balancing auxiliary loss of mixture-of-experts routers, as
transformers computes it (`load_balancing_loss_func` of Qwen3-MoE and
Qwen2-MoE, Switch Transformer's loss) and weighs it (`router_aux_loss_coef`).

Over the real tokens t of every sparse layer pooled (M of them, mask m):

    f_{j,e} = sum_t m_t [expert e is token t's j-th choice] / M      [k, X]
    P_e     = sum_t m_t p_{t,e} / M                                  [X]
    aux     = X * sum_{j,e} f_{j,e} P_e

p the router's softmax over all X experts; the choices are the router's own
top-k (never replayed ones, as verl). Only P carries a gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def load_balancing_loss(probs: list[Tensor], chosen: list[Tensor], token_mask: Tensor) -> Tensor:
    """aux of the formula above. probs: per sparse layer [T, X] (float32, with
    grad); chosen: per layer [T, k] the router's own top-k; token_mask [T]
    (1 real token, 0 padding)."""
    experts = probs[0].shape[-1]
    p = torch.cat(probs)  # [L T, X]
    k = torch.cat(chosen).long()  # [L T, k]
    m = token_mask.to(p.dtype).repeat(len(probs))  # [L T]
    total = m.sum().clamp(min=1)
    f = (torch.nn.functional.one_hot(k, experts).to(p.dtype) * m[:, None, None]).sum(0) / total  # [k, X]
    share = (p * m[:, None]).sum(0) / total  # [X]
    return experts * (f * share[None]).sum()
