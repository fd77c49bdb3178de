"""On-policy distillation: the student's sampled tokens scored by a frozen teacher.

Shape legend: N responses, T response tokens. s = log pi_student(y_t) (with
grad), s_old = log pi_old(y_t), q = log pi_teacher(y_t); y is sampled from
the student, so each KL estimator of `thinkrl.algos.kl` applied to (s, q) is
a single-sample estimate of the reverse KL(pi_student || pi_teacher) at t.

The loss, as verl's ``trainer/distillation/losses.py`` computes it:

    d_t  = clamp(kl_mode(s_t, q_t), -c, c)          (c = loss_max_clamp; no clamp when None)
    supervised (use_policy_gradient=False):
        L_distill = agg_loss(d, mask)                (GKD: the divergence itself, k3 by default)
    policy gradient (use_policy_gradient=True):
        L_distill = ppo_clip(s, s_old, A = -sg[d])   (Thinking Machines' OPD: k1, A_t = q_t - s_t)
    L = L_task + coef * L_distill    with use_task_rewards (GRPO + OPD)
    L = L_distill                    without (pure OPD: the task loss, its entropy
                                     bonus and KL loss included, is dropped)

With use_policy_gradient and task rewards the sum is two PPO terms on one
ratio, with advantages A_task and -coef d: slime's additive form
A <- A_task - coef d, except that each term is clipped by its own sign.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.losses import LossScale, agg_loss, masked_share, ppo_clip_policy_loss
from thinkrl.config.schema_distill import DistillationLossConfig

__all__ = ["DistillSettings", "distillation_loss", "reverse_kl_metrics"]

DUAL_CLIP = 3.0
"""verl's vanilla loss reads clip_ratio_c from its config, which the
distillation loss config lacks: the default 3.0 applies."""


@dataclass(frozen=True)
class DistillSettings:
    """distillation.distillation_loss.* as the actor's loss reads them."""

    loss_mode: str
    use_task_rewards: bool
    coef: float
    loss_max_clamp: float | None
    use_policy_gradient: bool
    clip_ratio_low: float
    clip_ratio_high: float

    @classmethod
    def of(cls, cfg: DistillationLossConfig) -> "DistillSettings":
        return cls(cfg.loss_mode, cfg.use_task_rewards, cfg.distillation_loss_coef, cfg.loss_max_clamp,
                   cfg.use_policy_gradient, cfg.clip_ratio_low, cfg.clip_ratio_high)

    @property
    def weight(self) -> float:
        """The distillation term's weight in the total: coef beside the task loss, else 1 (verl)."""
        return self.coef if self.use_task_rewards else 1.0


def distillation_loss(logprob: Tensor, old_logprob: Tensor, teacher_logprob: Tensor, response_mask: Tensor, *,
                      settings: DistillSettings, loss_agg_mode: str, scale: LossScale,
                      rollout_is_weights: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """This micro-batch's share of L_distill (module docstring) and its metrics.

    Args:
        logprob: [N, T] s, with grad.  old_logprob: [N, T] s_old (the policy gradient's ratio).
        teacher_logprob: [N, T] q.  response_mask: [N, T].
        rollout_is_weights: [N, T] algorithm.rollout_is's weights, applied to the
            policy-gradient form only (as verl).

    Returns:
        (loss, metrics): ``distillation/loss`` and ``distillation/abs_loss`` (mean |d|
        before the clamp), and with the policy gradient ``distillation/pg_clipfrac``,
        ``distillation/ppo_kl``, ... (verl's actor metrics renamed); shares of the mini-batch.
    """
    raw = get_kl_estimator(settings.loss_mode)(logprob, teacher_logprob)
    # k1 = s - q can be negative, hence the symmetric clamp (verl's)
    d = raw if settings.loss_max_clamp is None else raw.clamp(min=-settings.loss_max_clamp,
                                                               max=settings.loss_max_clamp)
    metrics = {"distillation/abs_loss": masked_share(raw.abs(), response_mask, scale)}
    if settings.use_policy_gradient:
        loss, pg = ppo_clip_policy_loss(logprob, old_logprob, -d.detach(), response_mask,
                                        clip_ratio_low=settings.clip_ratio_low,
                                        clip_ratio_high=settings.clip_ratio_high, clip_ratio_c=DUAL_CLIP,
                                        loss_agg_mode=loss_agg_mode, scale=scale,
                                        rollout_is_weights=rollout_is_weights)
        metrics.update({f"distillation/{k.removeprefix('actor/')}": v for k, v in pg.items()})
    else:
        loss = agg_loss(d, response_mask, loss_agg_mode, scale)
    metrics["distillation/loss"] = float(loss.item())
    return loss, metrics


def reverse_kl_metrics(student_logprob: Tensor, teacher_logprob: Tensor, response_mask: Tensor,
                       sources: list[str]) -> dict[str, float]:
    """The per-token reverse KL(student || teacher) of a step's samples, by k1
    (unbiased: the tokens are the student's): the token mean over the batch
    (``distillation/reverse_kl``) and per data source (``.../<source>``).
    student/teacher/mask [N, T]; `sources` [N]."""
    mask = response_mask.float()
    k1 = (student_logprob.float() - teacher_logprob.float()) * mask
    metrics = {"distillation/reverse_kl": float(k1.sum() / mask.sum().clamp(min=1))}
    names = sorted(set(sources))
    if len(names) > 1:
        for name in names:
            rows = torch.tensor([s == name for s in sources])
            metrics[f"distillation/reverse_kl/{name}"] = float(k1[rows].sum() / mask[rows].sum().clamp(min=1))
    return metrics
