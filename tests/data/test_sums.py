"""The built-in sums task of `--config smol`: every one-digit pair asked four
ways, a disjoint held-out split, verl rows graded as GSM8K with the
answer-line instruction."""

from __future__ import annotations

import pyarrow.parquet as pq

from thinkrl.builtin import resolve_data_files
from thinkrl.data import sums


def test_the_splits_cover_every_question_once_and_are_disjoint():
    train, test = sums.split_problems()
    questions = [p.question for p in train + test]
    assert len(questions) == len(set(questions)) == 9 * 9 * len(sums.PHRASINGS)
    assert len(test) == sums.TEST_SIZE
    problem = next(p for p in train if p.question == "Add 3 and 4.")
    assert problem.answer == 7
    assert sums.split_problems() == (train, test)  # seeded


def test_the_built_in_files_are_verl_rows_with_the_answer_line_instruction(asset_cache):
    test = pq.read_table(resolve_data_files("builtin:sums/test")).to_pylist()
    train = pq.read_table(resolve_data_files("builtin:sums/train")).to_pylist()
    assert (len(test), len(train)) == (sums.TEST_SIZE, 9 * 9 * len(sums.PHRASINGS) - sums.TEST_SIZE)
    assert test[0]["data_source"] == "thinkrl/arith" and test[0]["reward_model"]["style"] == "rule"
    assert all(r["prompt"][:-1] == list(sums.DEMONSTRATION) for r in test + train)
    assert all(r["prompt"][-1]["content"].endswith(sums.INSTRUCTION) for r in test + train)
    assert not {r["prompt"][-1]["content"] for r in test} & {r["prompt"][-1]["content"] for r in train}


def test_the_worked_example_shows_the_line_and_its_answer_is_no_sum_of_the_task():
    """A policy that copies the example's line must never be paid."""
    from thinkrl.rewards.gsm8k import extract_answer

    user, assistant = sums.DEMONSTRATION
    assert (user["role"], assistant["role"]) == ("user", "assistant")
    assert user["content"].endswith(sums.INSTRUCTION)
    shown = int(extract_answer(assistant["content"]))
    train, test = sums.split_problems()
    assert shown not in {p.answer for p in train + test}


def test_a_new_worked_example_is_a_new_cache_folder(asset_cache, monkeypatch):
    """A file written with another example (or none) is never reused."""
    from thinkrl.builtin import sums_parquet

    quiet = {"log": lambda *_: None}
    today = sums_parquet(**quiet)
    monkeypatch.setattr(sums, "DEMONSTRATION", ())
    without = sums_parquet(**quiet)
    assert without != today
    (message,) = pq.read_table(without / "test.parquet").to_pylist()[0]["prompt"]
    assert message["role"] == "user"


def test_rows_hold_copies_of_the_worked_example():
    from thinkrl.data.prep.examples import Example, to_verl_rows

    example = Example(question="What is 1 + 2?", ground_truth="3", data_source=sums.DATA_SOURCE, ability="math")
    first, second = to_verl_rows([example, example], split="train", instruction=sums.INSTRUCTION,
                                 demonstration=sums.DEMONSTRATION)
    first["prompt"][0]["content"] = "changed"
    assert second["prompt"][0] == sums.DEMONSTRATION[0] != first["prompt"][0]
