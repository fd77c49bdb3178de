"""The coefficient beta of a KL penalty in the reward (algorithm.kl_ctrl).

`fixed` keeps beta; `adaptive` is the proportional controller of Ziegler et
al. (2019): after each step with measured KL `kl` over `n` sequences,

    error = clip(kl / target_kl - 1, -0.2, 0.2)
    beta <- beta * (1 + error * n / horizon)

so beta grows while the policy drifts faster than the target and shrinks
while it stays closer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KLController:
    value: float
    """The current beta."""
    adaptive: bool = False
    target_kl: float = 0.1
    horizon: int = 10000

    def update(self, current_kl: float, n_sequences: int) -> None:
        if not self.adaptive:
            return
        error = max(-0.2, min(0.2, current_kl / self.target_kl - 1.0))
        self.value *= 1.0 + error * n_sequences / self.horizon

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])
