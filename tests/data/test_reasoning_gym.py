"""`thinkrl prep reasoning-gym` and the reasoning_gym scorer, on the
installed package (skipped without it): rows in verl's schema scored by the
package's own scorer with no reward file, splits that share no question,
generator settings passed through, and clear errors for a misnamed task or
setting."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym")

from thinkrl.data.prep.reasoning_gym import GymRequest, generate, parse_config, parse_tasks  # noqa: E402
from thinkrl.rewards import compute_score  # noqa: E402
from thinkrl.rewards.registry import scorer_name_for  # noqa: E402

SMALL = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def test_rows_are_verl_rows_scored_by_reasoning_gym():
    rows = generate(GymRequest(tasks=("chain_sum", "leg_counting"), size=20, test_size=5, seed=3,
                               config=parse_config(json.dumps(SMALL), ("chain_sum", "leg_counting"))))
    assert [len(rows["train"]), len(rows["test"])] == [40, 10]
    row = rows["train"][0]
    assert row["data_source"] == "reasoning_gym/chain_sum" and scorer_name_for(row["data_source"]) == "reasoning_gym"
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    entry = json.loads(row["extra_info"]["entry"])
    assert entry["metadata"]["num_terms"] == 2 and entry["metadata"]["num_digits"] == 1  # settings passed
    answer = row["reward_model"]["ground_truth"]
    score = lambda text: compute_score(row["data_source"], text, answer, row["extra_info"])  # noqa: E731
    assert score(f"so it is <answer>{answer}</answer>") == {"score": 1.0, "format": 1.0, "accuracy": 1.0}
    assert score(f"<answer>{int(answer) + 1}</answer>")["score"] == 0.0
    assert score(answer) == {"score": 0.0, "format": 0.0, "accuracy": 0.0}  # no tags: reasoning-gym reads none
    assert row["prompt"][-1]["content"].endswith("Give your final answer between <answer> and </answer>.")


def test_no_test_question_is_trained_on_and_a_seed_repeats():
    request = GymRequest(tasks=("spell_backward",), size=200, test_size=50, seed=5, shots=2)
    rows = generate(request)
    train = {r["prompt"][-1]["content"] for r in rows["train"]}
    test = {r["prompt"][-1]["content"] for r in rows["test"]}
    shots = {m["content"] for m in rows["train"][0]["prompt"][:-1] if m["role"] == "user"}
    assert not train & test and not shots & test and len(shots) == 2
    assert generate(request) == rows


def test_a_worked_example_shows_the_working_of_an_arithmetic_task():
    rows = generate(GymRequest(tasks=("chain_sum",), size=2, test_size=1, config=SMALL, shots=1))
    shown = rows["test"][0]["prompt"][1]
    assert shown["role"] == "assistant"
    assert shown["content"].split("\n")[0].count("=") == 1 and shown["content"].endswith("</answer>")


def test_misnamed_tasks_and_settings_are_refused_with_a_fix():
    with pytest.raises(ValueError, match="did you mean chain_sum"):
        parse_tasks("chain_sums")
    with pytest.raises(ValueError, match="reasoning-gym refuses"):
        generate(GymRequest(tasks=("chain_sum",), size=2, test_size=1, config={"chain_sum": {"max_termz": 3}}))
    with pytest.raises(ValueError, match="does not name"):
        parse_config('{"leg_counting": {}}', ("chain_sum",))
    with pytest.raises(ValueError, match="distinct questions"):
        generate(GymRequest(tasks=("chain_sum",), size=500, test_size=1,
                            config={"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}))


def test_a_row_without_its_entry_is_an_error_not_a_zero():
    with pytest.raises(ValueError, match="extra_info.task and extra_info.entry"):
        compute_score("reasoning_gym/chain_sum", "<answer>3</answer>", "3", {})
