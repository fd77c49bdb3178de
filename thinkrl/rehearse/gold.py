"""The run's reward on the data's own answers: a reward that does not score a
row's gold answer above a wrong one cannot teach anything, and a run with
it trains for days on noise. Rule rewards want the answer in a format
(`#### 72`, `\\boxed{72}`, `<answer>` tags), so the gold answer is written
in each common format and its best score counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.records import Sample

WRONG_ANSWER = "I do not know."
MARKERS = ("<think>", "<answer>", "####", "\\boxed")
"""Format marks a rule reward may require of an answer, which the prompt must then ask for."""


def gold_responses(sample: Sample) -> list[str]:
    """The gold answer of `sample` in the formats rule rewards read."""
    answer = sample.ground_truth
    written = [answer, f"#### {answer}", f"The answer is \\boxed{{{answer}}}.",
               f"<think>\nThe answer is {answer}.\n</think>\n<answer>\\boxed{{{answer}}}</answer>",
               f"<think>\nThe answer is {answer}.\n</think>\n<answer>{answer}</answer>"]
    solution = sample.extra_info.get("answer") if isinstance(sample.extra_info, dict) else None
    if isinstance(solution, str) and solution.strip() and solution not in written:
        written.append(solution)  # e.g. GSM8K's worked solution ending "#### 72"
    return written


@dataclass(frozen=True)
class GoldScores:
    rows: list[str]
    """Where each row came from ("<file>, row N")."""
    best: list[float]
    """Per row: the best score over the gold answer's formats."""
    wrong: list[float]
    """Per row: the score of a wrong answer."""
    answers: int
    """Answers scored (every format of every row, and a wrong one per row)."""
    errors: int
    timeouts: int
    first_error: str | None
    unasked: list[tuple[str, ...]] = ()
    """Per row: the marks every rewarded gold format has and the prompt never
    mentions (a model not told the format cannot find it: a wrong template)."""

    @property
    def unrewarded(self) -> list[int]:
        """Rows whose gold answer scores no more than a wrong one."""
        return [i for i, (b, w) in enumerate(zip(self.best, self.wrong)) if b <= w]


def score_gold(reward, samples: list[Sample], rows: list[str]) -> GoldScores:
    """Score every sample's gold answers and a wrong answer with `reward` (a
    `RewardScorer`: its workers and deadline, as in training)."""
    texts, owners = [], []
    for i, sample in enumerate(samples):
        for text in [*gold_responses(sample), WRONG_ANSWER]:
            texts.append(text)
            owners.append(i)
    result = reward.score(texts, [samples[i] for i in owners])
    best = [float("-inf")] * len(samples)
    wrong = [0.0] * len(samples)
    scored = list(zip(texts, owners, result.scores.tolist()))
    for text, owner, score in scored:
        if text == WRONG_ANSWER:
            wrong[owner] = score
        else:
            best[owner] = max(best[owner], score)
    unasked = []
    for i, sample in enumerate(samples):
        winners = [text for text, owner, score in scored
                   if owner == i and text != WRONG_ANSWER and score == best[i] > wrong[i]]
        needed = [m for m in MARKERS if winners and all(m in text for text in winners)]
        unasked.append(tuple(m for m in needed if m not in sample.prompt_text))
    return GoldScores(rows=rows, best=best, wrong=wrong, answers=len(texts), errors=result.errors,
                      timeouts=result.timeouts, first_error=reward.first_error, unasked=unasked)
