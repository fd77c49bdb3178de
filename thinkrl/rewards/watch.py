"""A warning when rewards stay at zero: GRPO learns nothing from a batch
whose rewards are all equal, and all-zero for several steps almost always
means the scorer never sees an answer it can read, not a hard task."""

from __future__ import annotations

import logging

from torch import Tensor

log = logging.getLogger(__name__)


class ZeroRewardWatch:
    """Call `update(scores)` once per step; it warns (once per streak) when
    every reward of `warn_steps` consecutive steps was 0."""

    def __init__(self, warn_steps: int) -> None:
        if warn_steps < 0:
            raise ValueError(f"reward.zero_reward_warn_steps={warn_steps}: use a step count >= 0 "
                             "(0 never warns)")
        self.warn_steps = warn_steps
        self.streak = 0
        """Consecutive steps, up to now, whose rewards were all 0."""

    def update(self, scores: Tensor) -> bool:
        """Record one step's scores [N]; True when this step triggered the warning."""
        all_zero = bool((scores == 0).all()) and scores.numel() > 0
        self.streak = self.streak + 1 if all_zero else 0
        if self.warn_steps == 0 or self.streak != self.warn_steps:
            return False
        log.warning(
            "every reward was 0 for %d steps in a row (%d responses in the last step): the policy "
            "gets no learning signal. Likely causes: the prompt template does not ask for the "
            "answer format the scorer reads (gsm8k: '#### N'; math: \\boxed{...}; r1: "
            "<think>...</think><answer>...</answer>; see data.template); the data_source column "
            "routes rows to the wrong scorer (or set reward.scorer); the ground_truth column is in "
            "a different format than the answers; or max_response_length cuts responses before "
            "the answer. Read a few decoded responses to see what the model writes.", self.streak, scores.numel())
        return True
