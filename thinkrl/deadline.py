"""Calls run on threads, at most `concurrency` at once, each within a deadline.

Used for what a rollout waits on outside the model: tool calls and
environment steps. A call that raises is returned as its exception; one
that is still running at its deadline is abandoned: Python cannot stop a
thread, so it is left behind as a daemon, its late result is dropped, and
it no longer counts against the bound. Whoever can be stopped for real (a
sandboxed tool, an environment in a worker process) keeps its own, shorter
deadline, so nothing is left running; this one bounds how long a step
waits whatever the callee does.

Calls start in order; each gets `timeout_s` from its own start.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from thinkrl.errors import UserError


@dataclass(frozen=True, slots=True)
class Finished:
    """The call returned `value` or raised `error` after `seconds`."""

    value: Any
    error: BaseException | None
    seconds: float


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The call was still running at its deadline (`seconds` = the deadline)."""

    seconds: float


Result = Finished | TimedOut


def run_all(calls: Sequence[Callable[[], Any]], *, concurrency: int,
            timeout_s: float | Sequence[float], name: str = "call") -> list[Result]:
    """Run every call (at most `concurrency` at once, each within `timeout_s`,
    one for all or one per call); one result per call, in order."""
    if concurrency < 1:
        raise UserError(f"concurrency={concurrency}: must be >= 1")
    limits = [float(timeout_s)] * len(calls) if isinstance(timeout_s, (int, float)) else list(timeout_s)
    results: list[Result | None] = [None] * len(calls)
    running: dict[int, _Call] = {}
    pending = list(range(len(calls)))[::-1]
    done = threading.Condition()
    while pending or running:
        while pending and len(running) < concurrency:
            i = pending.pop()
            running[i] = _Call(calls[i], done, name=name, timeout_s=limits[i])
            running[i].start()
        with done:
            now = time.monotonic()
            finished = [i for i, call in running.items() if call.result is not None]
            expired = [i for i, call in running.items() if call.result is None and now >= call.deadline]
            if not finished and not expired:
                soonest = min(call.deadline for call in running.values())
                done.wait(max(0.0, soonest - now))
                continue
        for i in finished:
            results[i] = running.pop(i).result
        for i in expired:
            results[i] = running.pop(i).abandon()
    return results  # type: ignore[return-value]


class _Call(threading.Thread):
    def __init__(self, call: Callable[[], Any], done: threading.Condition, *, name: str,
                 timeout_s: float) -> None:
        super().__init__(daemon=True, name=name)
        self.call, self.done, self.timeout_s = call, done, timeout_s
        self.result: Result | None = None
        self.deadline = time.monotonic() + timeout_s
        self._abandoned = False

    def run(self) -> None:
        start = time.perf_counter()
        try:
            outcome = Finished(self.call(), None, time.perf_counter() - start)
        except BaseException as err:  # the callee's failure is the caller's information
            outcome = Finished(None, err, time.perf_counter() - start)
        with self.done:
            if not self._abandoned:
                self.result = outcome
            self.done.notify_all()

    def abandon(self) -> Result:
        """Give up on the call unless it finished meanwhile (a late result is dropped)."""
        with self.done:
            if self.result is not None:
                return self.result
            self._abandoned = True
            return TimedOut(self.timeout_s)
