"""User reward functions loaded by path: every mistake caught at start with
a message that says what to do, and every bad result counted, not raised."""

import logging
import textwrap

import pytest

from thinkrl.config import Config
from thinkrl.records import Sample
from thinkrl.rewards.custom import load_reward_function
from thinkrl.rewards.reward_fn import RewardFnSpec
from thinkrl.rewards.scorer import RewardScorer

GOOD = '''
import math

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1 for an exact match; a few keywords trigger the failure modes."""
    if solution_str == "raise":
        raise ZeroDivisionError("user bug")
    if solution_str == "dict":
        return {"score": 0.25, "length": 4, "note": "text parts are dropped"}
    if solution_str == "nodict":
        return {"value": 1.0}
    if solution_str == "text":
        return "1.0"
    if solution_str == "nan":
        return math.nan
    if solution_str == "extra":
        return float(extra_info["bonus"])
    return float(solution_str == ground_truth)

def helper(x):
    return x

def too_few(solution_str):
    return 0.0

NOT_A_FUNCTION = 3
'''


def _write(folder, text, name="my_reward.py"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _samples(n, truth="4"):
    return [Sample(data_source="my/data", ground_truth=truth, prompt_text="q", index=i,
                   extra_info={"bonus": 0.5}) for i in range(n)]


def test_a_good_function_loads_and_scores(tmp_path):
    function = load_reward_function(_write(tmp_path, GOOD))
    assert function(data_source="x", solution_str="4", ground_truth="4") == 1.0
    cfg = Config()
    cfg.custom_reward_function.path = str(tmp_path / "my_reward.py")
    cfg.reward.num_workers = 0
    with RewardScorer.from_config(cfg) as scorer:
        scorer.check_sources(["any/source"])  # the custom function takes every row
        result = scorer.score(["4", "5", "extra"], _samples(3))
    assert result.scores.tolist() == [1.0, 0.0, 0.5]
    assert (result.errors, result.timeouts) == (0, 0)


def test_a_missing_file_lists_the_nearest(tmp_path):
    _write(tmp_path, GOOD, "my_reward.py")
    _write(tmp_path, GOOD, "other.py")
    with pytest.raises(ValueError) as err:
        load_reward_function(tmp_path / "my_rewrd.py")
    message = str(err.value)
    assert "custom_reward_function.path" in message and "no such file" in message
    assert "my_reward.py" in message.split("Nearest existing files")[1]
    with pytest.raises(ValueError, match="Nearest existing files"):
        load_reward_function(tmp_path / "missing_folder" / "my_reward.py")  # folder missing too


def test_a_missing_name_lists_the_functions(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(ValueError) as err:
        load_reward_function(path, "score_fn")
    message = str(err.value)
    assert "custom_reward_function.name=score_fn" in message
    assert "compute_score, helper, too_few" in message


def test_not_callable_and_wrong_signature(tmp_path):
    path = _write(tmp_path, GOOD)
    with pytest.raises(ValueError, match="is a int, not a function"):
        load_reward_function(path, "NOT_A_FUNCTION")
    with pytest.raises(ValueError, match="cannot be called with verl's reward arguments"):
        load_reward_function(path, "too_few")
    with pytest.raises(ValueError, match="cannot be called"):
        load_reward_function(path, "helper")


def test_a_file_that_fails_to_import(tmp_path):
    path = _write(tmp_path, "import not_a_module_anywhere\n")
    with pytest.raises(ValueError, match="importing it failed with ModuleNotFoundError"):
        load_reward_function(path)


def test_a_bad_file_stops_the_scorer_at_construction(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        RewardScorer(RewardFnSpec(custom_path=str(tmp_path / "nope.py")), num_workers=2)


def test_bad_results_are_counted_errors(tmp_path, caplog):
    spec = RewardFnSpec(custom_path=str(_write(tmp_path, GOOD)))
    texts = ["4", "raise", "dict", "nodict", "text", "nan", "raise", "4"]
    with caplog.at_level(logging.WARNING, logger="thinkrl.rewards.scorer"):
        with RewardScorer(spec, num_workers=0) as scorer:
            result = scorer.score(texts, _samples(len(texts)))
            scorer.score(["raise"], _samples(1))  # the same kind again: not logged again
    assert result.scores.tolist() == [1.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert (result.errors, result.timeouts) == (5, 0)
    assert result.parts[2] == {"length": 4.0} and result.parts[0] == {}
    assert result.metrics() == {"reward/errors": 5.0, "reward/timeouts": 0.0, "reward/length/mean": 4.0}
    messages = [r.getMessage() for r in caplog.records]
    # one line per kind: ZeroDivisionError and ResultError (dict without score, text, nan)
    assert len(messages) == 2, messages
    assert "my/data, row 1" in messages[0] and "ZeroDivisionError: user bug" in messages[0]
    assert "'raise'" in messages[0]  # the response
    assert "without a 'score' key" in messages[1]


def test_texts_and_samples_must_line_up():
    with RewardScorer(RewardFnSpec(), num_workers=0) as scorer:
        with pytest.raises(ValueError, match="must line up"):
            scorer.score(["a", "b"], _samples(1))


def test_an_in_process_function_scores_inline():
    def exact(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return {"score": float(solution_str == ground_truth), "seen": 1.0}

    with RewardScorer.from_function(exact) as scorer:
        scorer.check_sources(["anything"])
        result = scorer.score(["4", "5"], _samples(2))
    assert result.scores.tolist() == [1.0, 0.0] and result.metrics()["reward/seen/mean"] == 1.0
    with pytest.raises(ValueError, match="cannot be called with verl's reward arguments"):
        RewardScorer.from_function(lambda response, truth: 1.0)
