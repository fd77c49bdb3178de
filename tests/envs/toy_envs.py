"""Small environments for the environment tests (importable by worker processes).

`Guess`: the row's ground truth is a secret number; each turn the policy
names a number, the game answers "higher" / "lower" as a user message, and
a right guess ends the game with reward 1. The others misbehave on purpose
at the step named by their config (``at``: "reset" or "step").
"""

from __future__ import annotations

import os
import re
import time

from thinkrl.envs.base import EnvStep


class Guess:
    scores = True

    def __init__(self, config: dict | None = None) -> None:
        self.config = dict(config or {})
        self.closed = 0

    def reset(self, sample):
        return {"secret": int(sample.ground_truth), "guesses": 0}

    def step(self, state, reply: str) -> EnvStep:
        numbers = re.findall(r"-?\d+", reply)
        state["guesses"] += 1
        if not numbers:
            return EnvStep(messages=({"role": "user", "content": "say a number"},),
                           metrics={"invalid": 1.0})
        guess = int(numbers[-1])
        if guess == state["secret"]:
            return EnvStep(messages=({"role": "user", "content": "right"},) if self.config.get("say_right") else (),
                           reward=1.0, done=True)
        hint = "higher" if guess < state["secret"] else "lower"
        return EnvStep(messages=({"role": "user", "content": hint},))

    def close(self, state) -> None:
        self.closed += 1


class Misbehaving(Guess):
    """Does `how` (raise, hang, garbage, exit) at `at` (reset or step)."""

    def _misbehave(self, where: str):
        if self.config.get("at", "step") != where:
            return None
        how = self.config["how"]
        if how == "raise":
            raise RuntimeError("the environment broke")
        if how == "hang":
            time.sleep(float(self.config.get("seconds", 30)))
        if how == "exit":
            os._exit(3)
        if how == "garbage":
            return {"not": "a step"}
        return None

    def reset(self, sample):
        self._misbehave("reset")
        return super().reset(sample)

    def step(self, state, reply: str):
        bad = self._misbehave("step")
        return bad if bad is not None else super().step(state, reply)
