"""The seam between the trainer and whatever generates responses.

`native` (thinkrl.rollout.native) implements it in plain PyTorch on any
device; a vLLM engine implements the same protocol on GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

from torch import Tensor

from thinkrl.records import PromptBatch, Rollouts


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1
    """Responses per prompt (rollout.n)."""
    max_tokens: int = 512
    """Response length limit (data.max_response_length)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 keeps the whole vocabulary."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one; 0 keeps all."""
    do_sample: bool = True
    """False (or temperature 0) decodes greedily."""
    ignore_eos: bool = False
    """Keep generating past EOS up to max_tokens (fixed-length benchmarks)."""

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0.0


class RolloutEngine(Protocol):
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        """Sample `params.n` responses per prompt; tensors come back on the CPU."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, Tensor]]) -> None:
        """Load new policy weights (called after every actor update)."""
        ...

    def generator_state(self) -> object:
        """The sampling generator's state (tensors only), for checkpoints."""
        ...

    def set_generator_state(self, state: object) -> None:
        ...
