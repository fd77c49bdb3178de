"""DeepSeek-R1-Zero's rule-based reward: a format part and an accuracy part.

    score = format_weight * format + accuracy_weight * accuracy

- format = 1 when the whole response is exactly one `<think>...</think>`
  followed by exactly one `<answer>...</answer>`, with only whitespace
  around and between them; else 0.
- accuracy = 1 when the answer is right: the content of the last
  `<answer>...</answer>` (a `\\boxed{}` inside it if there is one, else the
  bare content) checked against the ground truth with math-verify
  (`thinkrl.rewards.math`); else 0. Accuracy does not require the format,
  so the two parts are separate signals, as in the R1 paper.

With the defaults (0.5, 1.0) a response scores 0, 0.5, 1.0 or 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.config.schema import RewardConfig
import thinkrl.rewards.math as math_answer

_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


@dataclass(frozen=True, slots=True)
class R1Score:
    format: float
    """1 when the response is `<think>...</think><answer>...</answer>`, else 0."""
    accuracy: float
    """1 when the answer matches the ground truth, else 0."""
    score: float
    """format_weight * format + accuracy_weight * accuracy."""


def has_r1_format(response: str) -> bool:
    """One `<think>` block, then one `<answer>` block, nothing else but whitespace."""
    if any(response.count(tag) != 1 for tag in _TAGS):
        return False
    think, end_think, answer, end_answer = (response.index(tag) for tag in _TAGS)
    if not think < end_think < answer < end_answer:
        return False
    return (not response[:think].strip()
            and not response[end_think + len("</think>"):answer].strip()
            and not response[end_answer + len("</answer>"):].strip())


def answer_of(response: str) -> str | None:
    """The answer inside the last `<answer>` tag: its last box, else the whole content."""
    content = math_answer.last_answer_tag(response)
    if content is None:
        return None
    boxed = math_answer.last_boxed(content)
    return boxed if boxed is not None else content


def score_parts(response: str, ground_truth: str, *, format_weight: float = 0.5,
                accuracy_weight: float = 1.0) -> R1Score:
    form = 1.0 if has_r1_format(response) else 0.0
    answer = answer_of(response)
    right = answer is not None and math_answer.is_equivalent(answer, ground_truth)
    accuracy = 1.0 if right else 0.0
    return R1Score(format=form, accuracy=accuracy,
                   score=format_weight * form + accuracy_weight * accuracy)


def compute_score(response: str, ground_truth: str, *,
                  format_weight: float = RewardConfig.r1_format_weight,
                  accuracy_weight: float = RewardConfig.r1_accuracy_weight) -> dict[str, float]:
    """`{"score", "format", "accuracy"}`: the total and its two parts."""
    parts = score_parts(response, ground_truth, format_weight=format_weight,
                        accuracy_weight=accuracy_weight)
    return {"score": parts.score, "format": parts.format, "accuracy": parts.accuracy}
