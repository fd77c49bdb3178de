"""Watching the rewards: a warning when they stay at zero, and a circuit
breaker that stops a run whose reward function keeps failing.

GRPO learns nothing from a batch whose rewards are all equal, and all-zero
for several steps almost always means the scorer never sees an answer it can
read, not a hard task; unless the scorer itself failed, which the warning
then says first. A scorer that raises or hangs on most responses scores them
0 and the run would go on learning from noise (a hang costs reward.timeout_s
per response): the breaker stops it, naming the first error.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path

from torch import Tensor

from thinkrl.checkpoint.store import kept_on_disk
from thinkrl.errors import RunStopped, UserError
from thinkrl.rewards.scorer import ScoreResult

log = logging.getLogger(__name__)


class ZeroRewardWatch:
    """Call `update(scores)` once per step; it warns (once per streak) when
    every reward of `warn_steps` consecutive steps was 0."""

    def __init__(self, warn_steps: int) -> None:
        if warn_steps < 0:
            raise UserError(f"reward.zero_reward_warn_steps={warn_steps}: use a step count >= 0 "
                             "(0 never warns)")
        self.warn_steps = warn_steps
        self.streak = 0
        """Consecutive steps, up to now, whose rewards were all 0."""

    def update(self, scores: Tensor, *, failures: int = 0) -> bool:
        """Record one step's scores [N] and how many of them failed to score
        (reward/errors + reward/timeouts); True when this step triggered the warning."""
        all_zero = bool((scores == 0).all()) and scores.numel() > 0
        self.streak = self.streak + 1 if all_zero else 0
        if self.warn_steps == 0 or self.streak != self.warn_steps:
            return False
        if failures:
            log.warning(
                "every reward was 0 for %d steps in a row, and the reward function FAILED on %d of "
                "the %d responses of the last step (reward/errors + reward/timeouts): fix the "
                "reward function first (its first error is logged above, and "
                "reward.max_failure_rate stops the run when most responses fail)",
                self.streak, failures, scores.numel())
            return True
        log.warning(
            "every reward was 0 for %d steps in a row (%d responses in the last step): the policy "
            "gets no learning signal. Likely causes: the prompt template does not ask for the "
            "answer format the scorer reads (gsm8k: '#### N'; math: \\boxed{...}; r1: "
            "<think>...</think><answer>...</answer>; see data.template); the data_source column "
            "routes rows to the wrong scorer (or set reward.scorer); the ground_truth column is in "
            "a different format than the answers; or max_response_length cuts responses before "
            "the answer. Read a few decoded responses to see what the model writes.", self.streak, scores.numel())
        return True


class FailureBreaker:
    """Call `update(...)` once per step, after scoring and before the
    update: it raises RunStopped when more than `max_failure_rate` of the
    responses of the last `window_steps` steps (fewer at the start) failed
    to score. Judged from the first step on, so a scorer that fails on
    everything costs one step, not the run."""

    def __init__(self, max_failure_rate: float, window_steps: int) -> None:
        if not 0 < max_failure_rate <= 1:
            raise UserError(f"reward.max_failure_rate={max_failure_rate}: use a share in (0, 1], "
                             "e.g. 0.5 (1.0 never stops)")
        if window_steps < 1:
            raise UserError(f"reward.failure_window_steps={window_steps}: use a step count >= 1")
        self.max_failure_rate = max_failure_rate
        self.window: deque[tuple[int, int, int, int]] = deque(maxlen=window_steps)
        """(errors, timeouts, unscored, responses) of the last steps."""

    @classmethod
    def from_config(cls, reward) -> "FailureBreaker":
        return cls(reward.max_failure_rate, reward.failure_window_steps)

    def certain(self, failures: int, *, responses: int) -> bool:
        """Whether this step's `update` will stop the run once `failures` of
        its `responses` failed, however the others score: scoring can stop
        there (a scorer that hangs on every response would otherwise cost
        the whole step at reward.timeout_s each)."""
        kept = list(self.window)[-(self.window.maxlen - 1):] if self.window.maxlen > 1 else []
        failed = failures + sum(e + t + u for e, t, u, _ in kept)
        total = responses + sum(n for *_, n in kept)
        return total > 0 and failed / total > self.max_failure_rate

    def check(self, scored: ScoreResult, *, step: int, first_error: str | None,
              run_dir: Path) -> None:
        """`update` with a step's scoring result."""
        self.update(errors=scored.errors, timeouts=scored.timeouts, unscored=scored.unscored,
                    responses=len(scored.scores), step=step, first_error=first_error,
                    run_dir=run_dir)

    def update(self, *, errors: int, timeouts: int, responses: int, step: int,
               first_error: str | None, run_dir: Path, unscored: int = 0) -> None:
        """`unscored`: responses left unscored once `certain` said the run was
        lost; they count as failed."""
        self.window.append((errors, timeouts, unscored, responses))
        failed = sum(e + t + u for e, t, u, _ in self.window)
        total = sum(n for *_, n in self.window)
        if total == 0 or failed / total <= self.max_failure_rate:
            return

        span = f"the last {len(self.window)} steps" if len(self.window) > 1 else "this step"
        left = sum(u for _, _, u, _ in self.window)
        left = f", {left} left unscored once the limit was certain to be passed" if left else ""
        raise RunStopped(
            f"step {step}: the reward function failed on {failed} of {total} responses "
            f"({100 * failed / total:.0f} %) over {span} "
            f"(reward/errors {sum(e for e, *_ in self.window)}, reward/timeouts "
            f"{sum(t for _, t, *_ in self.window)}{left}), more than reward.max_failure_rate="
            f"{self.max_failure_rate:g}. First error: {first_error or 'not recorded'}. The run "
            f"stopped before this step's update. {kept_on_disk(run_dir)} Fix the reward function "
            "(or raise reward.timeout_s, or reward.max_failure_rate to go on regardless).")
