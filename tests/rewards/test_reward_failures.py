"""Reward failures that stop: a hang at import is an error naming the file,
the circuit breaker stops a run whose scorer keeps failing (naming the first
error), and the zero-reward warning leads with the failure count."""

import logging
import multiprocessing as mp
import textwrap
from pathlib import Path

import pytest
import torch

from thinkrl.config import Config
from thinkrl.errors import RunStopped
from thinkrl.records import Sample
from thinkrl.rewards.reward_fn import RewardFnSpec
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.reward_watch import FailureBreaker, ZeroRewardWatch

HANGS_AT_IMPORT = '''
import time
time.sleep(1e9)

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0
'''
RAISES = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    raise KeyError("no answer field")
'''


def _file(tmp_path, text):
    path = tmp_path / "reward.py"
    path.write_text(textwrap.dedent(text))
    return path


def _cfg(path, workers):
    cfg = Config()
    cfg.custom_reward_function.path = str(path)
    cfg.reward.num_workers, cfg.reward.timeout_s = workers, 1.0
    return cfg


@pytest.mark.parametrize("workers", [2, 0])
def test_a_hang_at_import_is_an_error_naming_the_file(tmp_path, workers):
    path = _file(tmp_path, HANGS_AT_IMPORT)
    before = set(mp.active_children())
    with pytest.raises(ValueError) as err:
        RewardScorer.from_config(_cfg(path, workers))
    message = str(err.value)
    assert f"importing custom_reward_function.path={path}" in message
    assert "within reward.timeout_s=1 s" in message
    assert [p for p in mp.active_children() if p not in before and p.name == "thinkrl-reward"] == []


def test_first_error_is_recorded(tmp_path):
    scorer = RewardScorer.from_config(_cfg(_file(tmp_path, RAISES), 0))
    samples = [Sample(data_source="my/data", ground_truth="4", prompt_text="q", index=7)] * 2
    result = scorer.score(["a", "b"], samples)
    scorer.close()
    assert result.errors == 2
    assert scorer.first_error.startswith("data_source my/data, row 7: failed (KeyError")


def test_breaker_stops_when_most_responses_fail(tmp_path):
    breaker = FailureBreaker(0.5, window_steps=3)
    kwargs = dict(first_error="row 3: failed (KeyError: 'x')", run_dir=tmp_path)
    breaker.update(errors=2, timeouts=0, responses=8, step=1, **kwargs)  # 2/8
    breaker.update(errors=4, timeouts=1, responses=8, step=2, **kwargs)  # 7/16
    # 7/24 after step 3 with no failures; step 4 drops step 1: 5 + 8 = 13 of 24 > 0.5
    breaker.update(errors=0, timeouts=0, responses=8, step=3, **kwargs)
    with pytest.raises(RunStopped) as err:
        breaker.update(errors=6, timeouts=2, responses=8, step=4, **kwargs)
    message = str(err.value)
    assert "failed on 13 of 24 responses (54 %) over the last 3 steps" in message
    assert "reward/errors 10, reward/timeouts 3" in message
    assert "First error: row 3: failed (KeyError: 'x')" in message
    assert "No checkpoint is on disk" in message


def test_breaker_trips_at_the_first_step_and_1_never_trips(tmp_path):
    with pytest.raises(RunStopped, match="32 of 32 responses .100 %. over this step"):
        FailureBreaker(0.5, 3).update(errors=32, timeouts=0, responses=32, step=1,
                                      first_error=None, run_dir=tmp_path)
    FailureBreaker(1.0, 3).update(errors=32, timeouts=0, responses=32, step=1,
                                  first_error=None, run_dir=tmp_path)
    with pytest.raises(ValueError, match="reward.max_failure_rate=0"):
        FailureBreaker(0.0, 3)


def test_zero_reward_warning_leads_with_the_failures(caplog):
    watch = ZeroRewardWatch(1)
    with caplog.at_level(logging.WARNING, logger="thinkrl.reward_watch"):
        assert watch.update(torch.zeros(32), failures=32)
    message = caplog.records[0].getMessage()
    assert "FAILED on 32 of the 32 responses" in message and "template" not in message


def test_the_breaker_is_certain_before_the_step_ends(tmp_path):
    # rate 0.5 over 3 steps; step 1 had 2 failures of 8, step 2 none of 8. The next step's
    # update sees steps 1, 2 and itself: with 8 responses, 24 in all, it stops past 12 failures,
    # so 10 failures of this step (2 + 0 + 10 = 12) are not yet certain and 11 (13 > 12) are.
    breaker = FailureBreaker(0.5, window_steps=3)
    kwargs = dict(first_error=None, run_dir=tmp_path)
    breaker.update(errors=2, timeouts=0, responses=8, step=1, **kwargs)
    breaker.update(errors=0, timeouts=0, responses=8, step=2, **kwargs)
    assert not breaker.certain(10, responses=8) and breaker.certain(11, responses=8)
    # after step 3 the window drops step 1 for step 4: 0 + 0 + f of 24, certain past 12
    breaker.update(errors=0, timeouts=0, responses=8, step=3, **kwargs)
    assert not breaker.certain(12, responses=8) and breaker.certain(13, responses=8)
    assert not FailureBreaker(1.0, 3).certain(8, responses=8)  # 1.0 never stops


HANGS_ON_EVERY_CALL = '''
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    time.sleep(1e9)
'''


def test_scoring_stops_once_the_breaker_is_certain(tmp_path):
    # 16 responses on 2 workers, each hanging until reward.timeout_s: scoring them all costs
    # 8 timeouts in a row per worker; with rate 0.5 the run is lost after 9 failures, and
    # the rest are left unscored (counted as timeouts).
    path = tmp_path / "hangs.py"
    path.write_text(textwrap.dedent(HANGS_ON_EVERY_CALL))
    breaker = FailureBreaker(0.5, window_steps=3)
    samples = [Sample(data_source="my/data", ground_truth="4", prompt_text="q", index=i) for i in range(16)]
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=2, timeout_s=0.5) as scorer:
        scorer.start()
        result = scorer.score(["a"] * 16, samples,
                              give_up=lambda failures: breaker.certain(failures, responses=16))
        waited_out = scorer.pool.restarts  # each timeout replaced its worker
    assert result.timeouts + result.unscored == 16 and result.unscored >= 6 and result.errors == 0
    assert 9 <= waited_out <= 10, waited_out  # not 16: the run was lost after 9
    with pytest.raises(RunStopped):
        breaker.update(errors=result.errors, timeouts=result.timeouts, unscored=result.unscored,
                       responses=16, step=1, first_error=scorer.first_error, run_dir=tmp_path)
