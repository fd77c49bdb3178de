"""The step's update: the batch the actor trains on, then the policy update
and the weight sync to the engine.

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

from torch import Tensor

from thinkrl.metrics import StageTimer
from thinkrl.records import Rollouts, Sequences, TrainBatch
from thinkrl.workers.roles import PolicyRole, RolloutRole


def train_batch(rollouts: Rollouts, sequences: Sequences, *, advantages: Tensor,
                old_logprobs: Tensor | None, ref_logprobs: Tensor | None,
                off_policy: bool, kl_loss: bool, rollout_is_weights: Tensor | None = None,
                teacher_logprobs: Tensor | None = None, routed_experts: Tensor | None = None) -> TrainBatch:
    """What the update reads: the old log-probs only when the update is off-policy
    (on-policy, pi_old is the update's own first forward), the reference's only
    for the KL loss (actor.use_kl_loss), rollout_is's weights when it is on,
    the teachers' log-probs when distilling, the routes to replay (router replay)."""
    input_ids, attention_mask, position_ids = sequences
    return TrainBatch(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, response_mask=rollouts.response_mask.float(),
                      advantages=advantages,
                      old_logprobs=old_logprobs if off_policy else None,
                      ref_logprobs=ref_logprobs if kl_loss else None,
                      model_inputs=rollouts.model_inputs, rollout_is_weights=rollout_is_weights,
                      teacher_logprobs=teacher_logprobs, routed_experts=routed_experts)


def update_actor(actor: PolicyRole, engine: RolloutRole, batch: TrainBatch, *, updates: bool,
                 step: int, timer: StageTimer) -> dict[str, float]:
    """The policy update, then the weight sync to the engine (the weights of
    policy version `step`, attested); neither when the actor does not update
    this step (`updates` False: the critic's warmup)."""
    if not updates:
        return {}
    with timer("update_actor"):
        metrics = actor.update_policy(batch)
    with timer("update_weights"):
        sync_metrics = engine.sync_weights(version=step)
    return {**metrics, **sync_metrics}
