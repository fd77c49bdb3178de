"""Per-token log-probabilities and entropies from logits.

Shape legend: N responses, T tokens, V vocabulary size.

Logits are [N, T, V] and V is large (~150k), so a float32 copy of a bf16
batch can cost more memory than the model. For float32 logits we work in
place of the input; for lower precisions we upcast one response [T, V] at a
time, so at most one row's float32 copy is alive at once.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["entropy_from_logits", "logprobs_from_logits"]


def _rowwise_float32(fn: Callable[..., Tensor], logits: Tensor, *others: Tensor) -> Tensor:
    """Apply ``fn(logits_fp32, *others)`` to the whole batch or row by row."""
    if logits.dtype == torch.float32:
        return fn(logits, *others)
    rows = [fn(logits[i].float(), *(o[i] for o in others)) for i in range(logits.shape[0])]
    return torch.stack(rows) if rows else fn(logits.float(), *others)


def _logprobs(logits: Tensor, labels: Tensor) -> Tensor:
    # log_softmax(z)[y] = z_y - logsumexp(z): gather first, never a second [.., V] tensor.
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _entropy(logits: Tensor) -> Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log p(y_t) = z_{t, y_t} - logsumexp_v z_{t, v}, in float32.

    Args:
        logits: [N, T, V] unnormalised scores z (any float dtype).
        labels: [N, T] long token ids y.

    Returns:
        [N, T] float32 log-probabilities, differentiable w.r.t. ``logits``.
    """
    return _rowwise_float32(_logprobs, logits, labels.long())


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H_t = logsumexp_v z_{t,v} - sum_v softmax(z_t)_v z_{t,v}, in float32.

    Args:
        logits: [N, T, V] unnormalised scores z (any float dtype).

    Returns:
        [N, T] float32 entropies in nats.
    """
    return _rowwise_float32(_entropy, logits)
