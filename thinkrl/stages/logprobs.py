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
    return actor.compute_log_prob(*sequences, response_length=rollouts.response_ids.shape[1],
                                  **image_inputs(rollouts))


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
