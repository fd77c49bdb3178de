"""Exact-answer scoring (`reward.scorer=exact`): the response, stripped of
surrounding whitespace, must equal the ground truth, stripped the same way.

For tasks whose answer is the whole response (a label, a word, a number the
model is asked to write alone), as in TRL's simplest GRPO examples: no
extraction, no normalisation beyond the outer whitespace, case-sensitive.
"""

from __future__ import annotations


def compute_score(response: str, ground_truth: str, *, score: float = 1.0) -> float:
    """`score` when `response.strip() == str(ground_truth).strip()`, else 0."""
    return score if response.strip() == str(ground_truth).strip() else 0.0
