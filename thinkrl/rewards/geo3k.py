"""Geometry3K (verl's geo3k example): a reasoning format and a boxed answer.

verl's geo3k reward: accuracy (the last `\\boxed{...}` equals the ground
truth) weighted 0.9, format weighted 0.1, where the format is the one verl's
instruction asks for: the reasoning inside `<think> </think>`, then the
final answer in `\\boxed{}`. Answers are compared with math-verify (as
thinkrl's math scorer does), so `2\\sqrt{3}` matches `2 \\sqrt 3` and
`\\frac{7}{2}` matches `3.5`.

    score = (1 - format_weight) * accuracy + format_weight * format
"""

from __future__ import annotations

import re

from thinkrl.rewards.math import is_equivalent, last_boxed, readable

FORMAT_WEIGHT = 0.1
"""verl's weight of the format part (accuracy gets the rest)."""
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def follows_format(response: str) -> bool:
    """`<think>...</think>` then a `\\boxed{...}` answer, nothing before <think> but space."""
    return _FORMAT.fullmatch(response.strip()) is not None


def compute_score(response: str, ground_truth: str, *,
                  format_weight: float = FORMAT_WEIGHT) -> dict[str, float]:
    """{"score", "format", "accuracy"}: accuracy and format are 0 or 1."""
    answer = last_boxed(response)
    accuracy = float(readable(answer) and is_equivalent(answer, ground_truth))
    form = float(follows_format(response))
    return {"score": (1.0 - format_weight) * accuracy + format_weight * form,
            "format": form, "accuracy": accuracy}
