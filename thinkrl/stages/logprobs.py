"""The no-grad log-prob passes of a step: the old policy's and the
reference's, over prompt + response.

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

from torch import Tensor

from thinkrl.records import Rollouts, Sequences
from thinkrl.workers.roles import PolicyRole, ReferenceRole


def old_policy_logprobs(actor: PolicyRole, rollouts: Rollouts, sequences: Sequences, *,
                        recompute: bool, from_rollout: bool = False) -> Tensor | None:
    """log pi_old [N, R] by a forward pass of the actor; the engine's log-probs
    of the sampled tokens when `from_rollout` (actor.use_rollout_log_probs);
    or None when the step needs none (`StepSettings.recompute_old_logprobs`:
    an exactly on-policy update takes pi_old from its own forward)."""
    if from_rollout:
        return rollouts.rollout_logprobs
    if not recompute:
        return None
    routes = {} if rollouts.routed_experts is None else {"routed_experts": rollouts.routed_experts}
    return actor.compute_log_prob(*sequences, response_length=rollouts.response_ids.shape[1],
                                  **image_inputs(rollouts), **routes)


def update_routes(actor: PolicyRole, rollouts: Rollouts, sequences: Sequences, *,
                  mode: str) -> tuple[Tensor | None, dict[str, float]]:
    """The routes the update replays [N, P + R, L, k] and the routing metrics
    (router replay, `thinkrl.models.routing`): R3 the rollout's, with how often
    the old-log-prob pass's own routing agreed; R2 those the old-log-prob pass
    took; none when disabled."""
    if mode == "R3":
        return rollouts.routed_experts, actor.routing_agreement()
    if mode == "R2":
        return actor.recorded_routes(sequences[1]), {}
    return None, {}


def reference_logprobs(reference: ReferenceRole | None, rollouts: Rollouts,
                       sequences: Sequences) -> Tensor | None:
    """log pi_ref [N, R]; None for a run without a reference (no KL term)."""
    if reference is None:
        return None
    return reference.compute_ref_log_prob(*sequences, response_length=rollouts.response_ids.shape[1],
                                          **image_inputs(rollouts))


def image_inputs(rollouts: Rollouts) -> dict:
    """The log-prob passes' `model_inputs` keyword: the prompts' images (VL models)."""
    return {} if rollouts.model_inputs is None else {"model_inputs": rollouts.model_inputs}
