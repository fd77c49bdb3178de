"""thinkrl.deadline.run_all: results in call order, at most `concurrency`
calls running at once, each call's own deadline, an exception returned as
the call's result, a call past its deadline abandoned (its late result dropped)."""

from __future__ import annotations

import threading
import time

import pytest

from thinkrl.deadline import Finished, TimedOut, run_all


def test_results_keep_their_order_and_errors_are_returned():
    def boom():
        raise KeyError("x")
    results = run_all([lambda: 1, boom, lambda: 3], concurrency=2, timeout_s=5)
    assert [r.value for r in results] == [1, None, 3]
    assert isinstance(results[1], Finished) and isinstance(results[1].error, KeyError)


def test_at_most_concurrency_calls_run_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def call():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1
        return True
    assert all(r.value for r in run_all([call] * 9, concurrency=3, timeout_s=5))
    assert peak[0] == 3


def test_each_call_has_its_own_deadline_and_a_late_result_is_dropped():
    late = threading.Event()

    def slow():
        time.sleep(0.6)
        late.set()
        return "late"
    start = time.monotonic()
    results = run_all([slow, lambda: "quick"], concurrency=2, timeout_s=[0.2, 5])
    assert time.monotonic() - start < 0.5
    assert isinstance(results[0], TimedOut) and results[0].seconds == 0.2 and results[1].value == "quick"
    assert late.wait(2) and isinstance(results[0], TimedOut)  # the thread finished later; nobody took it
    with pytest.raises(ValueError, match="concurrency=0"):
        run_all([], concurrency=0, timeout_s=1)
