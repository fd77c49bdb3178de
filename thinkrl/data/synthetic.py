"""The built-in task: arithmetic word problems with GSM8K-style answers.

Each problem chains two or three additions and subtractions of small numbers
("Ava has 7 shells. She finds 5 more and gives away 3. ..."), so a model must
read the story, carry a running total and write the result after `####`, as
in GSM8K. `thinkrl.data.prep.builtin_arith` turns the problems into rows of
verl's parquet schema, so the same files train in verl and the same GSM8K
scorer grades them.

The pretraining corpus for the tiny model (`pretraining_texts`) mixes worked
solutions that do every step with "sloppy" ones that stop after the first
step and answer with that partial total. A model trained on it has learned the
method but prefers the shortcut: its greedy answer is usually wrong while some
of its samples are right. That is the situation R1-Zero-style RL is for: the
reward alone has to teach the policy which of its own habits to keep.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from thinkrl.errors import UserError

DATA_SOURCE = "thinkrl/arith"
# verl's GSM8K preprocessing appends this sentence to every question; we do
# the same so that prompts, rewards and files are interchangeable with verl's.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

_NAMES = [("Ava", "She"), ("Ben", "He"), ("Cleo", "She"), ("Dan", "He"), ("Eli", "He"),
          ("Fay", "She"), ("Gus", "He"), ("Hana", "She"), ("Ivan", "He"), ("Jo", "She"),
          ("Kai", "He"), ("Lena", "She"), ("Max", "He"), ("Nora", "She"), ("Omar", "He"),
          ("Pia", "She")]
_ITEMS = ["apples", "shells", "coins", "stickers", "books", "pencils", "cards", "marbles",
          "stamps", "cookies", "eggs", "flowers"]
_GAIN = ["buys {n} more", "finds {n} more", "gets {n} more", "is given {n} more"]
_LOSS = ["gives away {n}", "loses {n}", "eats {n}", "sells {n}"]

MAX_OPERAND = 6
MAX_START = 12
MAX_TOTAL = 20
# One fixed pool: the held-out test problems are the first TEST_SIZE distinct
# problems of seed DATA_SEED, and every other set is drawn after them.
DATA_SEED = 2024
TEST_SIZE = 200
ARITH_TRAIN_SIZE = 2000
"""Problems in the training split of `builtin:arith/train` (thinkrl.builtin)."""


@dataclass(frozen=True, slots=True)
class ArithProblem:
    """One word problem: the story and its worked steps."""

    question: str
    steps: tuple[tuple[int, str, int, int], ...]
    """Each step as (left, op, right, result) with op '+' or '-'."""

    @property
    def answer(self) -> int:
        return self.steps[-1][3]

    def solution(self, *, sloppy: bool = False) -> str:
        """The worked answer; `sloppy` stops after the first step."""
        steps = self.steps[:1] if sloppy else self.steps
        lines = [f"{a} {op} {b} = {r}." for a, op, b, r in steps]
        return " ".join(lines) + f"\n#### {steps[-1][3]}"


def make_problem(rng: random.Random, *, n_steps: int | None = None) -> ArithProblem:
    """Draw one problem of `n_steps` steps (None: 2 or 3, drawn); running totals
    stay within 0..MAX_TOTAL (+MAX_OPERAND in the rare case where neither
    step direction fits)."""
    name, pronoun = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    total = rng.randint(2, MAX_START)
    clauses, steps = [], []
    for _ in range(rng.choice((2, 3)) if n_steps is None else n_steps):
        n = rng.randint(1, MAX_OPERAND)
        if n <= total and (rng.random() < 0.5 or total + n > MAX_TOTAL):
            clauses.append(rng.choice(_LOSS).format(n=n))
            steps.append((total, "-", n, total - n))
            total -= n
        else:
            clauses.append(rng.choice(_GAIN).format(n=n))
            steps.append((total, "+", n, total + n))
            total += n
    story = f"{name} has {steps[0][0]} {item}. {pronoun} " + " and then ".join(clauses) + "."
    question = f"{story} How many {item} does {name} have now?"
    return ArithProblem(question=question, steps=tuple(steps))


def generate_problems(count: int, *, seed: int) -> list[ArithProblem]:
    rng = random.Random(seed)
    return [make_problem(rng) for _ in range(count)]


def split_problems(*, train: int, test: int, seed: int) -> tuple[list[ArithProblem], list[ArithProblem]]:
    """Disjoint train/test problems: a test question never appears in train."""
    problems = generate_problems(3 * (train + test), seed=seed)
    seen: set[str] = set()
    unique = []
    for p in problems:
        if p.question not in seen:
            seen.add(p.question)
            unique.append(p)
    if len(unique) < train + test:
        raise UserError(f"only {len(unique)} distinct problems for {train}+{test} requested")
    return unique[test:test + train], unique[:test]


def pretraining_texts(problems: list[ArithProblem], *, full_solution_rate: float,
                      seed: int) -> list[tuple[str, str]]:
    """(question, answer) pairs for pretraining; a share `1 - full_solution_rate`
    of the answers take the one-step shortcut."""
    rng = random.Random(seed)
    return [(f"{p.question} {INSTRUCTION}", p.solution(sloppy=rng.random() >= full_solution_rate))
            for p in problems]
