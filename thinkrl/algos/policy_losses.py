"""Policy losses beyond PPO's clip, and the registry the actor draws its loss from.

Shape legend: N responses, T response tokens. Every loss is a pure function

    loss_fn(logprob [N, T], old_logprob [N, T], advantages [N, T], response_mask [N, T],
            *, scale: LossScale, rollout_is_weights [N, T] | None, <its settings>) -> (loss, metrics)

registered under verl's ``actor.policy_loss.loss_mode`` name. ``build_policy_loss``
binds the settings from ``ActorConfig`` once, so the actor calls every loss the
same way. As in ``losses.py``, normalisers come from the mini-batch ``scale`` and
metrics are this micro-batch's share, so micro-batch losses and metrics add up to
the mini-batch's: the gradient does not depend on the micro-batch size.
Exception, as in verl: ``clip_cov`` and ``kl_cov`` choose their tokens from the
covariance statistics of the tokens they are given (one micro-batch); with one
micro-batch per mini-batch (the default) that is the whole mini-batch.

Rollout importance weights w (``algorithm.rollout_is``, constants) weigh each
token's loss before aggregation, as verl applies them: l_t <- w_t l_t. GMPO
weighs a sequence by the geometric mean of its tokens' weights instead;
clip_cov and kl_cov choose their tokens without the weights. For a loss
linear in A this is the same as scaling the advantages; for the others it is
not (``tests/algos/test_rollout_is_in_losses.py``).

Formulas follow verl's ``core_algos.py``; each docstring names the paper.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor

from thinkrl.algos.losses import LossScale, agg_loss, masked_share, ppo_clip_policy_loss, weighted
from thinkrl.config.schema import ActorConfig
from thinkrl.errors import UserError

__all__ = [
    "POLICY_LOSSES",
    "PolicyLossFn",
    "build_policy_loss",
    "cispo_policy_loss",
    "clip_cov_policy_loss",
    "geo_mean_policy_loss",
    "gpg_policy_loss",
    "gspo_policy_loss",
    "kl_cov_policy_loss",
    "sapo_policy_loss",
]

PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]
"""A bound loss: (logprob, old_logprob, advantages, response_mask, *, scale,
rollout_is_weights=None) -> (loss, metrics)."""


def _metrics(loss: Tensor, mask: Tensor, scale: LossScale, *, log_ratio: Tensor,
             clipped: Tensor | None = None, clipped_lower: Tensor | None = None) -> dict[str, float]:
    """verl's actor metrics as shares of the mini-batch (see ``masked_share``)."""
    zero = torch.zeros_like(mask, dtype=torch.float32)
    return {
        "actor/pg_loss": float(loss.item()),
        "actor/pg_clipfrac": masked_share(zero if clipped is None else clipped.float(), mask, scale),
        "actor/pg_clipfrac_lower": masked_share(zero if clipped_lower is None else clipped_lower.float(),
                                                mask, scale),
        "actor/ppo_kl": masked_share(-log_ratio, mask, scale),
    }


