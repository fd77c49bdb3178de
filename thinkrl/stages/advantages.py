"""From scores to the advantages the update uses: the KL penalty in the
reward, the bound estimator, and the engine's drift (measured, and with
rollout_is corrected).

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

from typing import Callable

from torch import Tensor

from thinkrl.algos.gae import AdvantageResult
from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.kl_control import KLController
from thinkrl.algos.rollout_correction import (RolloutCorrection, logprob_gap_metrics,
                                              rollout_is_weights)
from thinkrl.records import Rollouts
from thinkrl.rewards.scoring import token_level_rewards


def shaped_rewards(rollouts: Rollouts, *, scores: Tensor, old_logprobs: Tensor | None,
                   ref_logprobs: Tensor | None, kl_controller: KLController | None,
                   kl_penalty: str) -> tuple[Tensor, dict[str, float]]:
    """Scores on the last token [N, R]; with a KL controller (algorithm.use_kl_in_reward),
    minus beta * KL(pi_old || pi_ref) on every response token, KL by the
    `kl_penalty` estimator, and the controller updated."""
    rewards = token_level_rewards(scores, rollouts.response_mask)
    if kl_controller is None:
        return rewards, {}
    mask = rollouts.response_mask.float()
    kl = get_kl_estimator(kl_penalty)(old_logprobs, ref_logprobs) * mask
    beta = kl_controller.value
    mean_kl = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).mean().item()
    kl_controller.update(mean_kl, n_sequences=len(rollouts))
    return rewards - beta * kl, {"actor/reward_kl_penalty": mean_kl,
                                 "actor/reward_kl_penalty_coeff": beta}


def compute_advantages(advantage_fn: Callable, rollouts: Rollouts, rewards: Tensor, *,
                       values: Tensor | None = None,
                       reward_baselines: Tensor | None = None) -> AdvantageResult:
    """`advantage_fn` (its settings bound at build) with the step's own inputs:
    ReMax's greedy baselines, GAE's critic values (and its returns come back)."""
    step_inputs = {name: value for name, value in (("reward_baselines", reward_baselines),
                                                   ("values", values)) if value is not None}
    return advantage_fn(rewards, rollouts.response_mask.float(), rollouts.group_ids, **step_inputs)


def rollout_drift(rollouts: Rollouts, old_logprobs: Tensor | None, *,
                  correction: RolloutCorrection | None) -> tuple[Tensor | None, dict[str, float]]:
    """The engine's log-probs against the trainer's (logged whenever both
    exist); with a `correction` (algorithm.rollout_is), the truncated
    importance weights pi_trainer / pi_rollout [N, R], which each policy loss
    applies to its per-token loss (verl's semantics; see algos/policy_losses)."""
    if old_logprobs is None:
        return None, {}
    mask = rollouts.response_mask.float()
    metrics = logprob_gap_metrics(rollouts.rollout_logprobs, old_logprobs, mask)
    if correction is None:
        return None, metrics
    weights, is_metrics = rollout_is_weights(old_logprobs, rollouts.rollout_logprobs, mask,
                                             threshold=correction.threshold,
                                             level=correction.level, mode=correction.mode)
    return weights, {**metrics, **is_metrics}
