"""PPO with a critic: generalised advantage estimation and the clipped value loss.

Shape legend: N responses, T response tokens. Token t of a response is the
action; V_t is the critic's value of the state before it (the hidden state
at the position that predicts token t), r_t the reward of emitting it.

GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", arXiv:1506.02438), as verl's
``compute_gae_advantage_return``:

    delta_t = r_t + gamma * V_{t+1} - V_t          (V_{t+1} = 0 past the last token)
    A_t     = delta_t + gamma * lam * A_{t+1}
    R_t     = A_t + V_t                            (the critic's regression target)

then A is whitened over every response token of the batch. Padding tokens
(mask 0) are skipped: they pass the next real token's V and A through
unchanged, so a masked gap inside a response (tool output, say) is not an
action of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.algos.losses import LossScale, agg_loss, masked_share
from thinkrl.algos.whiten import masked_whiten

__all__ = ["AdvantageResult", "explained_variance", "gae_advantage", "gae_advantages_and_returns",
           "value_loss"]


@dataclass(frozen=True, slots=True)
class AdvantageResult:
    """What an advantage estimator gives the step: the advantages [N, T] and,
    for an estimator with a critic (GAE), the returns [N, T] the critic
    regresses on (computed in the same pass); None otherwise."""

    advantages: Tensor
    returns: Tensor | None = None


@torch.no_grad()
def gae_advantages_and_returns(token_level_rewards: Tensor, values: Tensor, response_mask: Tensor,
                               *, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE advantages (whitened) and returns, as the module docstring writes them.

    Args:
        token_level_rewards: [N, T] r_t (the outcome score on the last token, minus a
            KL penalty per token when ``algorithm.use_kl_in_reward``).
        values: [N, T] V_t from the critic at rollout time.
        response_mask: [N, T] 1 on response tokens, 0 on padding.
        gamma: discount per token; lam: GAE's lambda (1: Monte-Carlo, 0: one-step TD).

    Returns:
        (advantages [N, T] whitened over the masked tokens and zero on padding,
         returns [N, T] = unwhitened A + V; padding entries carry no meaning).
    """
    rewards, values, mask = token_level_rewards.float(), values.float(), response_mask.float()
    next_value = torch.zeros(rewards.shape[0], device=rewards.device)  # V_{t+1}
    next_adv = torch.zeros_like(next_value)  # A_{t+1}
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = mask[:, t]
        # A padding token keeps the values of the token after it (verl's skip).
        next_value = values[:, t] * m + (1 - m) * next_value
        next_adv = adv * m + (1 - m) * next_adv
        advantages[:, t] = next_adv
    returns = advantages + values
    return masked_whiten(advantages, mask) * mask, returns


def gae_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor, *,
                  values: Tensor, gamma: float, lam: float) -> AdvantageResult:
    """The advantage-estimator face of GAE (``algorithm.adv_estimator=gae``):
    `gae_advantages_and_returns` in one pass, the returns kept for the
    critic's regression. ``group_ids`` is unused (the critic is the baseline);
    ``values`` [N, T] is step data."""
    advantages, returns = gae_advantages_and_returns(token_level_rewards, values, response_mask,
                                                     gamma=gamma, lam=lam)
    return AdvantageResult(advantages, returns)


def value_loss(vpreds: Tensor, returns: Tensor, values: Tensor, response_mask: Tensor, *,
               cliprange_value: float, loss_agg_mode: str, scale: LossScale
               ) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss (verl's ``compute_value_loss``).

        v_clip = clamp(v, V_old - c, V_old + c)
        l      = max((v - R)^2, (v_clip - R)^2)
        loss   = 0.5 * agg_loss(l, mask, loss_agg_mode, scale)

    The max keeps the larger error, so a prediction gains nothing by moving
    more than c from the value it had at rollout.

    Args:
        vpreds: [n, T] v, the critic's predictions now (with grad).
        returns: [n, T] R, the GAE returns.
        values: [n, T] V_old, the predictions at rollout time.
        response_mask: [n, T] 1 on response tokens.
        cliprange_value: c.
        loss_agg_mode, scale: see ``thinkrl.algos.losses.agg_loss``; ``scale`` measures
            the whole mini-batch, so micro-batch losses and metrics are shares of it.

    Returns:
        (loss, metrics): ``critic/vf_loss``, ``critic/vf_clipfrac`` (tokens where the
        clipped error is the larger) and ``critic/vpred_mean``, each this micro-batch's
        share of the mini-batch value (sum them over micro-batches).
    """
    clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (clipped - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask,
                          loss_agg_mode, scale)
    with torch.no_grad():
        metrics = {"critic/vf_loss": float(loss.item()),
                   "critic/vf_clipfrac": masked_share((loss_clipped > loss_unclipped).float(),
                                                      response_mask, scale),
                   "critic/vpred_mean": masked_share(vpreds, response_mask, scale)}
    return loss, metrics


@torch.no_grad()
def explained_variance(returns: Tensor, values: Tensor, response_mask: Tensor) -> float:
    """How much of the returns' variance the values explain (verl's ``critic/vf_explained_var``).

        ev = 1 - Var(R - V) / (Var(R) + 1e-5)    over the masked tokens, unbiased variances

    1 is a perfect critic, 0 one no better than a constant, negative a harmful one.
    Shapes: [N, T] each.
    """
    keep = response_mask.bool()
    r, v = returns[keep].float(), values[keep].float()
    return float(1.0 - torch.var(r - v) / (torch.var(r) + 1e-5))
