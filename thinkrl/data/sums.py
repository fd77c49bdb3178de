"""The built-in sums task for real pretrained models (`--config smol`).

Sums of two one-digit numbers, asked four ways ("What is 3 + 4?", "Add 3
and 4.", ...), with an instruction that asks for GSM8K's answer line. A 135M
instruct model such as SmolLM2-135M-Instruct computes most of them (its
greedy responses hold the right sum about half the time) but almost never
writes it after "####", where GSM8K's strict grader reads it: its held-out
accuracy starts near 0. Learning to put its own answer on that line, from
the reward alone, is the first thing R1-Zero-style RL teaches a model on
GSM8K, and what `--config smol` trains on a laptop. The word
problems of the built-in task (two and three steps) are past such a model:
it gets about 1 in 50 right.

The instruction gives no example answer. With one ("for example \"#### 7\"")
the model learned within 8 steps to write "#### 7" under every question,
which the format score paid and the held-out set graded right for the 6 of
its 64 sums that are 7 (docs/benchmarks.md): a number the policy can copy
from every prompt is a reward hack, not a format.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DATA_SOURCE = "thinkrl/arith"  # graded as the built-in task: GSM8K's strict "#### n"
INSTRUCTION = 'Write the final answer after "####".'
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
