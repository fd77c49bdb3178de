"""A simulated user that asks again: the built-in ``retry_user`` environment.

After each turn the user checks the answer with the row's own built-in
scorer (the one its data_source picks: reasoning_gym, gsm8k, math, ...; a
row whose data source has none is refused at start, since a custom reward
file is not the user's to call). A right answer ends the conversation; a wrong one gets the
reply "That is not right. Try again." until ``tries`` answers were given.
The run's reward function then scores the whole response, whose last
answer is the one that counts (reasoning-gym reads the last ``<answer>``,
GSM8K's grader the last ``#### n``), so the score is success within
``tries`` answers; each step's reward is that answer's score, which the
reward function also gets as ``extra_info["turn_scores"]`` (verl's name).

    env:
      by_data_source: {"reasoning_gym/*": retry_user}      # 3 answers at most

Another number of answers: the row's ``extra_info.tries``, or an entry of the
interaction file (``class_name: thinkrl.envs.users.RetryUser``, ``config:
{tries: 5, reply: ...}``) under a name of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.envs.base import EnvStep
from thinkrl.errors import UserError
from thinkrl.records import Sample
from thinkrl.rewards.registry import get_scorer, scorer_name_for
from thinkrl.rewards.scoring import is_correct

REPLY = "That is not right. Try again."


@dataclass
class _Asked:
    sample: Sample
    tries_left: int


class RetryUser:
    scores = False  # the reward function scores the whole response (its last answer)

    def __init__(self, config: dict | None = None) -> None:
        config = dict(config or {})
        self.tries = int(config.get("tries", 3))
        self.reply = str(config.get("reply", REPLY))
        if self.tries < 1:
            raise UserError(f"retry_user: tries={self.tries}: give a number of answers >= 1")

    def check(self, sample: Sample) -> None:
        """The user judges answers with the row's built-in scorer: a data source
        without one is refused at start (a custom reward file does not reach it)."""
        scorer_name_for(sample.data_source)

    def reset(self, sample: Sample) -> _Asked:
        tries = int((sample.extra_info or {}).get("tries", self.tries))
        return _Asked(sample, tries)

    def step(self, state: _Asked, reply: str) -> EnvStep:
        sample = state.sample
        result = get_scorer(sample.data_source)(reply, sample.ground_truth, sample.extra_info)
        score, parts = (result["score"], result) if isinstance(result, dict) else (float(result), None)
        state.tries_left -= 1
        if is_correct(float(score), parts) or state.tries_left <= 0:
            return EnvStep(reward=float(score), done=True, metrics={"solved": float(is_correct(float(score), parts))})
        return EnvStep(messages=({"role": "user", "content": self.reply},), reward=float(score))

    def close(self, state: _Asked) -> None:
        pass
