"""Reward worker processes with a per-sample timeout.

A scorer that hangs (a pathological sympy simplification, a user function
stuck in a loop) cannot be interrupted from inside its thread, so each
response is scored in a worker process and the parent watches the clock:
a worker silent for longer than `timeout_s` on one sample is killed, that
sample is reported as timed out, the rest of its work goes to the others,
and a fresh worker takes its place. A replacement that fails to start is
retried (a few times in a row at most): a scorer problem mid-run costs
samples, not the run.

Start method: the trainer process holds torch and its thread pools, and
`fork` copies a process whose other threads may hold locks (a deadlock
waiting to happen). We use `forkserver` (`spawn` where it is missing): a
clean server process imports the worker module once, then forks each
worker from itself, so a replacement starts in milliseconds instead of the
~0.5 s a spawned interpreter needs to import sympy. Workers start on the
first `run` (or `start()`) and are reused across steps.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable
from multiprocessing.connection import Connection, wait

from thinkrl.errors import UserError
from thinkrl.rewards.reward_fn import Outcome, RewardFnSpec, Task

_WORKER_MODULE = "thinkrl.rewards.worker"
_MAX_CHUNK = 32  # tasks sent at once: fewer round trips, still balanced across workers
_CHUNKS_PER_WORKER = 4
_MAX_FAILED_STARTS = 3  # replacements in a row that fail to start before the run stops
_REAP_S = 1.0  # how long to wait for a dead worker's exit code

log = logging.getLogger(__name__)


def _context(start_method: str | None) -> mp.context.BaseContext:
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # Process-wide setting of the (single) fork server; ignored if it already runs.
        # "__main__" too: each child re-imports the parent's main script (as
        # multiprocessing does), and importing it once in the server instead
        # keeps, e.g., a script's `import torch` out of every worker start.
        ctx.set_forkserver_preload(["__main__", _WORKER_MODULE])
    return ctx


@dataclass
class _Worker:
    process: mp.process.BaseProcess
    conn: Connection
    ready: bool = False
    """It has built its reward function and said so."""
    queue: deque[Task] = field(default_factory=deque)
    """Tasks sent and not yet answered; the first is being scored now."""
    deadline: float = math.inf
    """When to give up on it: start-up, or the sample it is scoring now."""
    start_error: str | None = None
    """Why it could not build the reward function (it said so, then exited)."""
    building: bool = False
    """It said it started building the reward function (importing a user's file)."""


@dataclass(frozen=True, slots=True)
class PoolReport:
    """What `ScoringPool.run` returns: an Outcome per position, and what failed."""

    outcomes: dict[int, Outcome]
    timed_out: list[Task]
    died: list[Task]
    """Tasks whose worker process died (crashed, not killed by us) while on them."""
    abandoned: list[Task] = field(default_factory=list)
    """Tasks not scored because `give_up` said the batch was lost (its workers stopped)."""


class ScoringPool:
    """`num_workers` processes scoring `Task`s with `spec`'s function."""

    def __init__(self, spec: RewardFnSpec, *, num_workers: int, timeout_s: float,
                 start_timeout_s: float = 120.0, import_timeout_s: float | None = None,
                 start_method: str | None = None) -> None:
        if num_workers < 1:
            raise UserError(f"reward.num_workers={num_workers}: a pool needs >= 1 worker")
        if not timeout_s > 0:
            raise UserError(f"reward.timeout_s={timeout_s}: use a number of seconds > 0, e.g. 10")
        self.spec, self.num_workers, self.timeout_s = spec, num_workers, timeout_s
        self.start_timeout_s = start_timeout_s
        self.import_timeout_s = timeout_s if import_timeout_s is None else import_timeout_s
        """Seconds a worker may take to build the function once it started
        (import a user's file): the scoring deadline, so a hang at import stops the run."""
        self._ctx = _context(start_method)
        self._workers: list[_Worker] = []
        self.restarts = 0
        """Workers started to replace a killed or dead one, over the pool's life."""
        self.failed_starts = 0
        """Replacement workers that failed to start (and were retried), over the pool's life."""
        self._failed_in_a_row = 0
        self._starting = False
        self.start_seconds = 0.0
        """Wall time the first `start()` took (all workers up and ready)."""

    @property
    def start_method(self) -> str:
        return self._ctx.get_start_method()

    def start(self) -> None:
        """Start the workers now (otherwise the first `run` does) and wait
        until each is ready, so start-up cost is paid and measured here."""
        if self._workers:
            return
        begin = time.perf_counter()
        self._starting = True
        try:
            for _ in range(self.num_workers):
                self._workers.append(self._new_worker())
            while not all(w.ready for w in self._workers):
                self._wait_once(pending=deque(), outcomes={}, timed_out=[], died=[])
        except BaseException:
            # No half-started pool: the next `run` would see workers, skip
            # starting, and misread a dead one's silence.
            self.close()
            raise
        finally:
            self._starting = False
        self._failed_in_a_row = 0
        self.start_seconds = time.perf_counter() - begin

    def _new_worker(self) -> _Worker:
        from thinkrl.rewards.worker import worker_main

        parent_end, child_end = self._ctx.Pipe(duplex=True)
        # daemon: the workers die with the trainer even if close() is never called
        # (a custom reward function therefore cannot start processes of its own).
        process = self._ctx.Process(target=worker_main, args=(child_end, self.spec),
                                    name="thinkrl-reward", daemon=True)
        process.start()
        child_end.close()
        return _Worker(process, parent_end, deadline=time.monotonic() + self.start_timeout_s)

    def run(self, tasks: list[Task], *, give_up: Callable[[int], bool] | None = None) -> PoolReport:
        """Score every task; returns when each has an outcome, timed out or
        died, or as soon as `give_up(failures so far)` is true (the rest are
        abandoned and the workers stopped: fresh ones start next time)."""
        self.start()
        size = max(1, min(_MAX_CHUNK, math.ceil(len(tasks) / (self.num_workers * _CHUNKS_PER_WORKER))))
        pending = deque(tasks[i:i + size] for i in range(0, len(tasks), size))
        outcomes: dict[int, Outcome] = {}
        timed_out: list[Task] = []
        died: list[Task] = []
        try:
            while pending or any(w.queue for w in self._workers):
                self._dispatch(pending)
                self._wait_once(pending, outcomes, timed_out, died)
                failures = len(timed_out) + len(died) + sum(o.error is not None for o in outcomes.values())
                if give_up is not None and failures and give_up(failures):
                    self.close()  # answers still in flight would be read as the next batch's
                    ended = {t.position for t in timed_out + died} | set(outcomes)
                    return PoolReport(outcomes, timed_out, died,
                                      [t for t in tasks if t.position not in ended])
        except BaseException:  # Ctrl-C or failing replacements: answers still in flight
            self.close()  # would be read as the next batch's; fresh workers start next time
            raise
        return PoolReport(outcomes, timed_out, died)

    def _dispatch(self, pending: deque[list[Task]]) -> None:
        for index, worker in enumerate(self._workers):
            if worker.ready and not worker.queue and pending:
                chunk = pending.popleft()
                try:
                    worker.conn.send(chunk)
                except OSError:  # it died while idle: nothing of this chunk started
                    pending.appendleft(chunk)
                    self._replace(index, pending)
                    continue
                worker.queue.extend(chunk)
                worker.deadline = time.monotonic() + self.timeout_s

    def _wait_once(self, pending: deque[list[Task]], outcomes: dict[int, Outcome],
                   timed_out: list[Task], died: list[Task]) -> None:
        """Wait for the next answer or deadline, then handle every worker."""
        watched = [w for w in self._workers if w.queue or not w.ready]
        wait_s = max(0.0, min(w.deadline for w in watched) - time.monotonic())
        ready = set(wait([w.conn for w in watched], timeout=wait_s))
        for index, worker in enumerate(self._workers):
            if worker.conn not in ready and time.monotonic() < worker.deadline:
                continue
            # Read before judging even at the deadline: an answer that came after
            # wait() returned moves the deadline on to the next task (or ends it).
            alive = self._receive(worker, outcomes)
            if not worker.ready and (not alive or worker.start_error is not None
                                     or time.monotonic() >= worker.deadline):
                self._failed_start(index, alive, pending)
            elif not alive:
                if worker.queue:  # empty when it sent its last answer, then died
                    died.append(worker.queue.popleft())
                self._replace(index, pending)
            elif time.monotonic() >= worker.deadline:
                timed_out.append(worker.queue.popleft())
                self._replace(index, pending)

    def _failed_start(self, index: int, alive: bool, pending: deque[list[Task]]) -> None:
        """Worker `index` did not get ready: raise while the pool starts (before
        step 1), else start another in its place, a few times in a row at most."""
        worker = self._workers[index]
        if worker.start_error is not None:
            why = f"could not build the reward function: {worker.start_error}"
        elif alive and worker.building:
            why = self._import_hang()
        elif not alive:
            worker.process.join(_REAP_S)  # exitcode is None until the process is reaped
            why = f"exited during start-up (exit code {worker.process.exitcode}); see its error above"
        else:
            why = f"did not start within {self.start_timeout_s:.0f} s"
        if self._starting:
            if worker.start_error is None and not alive:
                # Most often: a script that starts training at import time,
                # which every worker re-imports (Python's multiprocessing rule).
                raise UserError(
                    f"a reward worker {why}. If you start thinkrl from your own script, put "
                    "that code under `if __name__ == \"__main__\":` (reward workers re-import "
                    "the main script), or set reward.num_workers=0 to score in this process.")
            user_fault = worker.start_error is not None or (alive and worker.building)
            raise (UserError if user_fault else RuntimeError)(f"a reward worker {why}")
        # A replacement holds no task until it is ready, so no sample is lost here.
        self.failed_starts += 1
        self._failed_in_a_row += 1
        if self._failed_in_a_row >= _MAX_FAILED_STARTS:
            raise RuntimeError(
                f"{self._failed_in_a_row} replacement reward workers in a row failed to start "
                f"(last one {why}); the pool cannot score. If the reward function's file changed "
                "since the run started, fix it and resume; reward.num_workers=0 scores in this process.")
        log.warning("a replacement reward worker %s; starting another (%d of %d in a row)",
                    why, self._failed_in_a_row, _MAX_FAILED_STARTS)
        self._replace(index, pending)

    def _import_hang(self) -> str:
        what = (f"importing custom_reward_function.path={self.spec.custom_path}"
                if self.spec.custom_path else "building the reward function")
        return (f"did not finish {what} within reward.timeout_s={self.import_timeout_s:g} s: "
                "code at module level hangs (a loop, a lock, a network call, input()). Fix the "
                "file (`python <file>` shows where it waits), or raise reward.timeout_s if its "
                "imports are only slow")

    def _receive(self, worker: _Worker, outcomes: dict[int, Outcome]) -> bool:
        """Take every message waiting on `worker`'s pipe; False if it died."""
        from thinkrl.rewards.worker import READY, STARTED

        try:
            while worker.conn.poll():
                position, outcome = worker.conn.recv()
                if position == STARTED:
                    worker.building = True
                    worker.deadline = time.monotonic() + self.import_timeout_s
                    continue
                if position == READY:
                    if outcome is not None:  # it exits next; the caller decides what that costs
                        worker.start_error = outcome
                        continue
                    worker.ready, worker.deadline = True, math.inf
                    self._failed_in_a_row = 0
                    continue
                done = worker.queue.popleft()
                assert done.position == position, (done.position, position)
                outcomes[position] = outcome
                worker.deadline = time.monotonic() + self.timeout_s if worker.queue else math.inf
        except (EOFError, OSError):
            return False
        return True

    def _replace(self, index: int, pending: deque[list[Task]]) -> None:
        """Kill worker `index`, give back the tasks it had not started, start a new one."""
        worker = self._workers[index]
        if worker.queue:
            pending.appendleft(list(worker.queue))
            worker.queue.clear()
        _stop(worker, timeout_s=0.0)
        self._workers[index] = self._new_worker()
        self.restarts += 1

    def close(self) -> None:
        """Stop every worker (asking first, then killing); safe to call twice."""
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in self._workers:
            _stop(worker, timeout_s=2.0)
        self._workers = []


def _stop(worker: _Worker, *, timeout_s: float) -> None:
    if timeout_s > 0:
        worker.process.join(timeout_s)
    if worker.process.is_alive():
        worker.process.kill()
        worker.process.join(5.0)
    worker.conn.close()
