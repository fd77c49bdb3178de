"""The built-in arithmetic task (`thinkrl.data.synthetic`), with the same
problems, split and rows as the `builtin:arith/<split>` files of
`thinkrl.builtin`, so `thinkrl prep builtin --template qwen_r1` gives the
same set without the GSM8K instruction."""

from __future__ import annotations

from thinkrl import builtin
from thinkrl.data import synthetic
from thinkrl.data.prep.examples import Example

INSTRUCTION = synthetic.INSTRUCTION


def _example(problem: synthetic.ArithProblem, data_source: str | None) -> Example:
    return Example(question=problem.question, ground_truth=str(problem.answer),
                   data_source=data_source or synthetic.DATA_SOURCE, ability="math",
                   original={"question": problem.question, "answer": problem.solution()})


def splits(*, data_source: str | None = None) -> dict[str, list[Example]]:
    train, test = synthetic.split_problems(train=builtin.ARITH_TRAIN_SIZE,
                                           test=synthetic.TEST_SIZE, seed=synthetic.DATA_SEED)
    return {"train": [_example(p, data_source) for p in train],
            "test": [_example(p, data_source) for p in test]}
