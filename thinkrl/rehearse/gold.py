"""The run's reward on the data's own answers: a reward that does not score a
row's gold answer above a wrong one cannot teach anything, and a run with
it trains for days on noise. Rule rewards want the answer in a format
(`#### 72`, `\\boxed{72}`, `<answer>` tags), so the gold answer is written
in each common format and its best score counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.records import Sample
from thinkrl.rewards.gold_answers import formatted, gold_responses  # noqa: F401  (gold_responses: used by callers)

WRONG_ANSWER = "I do not know."
MARKERS = ("<think>", "<answer>", "####", "\\boxed")
"""Format marks a rule reward may require of an answer, which the prompt must then ask for."""


def wrong_responses(sample: Sample) -> list[str]:
    """A wrong answer, plain and in the same formats: a reward may pay for the
    format alone, so the gold answer must beat a wrong one written alike."""
    try:
        number = float(sample.ground_truth.replace(",", ""))
    except ValueError:
        value = "0"
    else:
        value = str(int(number) + 1) if number.is_integer() else str(number + 1)
    return [WRONG_ANSWER, *formatted(value)]


@dataclass(frozen=True)
class GoldScores:
    rows: list[str]
    """Where each row came from ("<file>, row N")."""
    best: list[float]
    """Per row: the best score over the gold answer's formats."""
    wrong: list[float]
    """Per row: the best score of a wrong answer (over the same formats)."""
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
    texts, owners, is_gold = [], [], []
    for i, sample in enumerate(samples):
        for gold, written in ((True, gold_responses(sample)), (False, wrong_responses(sample))):
            texts += written
            owners += [i] * len(written)
            is_gold += [gold] * len(written)
    result = reward.score(texts, [samples[i] for i in owners])
    best = [float("-inf")] * len(samples)
    wrong = [float("-inf")] * len(samples)
    scored = list(zip(texts, owners, is_gold, result.scores.tolist()))
    for _, owner, gold, score in scored:
        if gold:
            best[owner] = max(best[owner], score)
        else:
            wrong[owner] = max(wrong[owner], score)
    unasked = []
    for i, sample in enumerate(samples):
        winners = [text for text, owner, gold, score in scored
                   if owner == i and gold and score == best[i] > wrong[i]]
        needed = [m for m in MARKERS if winners and all(m in text for text in winners)]
        unasked.append(tuple(m for m in needed if m not in sample.prompt_text))
    return GoldScores(rows=rows, best=best, wrong=wrong, answers=len(texts), errors=result.errors,
                      timeouts=result.timeouts, first_error=reward.first_error, unasked=unasked)