def gspo_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                     scale: LossScale, rollout_is_weights: Tensor | None = None, clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str
                     ) -> tuple[Tensor, dict[str, float]]:
    """GSPO: PPO's clip on a sequence-level ratio (the geometric mean of token ratios).

        log s_i   = sum_t m (log pi - log pi_old) / max(|y_i|, 1)
        s_{i,t}   = exp(min(sg[log s_i] + log pi_t - sg[log pi_t], 10))   (value s_i; token gradient)
        l_{i,t}   = max(-A s_{i,t}, -A clamp(s_{i,t}, 1 - low, 1 + high))
        loss      = agg_loss(l, mask, loss_agg_mode)

    Every token of response i carries the same clipped term, so the aggregation
    decides how responses are weighed: ``seq-mean-token-mean`` is the paper's
    objective (each response counts once), ``token-mean`` (verl's default) weighs
    a response by its length. verl honours ``loss_agg_mode`` for GSPO since 0.9.1
    (0.9.0 and earlier fixed ``seq-mean-token-mean``). ``actor/pg_clipfrac`` is the
    share of tokens whose sequence ratio is clipped; ``actor/pg_clipfrac_lower`` is 0.

    Zheng et al. 2025, "Group Sequence Policy Optimization" (arXiv:2507.18071).

    Args:
        logprob: [N, T] log pi(y_t) under the policy being trained (with grad).
        old_logprob: [N, T] log pi_old(y_t) from the policy that sampled y.
        advantages: [N, T] advantages A (GSPO's are constant per response).
        response_mask: [N, T] m, 1 on response tokens, 0 on padding; |y_i| = sum_t m.
        scale: normalisers of the whole mini-batch (see ``LossScale``).
        clip_ratio_low, clip_ratio_high: trust region [1 - low, 1 + high] for s_i.
        loss_agg_mode: see ``agg_loss``.

    Returns:
        (loss, metrics): the scalar loss and this micro-batch's share of the metrics.
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob
    seq_log_ratio = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [N]
    log_s = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # [N, T]
    s = torch.exp(log_s.clamp(max=10.0))
    loss_unclipped = -advantages * s
    loss_clipped = -advantages * s.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = agg_loss(weighted(torch.maximum(loss_unclipped, loss_clipped), rollout_is_weights), mask,
                    loss_agg_mode, scale)
    with torch.no_grad():
        metrics = _metrics(loss, mask, scale, log_ratio=log_ratio, clipped=loss_clipped > loss_unclipped)
    return loss, metrics


def sapo_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                     scale: LossScale, rollout_is_weights: Tensor | None = None, tau_pos: float, tau_neg: float) -> tuple[Tensor, dict[str, float]]:
    """SAPO: a smooth sigmoid gate on the token ratio in place of the hard clip.

        r   = exp(clamp(log pi - log pi_old, -20, 20))
        tau = tau_pos where A > 0 else tau_neg
        f   = sigmoid(tau (r - 1)) * 4 / tau        (f(1) = 2 / tau, slope 1 at r = 1)
        l   = -f A;   loss = agg_loss(l, mask, "seq-mean-token-mean")   (loss_agg_mode ignored, as verl)

    Paper: arXiv:2511.20347 (Soft Adaptive Policy Optimization), as verl cites it.
    Args: [N, T] tensors as in the module legend. Returns (loss, metrics; no clip fractions).
    """
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss = agg_loss(weighted(-gate * advantages, rollout_is_weights), response_mask, "seq-mean-token-mean",
                    scale)
    with torch.no_grad():
        metrics = _metrics(loss, response_mask, scale, log_ratio=log_ratio)
    return loss, metrics


def gpg_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                    scale: LossScale, rollout_is_weights: Tensor | None = None, loss_agg_mode: str) -> tuple[Tensor, dict[str, float]]:
    """GPG: plain policy gradient, no ratio and no clip.

        l = -A log pi;   loss = agg_loss(l, mask, loss_agg_mode)

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning" (arXiv:2504.02546). Pair it with ``adv_estimator=gpg``.
    Args: [N, T] tensors as in the module legend (old_logprob feeds only ppo_kl).
    """
    loss = agg_loss(weighted(-logprob * advantages, rollout_is_weights), response_mask, loss_agg_mode, scale)
    with torch.no_grad():
        metrics = _metrics(loss, response_mask, scale, log_ratio=logprob - old_logprob)
    return loss, metrics


def _masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def clip_cov_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                         scale: LossScale, rollout_is_weights: Tensor | None = None, clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str,
                         clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float,
                         generator: torch.Generator | None = None) -> tuple[Tensor, dict[str, float]]:
    """Clip-Cov: PPO's clip, plus no gradient for a few random high-covariance tokens.

        r     = exp(log pi - log pi_old)   (no clamp, as verl)
        l1    = -A r,   l2 = -A clamp(r, 1 - low, 1 + high)
        cov_t = (A_t - mean A) (log pi_t - mean log pi)   (means over the given tokens)
        candidates: mask, not clipped by l2 > l1, clip_cov_lb < cov_t < clip_cov_ub
        k     = max(int(clip_cov_ratio * #tokens), 1) candidates, drawn at random, get c_t = 0 (else 1)
        loss  = agg_loss(max(l1, l2) * c * w, mask, loss_agg_mode)   (w: rollout IS weights, not in the choice)

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models" (arXiv:2505.22617). ``actor/pg_clipfrac`` is the share of dropped tokens.
    Args: [N, T] tensors as in the module legend; ``generator`` draws the tokens (global RNG if None).
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    with torch.no_grad():
        valid = mask > 0
        cov = (advantages - _masked_mean(advantages, mask)) * (logprob - _masked_mean(logprob, mask))
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        where = candidates.nonzero()  # [K, 2]
        count = max(int(clip_cov_ratio * valid.sum().item()), 1)
        keep = torch.ones_like(mask)
        if len(where):
            chosen = where[torch.randperm(len(where), generator=generator)[:count]]
            keep[chosen[:, 0], chosen[:, 1]] = 0.0
    loss = agg_loss(weighted(torch.maximum(loss_unclipped, loss_clipped) * keep, rollout_is_weights), mask,
                    loss_agg_mode, scale)
    with torch.no_grad():
        metrics = _metrics(loss, mask, scale, log_ratio=log_ratio, clipped=keep == 0)
    return loss, metrics


def kl_cov_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                       scale: LossScale, rollout_is_weights: Tensor | None = None, loss_agg_mode: str, kl_cov_ratio: float, ppo_kl_coef: float
                       ) -> tuple[Tensor, dict[str, float]]:
    """KL-Cov: unclipped policy gradient, plus a |log-ratio| penalty on the highest-covariance tokens.

        r     = exp(log pi - log pi_old)   (no clamp, as verl)
        cov_t = (A_t - mean A)(log pi_t - mean log pi)   (means over the given tokens)
        top k = max(1, int(kl_cov_ratio * #tokens)) tokens by cov_t
        l_t   = -A r + ppo_kl_coef |log r|  on the top k,   -A r  elsewhere
        loss  = agg_loss(w l, mask, loss_agg_mode)   (w: rollout IS weights, penalty included, not in the choice)

    Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models" (arXiv:2505.22617). ``actor/ppo_kl`` is mean |log r| here (verl).
    Args: [N, T] tensors as in the module legend.
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob
    ratio = torch.exp(log_ratio)
    loss_pg = -advantages * ratio
    with torch.no_grad():
        valid = (mask > 0).reshape(-1)
        flat = valid.nonzero(as_tuple=True)[0]
        adv, logp = advantages.reshape(-1)[flat], logprob.reshape(-1)[flat]
        cov = (adv - adv.mean()) * (logp - logp.mean())
        count = max(1, int(len(cov) * kl_cov_ratio))
        penalised = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        if len(cov):
            penalised[flat[torch.topk(cov, count).indices]] = True
        penalised = penalised.reshape(mask.shape)
    loss_mat = torch.where(penalised, loss_pg + ppo_kl_coef * log_ratio.abs(), loss_pg)
    loss = agg_loss(weighted(loss_mat, rollout_is_weights), mask, loss_agg_mode, scale)
    with torch.no_grad():
        metrics = _metrics(loss, mask, scale, log_ratio=-log_ratio.abs())
    return loss, metrics


def geo_mean_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                         scale: LossScale, rollout_is_weights: Tensor | None = None, clip_ratio_low: float, clip_ratio_high: float
                         ) -> tuple[Tensor, dict[str, float]]:
    """GMPO: PPO's objective on the geometric mean of the token ratios, clipped per token in log space.

        d_t   = log pi - log pi_old;   d^c_t = clamp(d_t, -low, high)
        d*_t  = sgn(A) min(sgn(A) d_t, sgn(A) d^c_t)        (the pessimistic side, token by token)
        rho_i = exp(sum_t m d*_t / (|y_i| + 1e-8)),   Abar_i = sum_t m A / (|y_i| + 1e-8)
        W_i   = exp(sum_t m log(w_t + 1e-10) / (|y_i| + 1e-8))   (rollout IS weights; 1 without them)
        loss  = sum_i (-Abar_i rho_i W_i) / num_seqs         (a sequence mean; loss_agg_mode ignored)

    verl averages over every row with ``torch.mean``; rows without response tokens
    contribute 0 either way, and the divisor here counts sequences with a token.
    Zhao et al. 2025, "Geometric-Mean Policy Optimization" (arXiv:2507.20673).
    Args: [N, T] tensors as in the module legend (advantages constant per sequence).
    """
    mask = response_mask.to(logprob.dtype)
    log_ratio = logprob - old_logprob
    sign = torch.sign(advantages)
    log_ratio_clamped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clamped)
    lengths = mask.sum(-1) + 1e-8
    rho = torch.exp((pessimistic * mask).sum(-1) / lengths)  # [N]
    seq_adv = (advantages * mask).sum(-1) / lengths  # [N]
    seq_loss = -seq_adv * rho  # [N]
    if rollout_is_weights is not None:  # the geometric mean of the sequence's token weights
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights + 1e-10) * mask).sum(-1) / lengths)
    loss = seq_loss.sum() / scale.num_seqs
    with torch.no_grad():
        clipped = log_ratio != log_ratio_clamped
        metrics = _metrics(loss, mask, scale, log_ratio=log_ratio, clipped=clipped & (advantages > 0),
                           clipped_lower=clipped & (advantages < 0))
    return loss, metrics


def cispo_policy_loss(logprob: Tensor, old_logprob: Tensor, advantages: Tensor, response_mask: Tensor, *,
                      scale: LossScale, rollout_is_weights: Tensor | None = None, clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str
                      ) -> tuple[Tensor, dict[str, float]]:
    """CISPO: REINFORCE weighted by the clipped, stop-gradient importance ratio.

        r    = exp(clamp(log pi - log pi_old, -20, 20))
        l    = -sg[clamp(r, 1 - low, 1 + high)] A log pi
        loss = agg_loss(l, mask, loss_agg_mode)

    Every token keeps a gradient (the clip bounds its weight, it does not drop it).
    MiniMax 2025, "MiniMax-M1" (arXiv:2506.13585). Args: [N, T] tensors as in the module legend.
    """
    log_ratio = (logprob - old_logprob).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high).detach()
    loss = agg_loss(weighted(-weight * advantages * logprob, rollout_is_weights), response_mask,
                    loss_agg_mode, scale)
    with torch.no_grad():
        metrics = _metrics(loss, response_mask, scale, log_ratio=log_ratio, clipped=ratio != weight)
    return loss, metrics


POLICY_LOSSES: dict[str, PolicyLossFn] = {
    "vanilla": ppo_clip_policy_loss,
    "gspo": gspo_policy_loss,
    "sapo": sapo_policy_loss,
    "gpg": gpg_policy_loss,
    "clip_cov": clip_cov_policy_loss,
    "kl_cov": kl_cov_policy_loss,
    "geo_mean": geo_mean_policy_loss,
    "cispo": cispo_policy_loss,
}


def _clip(c: ActorConfig) -> dict[str, float]:
    low = c.clip_ratio if c.clip_ratio_low is None else c.clip_ratio_low
    high = c.clip_ratio if c.clip_ratio_high is None else c.clip_ratio_high
    return {"clip_ratio_low": low, "clip_ratio_high": high}


# The config settings each loss takes, read once when the actor is built.
_SETTINGS: dict[str, Callable[[ActorConfig], dict[str, Any]]] = {
    "vanilla": lambda c: {**_clip(c), "clip_ratio_c": c.clip_ratio_c, "loss_agg_mode": c.loss_agg_mode},
    "gspo": lambda c: {**_clip(c), "loss_agg_mode": c.loss_agg_mode},
    "sapo": lambda c: {"tau_pos": c.tau_pos, "tau_neg": c.tau_neg},
    "gpg": lambda c: {"loss_agg_mode": c.loss_agg_mode},
    "clip_cov": lambda c: {**_clip(c), "loss_agg_mode": c.loss_agg_mode,
                           "clip_cov_ratio": c.policy_loss.clip_cov_ratio,
                           "clip_cov_lb": c.policy_loss.clip_cov_lb, "clip_cov_ub": c.policy_loss.clip_cov_ub},
    "kl_cov": lambda c: {"loss_agg_mode": c.loss_agg_mode, "kl_cov_ratio": c.policy_loss.kl_cov_ratio,
                         "ppo_kl_coef": c.policy_loss.ppo_kl_coef},
    "geo_mean": _clip,
    "cispo": lambda c: {**_clip(c), "loss_agg_mode": c.loss_agg_mode},
}


def build_policy_loss(cfg: ActorConfig) -> PolicyLossFn:
    """``cfg.policy_loss.loss_mode`` with its settings bound: call it as
    ``fn(logprob, old_logprob, advantages, response_mask, scale=scale)``."""
    mode = cfg.policy_loss.loss_mode
    if mode not in POLICY_LOSSES:
        raise UserError(f"actor_rollout_ref.actor.policy_loss.loss_mode={mode} is unknown; "
                         f"use one of: {', '.join(POLICY_LOSSES)}")
    return functools.partial(POLICY_LOSSES[mode], **_SETTINGS[mode](cfg))
