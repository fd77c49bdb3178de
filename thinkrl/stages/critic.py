"""The stages PPO with a critic adds to the driver (algorithm.adv_estimator=gae).

As verl's `RayPPOTrainer.fit`: after the reference pass the critic values
every response token; GAE turns rewards and values into advantages and
returns in one pass (the registered `gae` estimator, called by the trainer
like any other); the critic regresses on the returns; the actor updates only from
step `trainer.critic_warmup` on (verl's `critic_warmup <= global_steps`,
steps counted from 1), so a fresh critic can learn before its advantages
steer the policy. Without a critic (None) the two critic stages return
nothing and the actor updates from the first step.

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

from torch import Tensor

from thinkrl.algos.gae import explained_variance
from thinkrl.metrics import StageTimer
from thinkrl.records import CriticBatch, Rollouts, Sequences, TrainBatch
from thinkrl.workers.roles import ValueRole


def critic_values(critic: ValueRole | None, rollouts: Rollouts, sequences: Sequences,
                  timer: StageTimer) -> Tensor | None:
    """V_t [N, R] of every response token under the critic, zero on padding
    (verl's `compute_values`); None without a critic."""
    if critic is None:
        return None
    with timer("values"):
        values = critic.compute_values(*sequences, response_length=rollouts.response_ids.shape[1])
    return values * rollouts.response_mask.float()


def update_critic(critic: ValueRole | None, batch: TrainBatch, *, returns: Tensor | None,
                  values: Tensor | None, timer: StageTimer) -> dict[str, float]:
    """Regress the critic on the GAE `returns` [N, R] (from the advantages' own pass,
    after any KL penalty in the rewards) with the rollout-time `values` [N, R];
    verl's critic metrics. {} without a critic."""
    if critic is None:
        return {}
    mask = batch.response_mask
    with timer("update_critic"):
        metrics = critic.update_critic(CriticBatch(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask,
            position_ids=batch.position_ids, response_mask=mask, values=values, returns=returns))
    return {**metrics, **value_metrics(values, returns, mask)}


def value_metrics(values: Tensor, returns: Tensor, response_mask: Tensor) -> dict[str, float]:
    """critic/values/*, critic/returns/* over the response tokens and critic/vf_explained_var
    (verl's `compute_data_metrics` with a critic). Shapes [N, R] each."""
    keep = response_mask.bool()
    metrics = {}
    for name, tensor in (("values", values), ("returns", returns)):
        kept = tensor[keep].float()
        metrics.update({f"critic/{name}/mean": kept.mean().item(), f"critic/{name}/max": kept.max().item(),
                        f"critic/{name}/min": kept.min().item()})
    metrics["critic/vf_explained_var"] = explained_variance(returns, values, response_mask)
    return metrics


def actor_updates(step: int, *, with_critic: bool, critic_warmup: int) -> bool:
    """Whether the actor learns (and syncs its weights to the engine) at `step`
    (1-based): always without a critic; with one, from step trainer.critic_warmup
    on (verl: `critic_warmup <= global_steps`)."""
    return not with_critic or critic_warmup <= step
