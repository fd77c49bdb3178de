"""The built-in sums task for real pretrained models (`--config smol`).

Sums of two one-digit numbers, asked four ways ("What is 3 + 4?", "Add 3
and 4.", ...), with an instruction that asks for GSM8K's answer line and one
worked example before the question (an earlier user/assistant turn, as
few-shot GSM8K prompts do). A 135M instruct model such as
SmolLM2-135M-Instruct computes most of the sums; learning to write its own
answer on the "#### n" line every time, where GSM8K's strict grader reads
it, from the reward alone, is what `--config smol` trains on a laptop. The
word problems of the built-in task (two and three steps) are past such a
model: it gets about 1 in 50 right.

Why the worked example (docs/benchmarks.md has the measurements):
- Without it the model almost never writes the line (a right "#### n" in 2
  of 512 samples at temperature 0.7), so the reward is all but always 0.
  Paying a format score for any readable "#### n" instead taught two seeds
  of three to copy the question onto the line ("#### 7 + 6 = 13", read as
  7): a reward hack.
- With it, before training, 56% of the samples and 43 of the 64 held-out
  greedy answers are right; the other greedy answers hold the right sum but
  no line. The example's sum (12 + 30 = 42) is no answer of this task (2 to
  18), so a policy that copies the example's line is never paid; an earlier
  instruction that said `for example "#### 7"` was copied under every
  question and paid for the 6 of 64 held-out sums that are 7.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DATA_SOURCE = "thinkrl/arith"  # graded as the built-in task: GSM8K's strict "#### n"
INSTRUCTION = 'Write the final answer after "####".'
DEMONSTRATION = (
    {"role": "user", "content": f"What is 12 + 30? {INSTRUCTION}"},
    {"role": "assistant", "content": "12 + 30 = 42\n#### 42"},
)
"""The worked example before every question: its answer (42) is no sum of two digits."""
PHRASINGS = ("What is {a} + {b}?", "Add {a} and {b}.", "What is the sum of {a} and {b}?",
             "Compute {a} + {b}.")
DATA_SEED = 2025
TEST_SIZE = 64
"""Held-out questions; the other 260 of the 324 are the training split."""


@dataclass(frozen=True, slots=True)
class SumProblem:
    question: str
    a: int
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b


def split_problems(*, test: int = TEST_SIZE, seed: int = DATA_SEED
                   ) -> tuple[list[SumProblem], list[SumProblem]]:
    """Every question (9 x 9 pairs x 4 phrasings) in a seeded order: the first
    `test` are held out, the rest train; no question is in both."""
    problems = [SumProblem(text.format(a=a, b=b), a, b)
                for a in range(1, 10) for b in range(1, 10) for text in PHRASINGS]
    random.Random(seed).shuffle(problems)
    return problems[test:], problems[:test]
