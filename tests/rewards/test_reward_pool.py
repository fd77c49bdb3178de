"""Scoring in worker processes: a raising, hanging or crashing scorer costs
only its own sample (counted), the others keep their scores, the pool gives
exactly the inline scores, and workers that fail to start neither leak nor
(mid-run) stop the run."""

import logging
import multiprocessing as mp
import textwrap
import time

import pytest

from thinkrl.records import Sample
from thinkrl.rewards import pool as pool_module
from thinkrl.rewards.reward_fn import RewardFnSpec
from thinkrl.rewards.scorer import RewardScorer

BEHAVIOURS = '''
import os
import threading
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "raise":
        raise RuntimeError("user bug")
    if solution_str == "sleep":
        time.sleep(1e9)
    if solution_str == "spin":
        while True:
            pass
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "answer then exit":  # the answer goes out, then the process dies
        threading.Timer(0.05, os._exit, (3,)).start()
    return float(solution_str == ground_truth)
'''
# Only the two hanging samples pay for it; generous so that on a busy 2-core
# machine (one core held by "spin") no trivial score runs past it.
TIMEOUT_S = 5.0

# Fails in the workers, not in the test process, while a "<how> <count>" file
# sits beside it: each worker start uses up one count (one worker at a time).
FAILS_TO_START = '''
import os
import pathlib

_MARK = pathlib.Path(__file__).with_suffix(".fail")
if _MARK.exists():
    how, left = _MARK.read_text().split()
    if int(left) > 0:
        _MARK.write_text(f"{how} {int(left) - 1}")
        if how == "exit":
            os._exit(4)
        raise RuntimeError("broken on purpose")

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "exit":
        os._exit(3)
    return float(solution_str == ground_truth)
'''


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "behaviours.py"
    path.write_text(textwrap.dedent(BEHAVIOURS))
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=2, timeout_s=TIMEOUT_S) as scorer:
        yield scorer


def _samples(n, source="my/data", truth="4"):
    return [Sample(data_source=source, ground_truth=truth, prompt_text="q", index=100 + i)
            for i in range(n)]


def _record_reports(pool, monkeypatch):
    """The PoolReports `pool.run` returns from now on (they say which rows)."""
    reports, run = [], pool.run
    monkeypatch.setattr(pool, "run", lambda tasks, **kw: reports.append(run(tasks, **kw)) or reports[-1])
    return reports


def test_failures_cost_only_their_own_sample(pooled, caplog, monkeypatch):
    texts = ["4", "raise", "sleep", "4", "5", "spin", "exit", "4"] + ["4", "3"] * 10
    reports = _record_reports(pooled.pool, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="thinkrl.rewards.scorer"):
        result = pooled.score(texts, _samples(len(texts)))
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0] + [1.0, 0.0] * 10
    # sleep and spin: stopped, their workers replaced (a trivial row held up past
    # the timeout on an overloaded machine would add to, not replace, these)
    assert {2, 5} <= {task.position for task in reports[0].timed_out}
    assert result.timeouts == len(reports[0].timed_out) >= 2
    assert [task.position for task in reports[0].died] == [6]
    assert result.errors == 2  # raise, and the worker that exited
    assert pooled.pool.restarts >= 3
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "row 102" in messages and f"reward.timeout_s={TIMEOUT_S:g} s" in messages and "'sleep'" in messages
    assert "row 101" in messages and "RuntimeError: user bug" in messages
    assert "WorkerDied" in messages
    # the pool still works at full size on the next step
    again = pooled.score(["4", "5", "4"], _samples(3))
    assert again.scores.tolist() == [1.0, 0.0, 1.0] and (again.errors, again.timeouts) == (0, 0)


def test_an_empty_batch(pooled):
    result = pooled.score([], [])
    assert result.scores.shape == (0,) and (result.errors, result.timeouts) == (0, 0)


def test_pool_and_inline_give_identical_scores():
    samples, texts = [], []
    for i in range(12):
        samples.append(Sample(data_source="openai/gsm8k", ground_truth="72", prompt_text="q", index=i))
        texts.append(f"so #### {70 + i % 4}")
        samples.append(Sample(data_source="HuggingFaceH4/MATH-500", ground_truth="\\frac{1}{2}",
                              prompt_text="q", index=i))
        texts.append(["\\boxed{0.5}", "\\boxed{\\dfrac{2}{4}}", "\\boxed{1/3}", "no box"][i % 4])
    spec = RewardFnSpec(scorer="auto")
    with RewardScorer(spec, num_workers=0) as inline, \
            RewardScorer(spec, num_workers=2, timeout_s=30) as pooled:
        expected = inline.score(texts, samples)
        got = pooled.score(texts, samples)
    assert got.scores.tolist() == expected.scores.tolist()
    assert sum(expected.scores.tolist()) == 3 + 6  # gsm8k: 72 in 3 of 12; math: 2 of 4 forms
    r1 = RewardFnSpec(scorer="r1")
    with RewardScorer(r1, num_workers=0) as inline, RewardScorer(r1, num_workers=1, timeout_s=30) as pooled:
        r1_texts = ["<think>a</think><answer>0.5</answer>", "<answer>0.5</answer>"]
        assert pooled.score(r1_texts, samples[1:4:2]).parts == inline.score(r1_texts, samples[1:4:2]).parts


