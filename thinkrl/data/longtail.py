"""The built-in long-tail task: the arithmetic word problems of
`thinkrl.data.synthetic` with a long-tailed number of steps.

Most problems take one to three steps, as the built-in task's; one in seven
takes ten to sixteen. A worked answer writes one "a + b = r." line per step,
so response lengths follow the problems': most responses are short and a
few run to a hundred and more tokens. Generation time is then set by the few
long responses of each batch, the case asynchronous training with streaming
rollout is for (docs/benchmarks.md, `bench/async_modes.py --workload longtail`).

The pretraining corpus mixes worked and one-step ("sloppy") answers as the
built-in task's does, so RL has the same habit to teach.
"""

from __future__ import annotations

import random

from thinkrl.data.synthetic import ArithProblem, make_problem

DATA_SOURCE = "thinkrl/arith"  # graded as the built-in task: GSM8K's "#### n"
DATA_SEED = 777
TEST_SIZE = 200
TRAIN_SIZE = 2000
LONG_SHARE = 1 / 7
SHORT_STEPS = (1, 2, 3)
LONG_STEPS = tuple(range(10, 17))


def step_count(rng: random.Random) -> int:
    """The steps of one problem: long (10-16) with probability LONG_SHARE, else 1-3."""
    return rng.choice(LONG_STEPS if rng.random() < LONG_SHARE else SHORT_STEPS)


def split_problems(*, train: int, test: int, seed: int = DATA_SEED
                   ) -> tuple[list[ArithProblem], list[ArithProblem]]:
    """Disjoint train/test problems (the test ones first in the draw)."""
    rng, seen, unique = random.Random(seed), set(), []
    while len(unique) < train + test:
        problem = make_problem(rng, n_steps=step_count(rng))
        if problem.question not in seen:
            seen.add(problem.question)
            unique.append(problem)
    return unique[test:], unique[:test]
