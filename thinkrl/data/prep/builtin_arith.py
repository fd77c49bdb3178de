"""The built-in arithmetic task (`thinkrl.data.synthetic`) as `Example`s.

This is the only place its problems become rows: `thinkrl prep builtin`
writes them, and the `builtin:arith/<split>` files of `thinkrl.builtin` are
`thinkrl prep builtin --template chat` (the GSM8K instruction after each
question); `--template qwen_r1` gives the same set without it."""

from __future__ import annotations

from thinkrl.data import synthetic
from thinkrl.data.prep.examples import Example

INSTRUCTION = synthetic.INSTRUCTION


def to_example(problem: synthetic.ArithProblem, data_source: str | None = None) -> Example:
    """`problem` with its answer as the ground truth; the question and the
    worked solution go to extra_info."""
    return Example(question=problem.question, ground_truth=str(problem.answer),
                   data_source=data_source or synthetic.DATA_SOURCE, ability="math",
                   original={"question": problem.question, "answer": problem.solution()})


def splits(*, data_source: str | None = None) -> dict[str, list[Example]]:
    train, test = synthetic.split_problems(train=synthetic.ARITH_TRAIN_SIZE,
                                           test=synthetic.TEST_SIZE, seed=synthetic.DATA_SEED)
    return {"train": [to_example(p, data_source) for p in train],
            "test": [to_example(p, data_source) for p in test]}
