"""The built-in tool task: word problems with numbers too large to add in
one's head, and a calculator tool (`thinkrl train --config calculator`).

"Ava has 4821 coins. She finds 3977 more and gives away 1265. How many coins
does Ava have now?" The tiny model cannot add four-digit numbers reliably,
but it can copy them into a call and copy the calculator's answer back.

Its pretraining corpus (`pretraining_dialogues`) mixes two habits: half the
answers do the sum in the head (written correctly, so the model learns the
format, but it cannot reproduce the arithmetic on new numbers), half call
the calculator first. RL has to find out that the call pays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from thinkrl.data.synthetic import _GAIN, _ITEMS, _LOSS, _NAMES
from thinkrl.tools.calls import hermes_call

DATA_SOURCE = "thinkrl/calc"
DATA_SEED = 4242
TEST_SIZE = 200
TRAIN_SIZE = 2000


@dataclass(frozen=True, slots=True)
class CalcProblem:
    question: str
    expression: str
    """The problem as arithmetic, e.g. "4821 + 3977 - 1265"."""
    answer: int

    def in_head(self) -> str:
        """A worked answer without the tool."""
        return f"{self.expression} = {self.answer}.\n#### {self.answer}"

    def tool_call(self) -> str:
        """The first turn of a worked answer with the tool."""
        return hermes_call("calculator", {"expression": self.expression})

    def after_tool(self) -> str:
        """The last turn of a worked answer with the tool."""
        return f"#### {self.answer}"


def make_problem(rng: random.Random) -> CalcProblem:
    name, pronoun = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    total = rng.randint(1000, 9999)
    expression, clauses = str(total), []
    for _ in range(rng.choice((1, 2))):
        n = rng.randint(100, 2999)
        if n <= total and rng.random() < 0.5:
            clauses.append(rng.choice(_LOSS).format(n=n))
            expression, total = f"{expression} - {n}", total - n
        else:
            clauses.append(rng.choice(_GAIN).format(n=n))
            expression, total = f"{expression} + {n}", total + n
    start = expression.split(" ")[0]
    story = f"{name} has {start} {item}. {pronoun} " + " and then ".join(clauses) + "."
    return CalcProblem(f"{story} How many {item} does {name} have now?", expression, total)


def split_problems(*, train: int, test: int, seed: int = DATA_SEED) -> tuple[list[CalcProblem], list[CalcProblem]]:
    """Disjoint train/test problems (the test ones first in the draw)."""
    rng, seen, unique = random.Random(seed), set(), []
    while len(unique) < train + test:
        problem = make_problem(rng)
        if problem.question not in seen:
            seen.add(problem.question)
            unique.append(problem)
    return unique[test:], unique[:test]


def prompt_text(problem: CalcProblem) -> str:
    """The user turn: the question alone (the answer format is the model's
    habit from pretraining, and a shorter prompt keeps the tiny model's steps short)."""
    return problem.question


def pretraining_dialogues(problems: list[CalcProblem], *, tool_rate: float, seed: int
                          ) -> list[tuple[str, list[str]]]:
    """(question, assistant turns): one turn (in the head) or two (a call,
    then the answer after the calculator's message)."""
    rng = random.Random(seed)
    return [(prompt_text(p), [p.tool_call(), p.after_tool()] if rng.random() < tool_rate
             else [p.in_head()]) for p in problems]
