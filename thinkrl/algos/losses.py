"""Policy-gradient loss and its token aggregation.

Shape legend: N responses = B prompts x G samples, T response tokens.

A mini-batch is often split into micro-batches (gradient accumulation) and
across data-parallel ranks. Every normaliser here therefore comes from a
``LossScale`` measured once over the WHOLE mini-batch: each micro-batch loss
is then its exact share, and summing the micro-batch losses (or gradients,
or metrics) gives the mini-batch value whatever the micro-batch size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from thinkrl.errors import UserError

__all__ = [
    "LOSS_AGG_MODES",
    "LossScale",
    "agg_loss",
    "check_loss_agg_mode",
    "masked_share",
    "ppo_clip_policy_loss",
]


@dataclass(frozen=True, slots=True)
class LossScale:
    """Normalisers of one mini-batch, summed over its micro-batches and ranks."""

    num_tokens: float
    """Response tokens in the mini-batch (sum of the response mask)."""
    num_seqs: float
    """Responses in the mini-batch with at least one response token."""
    response_length: int
    """Maximum response length T_max, the constant divisor of Dr. GRPO."""

    def __post_init__(self) -> None:
        if self.num_tokens <= 0 or self.num_seqs <= 0 or self.response_length <= 0:
            raise ValueError(
                f"LossScale needs positive normalisers, got {self}; "
                "measure it with LossScale.of(response_mask) over the whole mini-batch."
            )

    @classmethod
    def of(cls, response_mask: Tensor, *, response_length: int | None = None) -> LossScale:
        """Measure a (mini-)batch from its ``response_mask`` [N, T].

        ``response_length`` defaults to T. Counts are floored at 1 so that an
        all-padding batch yields a zero loss rather than NaN. With several
        ranks, all-reduce (sum) num_tokens and num_seqs before building one.
        """
        mask = response_mask.float()
        num_tokens = float(mask.sum().item())
        # Rows without a response token (padding rows) carry no sequence to average.
        num_seqs = float((mask.sum(dim=-1) > 0).sum().item())
        length = response_mask.shape[-1] if response_length is None else response_length
        return cls(num_tokens=max(num_tokens, 1.0), num_seqs=max(num_seqs, 1.0), response_length=int(length))


def _token_mean(loss_mat: Tensor, loss_mask: Tensor, scale: LossScale) -> Tensor:
    # Every token weighs the same, so long responses dominate the gradient.
    return (loss_mat * loss_mask).sum() / scale.num_tokens


def _seq_mean_token_sum(loss_mat: Tensor, loss_mask: Tensor, scale: LossScale) -> Tensor:
    return (loss_mat * loss_mask).sum() / scale.num_seqs


def _seq_mean_token_mean(loss_mat: Tensor, loss_mask: Tensor, scale: LossScale) -> Tensor:
    # Every response weighs the same; max(., 1) keeps all-padding rows at 0, not NaN.
    seq_len = loss_mask.sum(dim=-1).clamp(min=1)  # [N]
    seq_means = (loss_mat * loss_mask).sum(dim=-1) / seq_len  # [N]
    return seq_means.sum() / scale.num_seqs


def _seq_mean_token_sum_norm(loss_mat: Tensor, loss_mask: Tensor, scale: LossScale) -> Tensor:
    # Dr. GRPO: a constant divisor removes the length bias of per-response means.
    return (loss_mat * loss_mask).sum() / (scale.num_seqs * scale.response_length)


LOSS_AGG_MODES: dict[str, Callable[[Tensor, Tensor, LossScale], Tensor]] = {
    "token-mean": _token_mean,
    "seq-mean-token-sum": _seq_mean_token_sum,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}


def check_loss_agg_mode(mode: str) -> None:
    """Raise ``ValueError`` unless ``mode`` is a known loss aggregation mode."""
    if mode not in LOSS_AGG_MODES:
        known = ", ".join(LOSS_AGG_MODES)
        raise UserError(f"Unknown loss_agg_mode {mode!r}; set loss_agg_mode to one of: {known}.")


def agg_loss(loss_mat: Tensor, loss_mask: Tensor, mode: str, scale: LossScale) -> Tensor:
    """Reduce a per-token loss to this micro-batch's share of the mini-batch loss.

        token-mean:              sum_{i,t} l m / num_tokens
        seq-mean-token-sum:      sum_i (sum_t l m) / num_seqs
        seq-mean-token-mean:     sum_i (sum_t l m / max(sum_t m, 1)) / num_seqs
        seq-mean-token-sum-norm: sum_{i,t} l m / (num_seqs * response_length)

    Args:
        loss_mat: [N, T] per-token loss l.
        loss_mask: [N, T] 1 on response tokens, 0 on padding (m).
        mode: one of ``LOSS_AGG_MODES``.
        scale: normalisers of the whole mini-batch (see ``LossScale``).

    Returns:
        Scalar tensor, differentiable w.r.t. ``loss_mat``.
    """
    check_loss_agg_mode(mode)
    return LOSS_AGG_MODES[mode](loss_mat, loss_mask.to(loss_mat.dtype), scale)


def weighted(loss_mat: Tensor, rollout_is_weights: Tensor | None) -> Tensor:
    """l_t w_t: a per-token loss [N, T] weighed by the rollout importance weights
    (constants, [N, T]) before aggregation, as verl applies them; `loss_mat` itself when None."""
    return loss_mat if rollout_is_weights is None else loss_mat * rollout_is_weights.detach()


def masked_share(values: Tensor, mask: Tensor, scale: LossScale) -> float:
    """sum(values * mask) / scale.num_tokens, for a metric summed over micro-batches.

    Args: values [N, T], mask [N, T]; returns a python float.
    """
    return float((values.detach().float() * mask.float()).sum().item() / scale.num_tokens)


def ppo_clip_policy_loss(
    logprob: Tensor,
    old_logprob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    scale: LossScale,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with dual clip (Ye et al. 2020) for negative advantages.

        rho  = exp(clamp(log pi - log pi_old, -20, 20))
        l1   = -A rho,   l2 = -A clamp(rho, 1 - clip_ratio_low, 1 + clip_ratio_high)
        l    = max(l1, l2)
        l    = min(l, -A clip_ratio_c)   where A < 0  (bounds the loss of a huge rho)
        loss = agg_loss(w l, mask, loss_agg_mode, scale)   (w: rollout IS weights, else 1)

    Args:
        logprob: [N, T] log pi(y_t) under the policy being trained (with grad).
        old_logprob: [N, T] log pi_old(y_t) from the policy that sampled y.
        advantages: [N, T] per-token advantages A.
        response_mask: [N, T] 1 on response tokens, 0 on padding.
        clip_ratio_low, clip_ratio_high: trust region [1 - low, 1 + high] for rho.
        clip_ratio_c: dual-clip bound (> 1) on the loss of tokens with A < 0.
        loss_agg_mode: see ``agg_loss``.
        scale: normalisers of the whole mini-batch.
        rollout_is_weights: [N, T] constant weights w (algorithm.rollout_is), or None.

    Returns:
        (loss, metrics): the scalar loss and, as this micro-batch's share of the
        mini-batch value, ``actor/pg_loss``, ``actor/pg_clipfrac`` (tokens where the
        trust-region clip binds), ``actor/pg_clipfrac_lower`` (tokens where the dual
        clip binds) and ``actor/ppo_kl`` (k1 estimate of KL(pi_old || pi)).
    """
    if clip_ratio_c <= 1.0:
        raise UserError(
            f"clip_ratio_c must be greater than 1 for the dual clip to bound anything, got {clip_ratio_c}; "
            "the usual value is 3.0."
        )
    # Clamping the log-ratio keeps exp finite when the policies drift far apart.
    log_ratio = (logprob - old_logprob).clamp(min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(min=1.0 - clip_ratio_low, max=1.0 + clip_ratio_high)
    loss_trust = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = -advantages * clip_ratio_c
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(loss_trust, loss_dual), loss_trust)

    pg_loss = agg_loss(weighted(loss_mat, rollout_is_weights), response_mask, loss_agg_mode, scale)

    with torch.no_grad():
        clipped = (loss_clipped > loss_unclipped).float()
        dual_clipped = ((loss_trust > loss_dual) & negative).float()
        metrics = {
            "actor/pg_loss": float(pg_loss.item()),
            "actor/pg_clipfrac": masked_share(clipped, response_mask, scale),
            "actor/pg_clipfrac_lower": masked_share(dual_clipped, response_mask, scale),
            "actor/ppo_kl": masked_share(-log_ratio, response_mask, scale),
        }
    return pg_loss, metrics
