"""The built-in long-tail task: one problem in seven is long, answers grow a
line per step, the test split is disjoint, and the files are verl rows."""

from __future__ import annotations

import collections

import pyarrow.parquet as pq

from thinkrl.builtin import resolve_data_files
from thinkrl.data import longtail


def test_one_problem_in_seven_is_long_and_its_answer_a_line_per_step():
    train, test = longtail.split_problems(train=700, test=70)
    steps = collections.Counter(len(p.steps) for p in train)
    assert set(steps) <= set(longtail.SHORT_STEPS) | set(longtail.LONG_STEPS)
    long_share = sum(c for k, c in steps.items() if k in longtail.LONG_STEPS) / len(train)
    assert 0.09 < long_share < 0.2  # 1/7 = 0.14
    assert not {p.question for p in train} & {p.question for p in test}
    for p in train[:50]:
        solution = p.solution()
        assert solution.count(" = ") == len(p.steps) and solution.endswith(f"#### {p.answer}")
        assert 0 <= p.answer <= 26


def test_the_built_in_files_are_verl_rows_graded_as_gsm8k(asset_cache):
    rows = pq.read_table(resolve_data_files("builtin:longtail/test")).to_pylist()
    assert len(rows) == longtail.TEST_SIZE
    assert rows[0]["data_source"] == "thinkrl/arith" and rows[0]["reward_model"]["style"] == "rule"
    assert "####" in rows[0]["prompt"][0]["content"]