def test_a_builtin_scorer_that_hangs_is_stopped():
    # sympy evaluates 9^(9^(9^9)) for as long as it is allowed to: the math
    # scorer's own guards (length, brace depth) do not catch it, the pool does.
    samples = _samples(2, source="HuggingFaceH4/MATH-500", truth="1")
    with RewardScorer(RewardFnSpec(), num_workers=1, timeout_s=TIMEOUT_S) as scorer:
        result = scorer.score(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{1}"], samples)
    assert result.scores.tolist() == [0.0, 1.0] and result.timeouts == 1


def _write_reward_file(tmp_path, source):
    path = tmp_path / "reward.py"
    path.write_text(textwrap.dedent(source))
    return path


def _our_live_workers(before):
    return [p for p in mp.active_children() if p.name == "thinkrl-reward" and p not in before]


@pytest.mark.parametrize("how, message", [("raise", "could not build the reward function"),
                                          ("exit", "exit code 4")])
def test_a_failed_start_leaves_no_workers_and_the_next_start_works(tmp_path, how, message):
    path = _write_reward_file(tmp_path, FAILS_TO_START)
    before = set(mp.active_children())
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=2, timeout_s=TIMEOUT_S) as scorer:
        path.with_suffix(".fail").write_text(f"{how} 100")  # the scorer built its own copy already
        with pytest.raises(ValueError, match=message) as failure:
            scorer.score(["4"], _samples(1))
        if how == "exit":
            assert "if __name__ ==" in str(failure.value) and "reward.num_workers=0" in str(failure.value)
        assert _our_live_workers(before) == []
        path.with_suffix(".fail").unlink()
        result = scorer.score(["4", "3"], _samples(2))
        assert result.scores.tolist() == [1.0, 0.0] and (result.errors, result.timeouts) == (0, 0)


def test_a_replacement_that_fails_to_start_is_retried(tmp_path):
    path = _write_reward_file(tmp_path, FAILS_TO_START)
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=1, timeout_s=TIMEOUT_S) as scorer:
        scorer.start()
        path.with_suffix(".fail").write_text("exit 1")
        first = scorer.score(["exit", "4"], _samples(2))  # its replacement exits, the next one works
        path.with_suffix(".fail").write_text("raise 1")
        second = scorer.score(["exit", "3", "4"], _samples(3))
        assert scorer.pool.failed_starts == 2
    assert first.scores.tolist() == [0.0, 1.0] and (first.errors, first.timeouts) == (1, 0)
    assert second.scores.tolist() == [0.0, 0.0, 1.0] and (second.errors, second.timeouts) == (1, 0)


def test_replacements_that_keep_failing_stop_the_run_clearly(tmp_path):
    path = _write_reward_file(tmp_path, FAILS_TO_START)
    before = set(mp.active_children())
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=1, timeout_s=TIMEOUT_S) as scorer:
        scorer.start()
        path.with_suffix(".fail").write_text("raise 100")
        with pytest.raises(RuntimeError, match="3 replacement reward workers in a row failed to start"):
            scorer.score(["exit", "4"], _samples(2))
        assert _our_live_workers(before) == []
        path.with_suffix(".fail").unlink()  # fixed: the next step starts a fresh pool
        assert scorer.score(["4"], _samples(1)).scores.tolist() == [1.0]


def _late_wait(monkeypatch, *, then_sleep_s, report_nothing):
    """Make the pool's next wait() return only after an answer is in the pipe
    and `then_sleep_s` more have passed (reporting nothing ready, if asked)."""
    real_wait, calls = pool_module.wait, []

    def late_wait(conns, timeout=None):
        if calls:
            return real_wait(conns, timeout)
        calls.append(real_wait(conns))
        time.sleep(then_sleep_s)
        return [] if report_nothing else real_wait(conns, 0)

    monkeypatch.setattr(pool_module, "wait", late_wait)


def test_an_answer_that_comes_at_the_deadline_is_kept(tmp_path, monkeypatch):
    path = _write_reward_file(tmp_path, BEHAVIOURS)
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=1, timeout_s=0.2) as scorer:
        scorer.start()
        # the answer arrives, then the deadline passes before the pool looks
        _late_wait(monkeypatch, then_sleep_s=0.4, report_nothing=True)
        result = scorer.score(["4"], _samples(1))
        assert scorer.pool.restarts == 0
    assert result.scores.tolist() == [1.0] and (result.errors, result.timeouts) == (0, 0)


def test_a_worker_that_dies_after_its_last_answer(tmp_path, monkeypatch):
    path = _write_reward_file(tmp_path, BEHAVIOURS)
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=1, timeout_s=TIMEOUT_S) as scorer:
        scorer.start()
        # its answer and its exit are both waiting when the pool looks
        _late_wait(monkeypatch, then_sleep_s=1.0, report_nothing=False)
        result = scorer.score(["answer then exit"], _samples(1, truth="answer then exit"))
        assert scorer.pool.restarts == 1  # seen dead, replaced, and no sample blamed
        again = scorer.score(["4"], _samples(1))
    assert result.scores.tolist() == [1.0] and (result.errors, result.timeouts) == (0, 0)
    assert again.scores.tolist() == [1.0]
