"""The rollout engine's drift from the trainer: measured every step, and
optionally corrected with truncated importance sampling.

An engine with its own weights and kernels (vLLM) samples from pi_rollout,
which should equal the trainer's pi_theta on the same weights but never
exactly does (other kernels, other precision; a stale or dropped weight sync
makes it very different). The gap is logged each step so such a fault shows
at once; TIS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
You Off-Policy RL Training"; verl's `algorithm.rollout_is*`) reweights the
policy gradient by pi_theta / pi_rollout, bounded, to correct for it.

Shapes: N responses, R response tokens; `mask` [N, R] is 1 on response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

# exp() of a log-ratio beyond this is inf in float32; such a token is far
# past any threshold anyway.
_MAX_LOG_RATIO = 20.0


def logprob_gap_metrics(rollout_logprobs: Tensor, trainer_logprobs: Tensor, mask: Tensor
                        ) -> dict[str, float]:
    """The engine's sampling log-probs against the trainer's recomputed ones
    on the same tokens, over response tokens ([N, R] each):

        rollout/logprob_diff_mean = mean |log p_rollout - log p_trainer|
        rollout/logprob_diff_max  = max  |log p_rollout - log p_trainer|
        rollout/probs_corr        = Pearson correlation of p_rollout and p_trainer

    (the correlation is 1.0 when either side is constant: nothing to correlate),
    and the same figures under verl's names, so verl users' dashboards keep
    working; verl takes them on probabilities, not log-probs:

        training/rollout_probs_diff_mean|max|std = mean, max, std (unbiased;
            0 for one token) of |p_rollout - p_trainer|
        training/rollout_actor_probs_pearson_corr = rollout/probs_corr
        training/rollout_probs_diff_valid = 1
    """
    keep = mask.bool()
    if not keep.any():
        return {}
    rollout, trainer = rollout_logprobs[keep].double(), trainer_logprobs[keep].double()
    gap = (rollout - trainer).abs()
    p, q = rollout.exp(), trainer.exp()
    p, q = p - p.mean(), q - q.mean()
    denominator = (p.square().sum() * q.square().sum()).sqrt()
    corr = float((p * q).sum() / denominator) if denominator > 0 else 1.0
    prob_gap = (rollout.exp() - trainer.exp()).abs()
    return {"rollout/logprob_diff_mean": float(gap.mean()),
            "rollout/logprob_diff_max": float(gap.max()),
            "rollout/probs_corr": corr,
            "training/rollout_probs_diff_valid": 1,
            "training/rollout_probs_diff_mean": float(prob_gap.mean()),
            "training/rollout_probs_diff_max": float(prob_gap.max()),
            "training/rollout_probs_diff_std": float(prob_gap.std()) if len(prob_gap) > 1 else 0.0,
            "training/rollout_actor_probs_pearson_corr": corr}


@dataclass(frozen=True)
class RolloutCorrection:
    """The settings of `rollout_is_weights` (verl's algorithm.rollout_is_threshold,
    rollout_is_level, rollout_is_mode)."""

    threshold: float
    level: str = "token"
    mode: str = "truncate"


def rollout_is_weights(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *,
                       threshold: float, level: str = "token", mode: str = "truncate"
                       ) -> tuple[Tensor, dict[str, float]]:
    """Importance weights w [N, R] of the trainer's policy against the engine's.

        token level:    w_t = pi_trainer(y_t) / pi_rollout(y_t)
        sequence level: w_t = prod_s w_s over the response's tokens (same for all t)
        truncate:       w  <- min(w, threshold)
        mask:           w  <- 0 where w > threshold (the token, or the whole
                        sequence, leaves the gradient)

    The weights are constants (no gradient) and 0 off the response. Metrics:
    rollout_is/mean, /max, /min of the raw weights over response tokens, and
    rollout_is/clip_frac, the share of them above the threshold.
    """
    keep = mask.bool()
    log_ratio = (trainer_logprobs - rollout_logprobs).detach() * mask
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True).expand_as(log_ratio)
    raw = log_ratio.clamp(max=_MAX_LOG_RATIO).exp()
    over = raw > threshold
    if mode == "truncate":
        weights = raw.clamp(max=threshold)
    else:
        weights = raw.masked_fill(over, 0.0)
    weights = weights * mask
    if not keep.any():
        return weights, {}
    shown = raw[keep]
    return weights, {"rollout_is/mean": float(shown.mean()), "rollout_is/max": float(shown.max()),
                     "rollout_is/min": float(shown.min()),
                     "rollout_is/clip_frac": float(over[keep].float().mean())}
