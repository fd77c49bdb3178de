"""What the driver may ask of each role, whatever the backend: the
protocols the handles of `thinkrl.workers.handles` implement (over one
in-process rank or a Ray worker group) and the run, the stages and the
checkpoint code are typed with. CPU tensors and plain values only.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch import Tensor

from thinkrl.records import CriticBatch, ModelInputs, PromptBatch, Rollouts, TrainBatch
from thinkrl.rollout.base import SamplingParams


class TrainedRole(Protocol):
    """A role with weights that train: checkpointed with its optimizer,
    LR schedule and shuffle generator."""

    def save(self, folder: Path) -> None: ...
    def load(self, folder: Path) -> None: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


class PolicyRole(TrainedRole, Protocol):
    def compute_log_prob(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *,
                         response_length: int, model_inputs: ModelInputs | None = None,
                         routed_experts: Tensor | None = None) -> Tensor:
        """log pi_theta of the response tokens [N, R] (sequences [N, P + R]);
        router replay: replaying `routed_experts` [N, P + R, L, k] (R3)."""

    def recorded_routes(self, attention_mask: Tensor) -> Tensor:
        """Router replay R2: the routes the last compute_log_prob took, [N, P + R, L, k]."""

    def routing_agreement(self) -> dict[str, float]:
        """Router replay R3: routing/agreement metrics of the passes since the last call."""

    def update_policy(self, batch: TrainBatch) -> dict[str, float]:
        """PPO epochs over the step's responses; actor/* metrics."""

    def weight_stats(self) -> dict:
        """Non-finite parameter names, the squared L2 norm, the vocabulary size."""

    def full_weights(self) -> dict[str, Tensor]:
        """The whole model's float32 weights (for export)."""

    def device_rng_states(self) -> list: ...
    def load_device_rng_states(self, states: list) -> None: ...


class ReferenceRole(Protocol):
    def compute_ref_log_prob(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *,
                             response_length: int, model_inputs: ModelInputs | None = None) -> Tensor:
        """log pi_ref of the response tokens [N, R]."""


class TeacherRole(Protocol):
    def compute_teacher_log_prob(self, name: str, input_ids: Tensor, attention_mask: Tensor,
                                 position_ids: Tensor, *, response_length: int,
                                 model_inputs: ModelInputs | None = None) -> Tensor:
        """log pi_teacher of the response tokens [N, R] under the teacher `name`."""


class ValueRole(TrainedRole, Protocol):
    def compute_values(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, *,
                       response_length: int) -> Tensor:
        """V_t of every response token [N, R]."""

    def update_critic(self, batch: CriticBatch) -> dict[str, float]:
        """The value regression; critic/* metrics."""


class RolloutRole(Protocol):
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts: ...

    version: int
    """The policy version the engines serve (the step whose update made it)."""

    def sync_weights(self, version: int) -> dict[str, float]:
        """The policy's current weights, of policy `version`, into the engines
        (a no-op where the engine samples from the policy's own module), attested;
        timing metrics."""

    def generator_state(self) -> list[Tensor]: ...
    def set_generator_state(self, state: list[Tensor] | Tensor) -> None: ...
