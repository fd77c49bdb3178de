"""An environment served by worker processes on loopback, so that a slow,
hanging or crashing environment never stalls or takes down the trainer.

Each worker is a process of its own (started fresh, `spawn`) that builds the
environment once and serves it on a socket bound to 127.0.0.1 with an
authentication key (`multiprocessing.connection`: pickled requests over an
authenticated connection). The trainer holds one connection per worker; a
rollout's state lives in the worker that reset it, and its steps go there.

    reset(sample) -> ("ok", state id)    step(id, reply) -> ("ok", EnvStep)
    close(id) -> ("ok", None)            any failure -> ("error", kind, message)

A request that gets no answer within the entry's ``step_timeout_s`` (or
``env.step_timeout_s``) kills its worker; one whose worker died is a
"crashed" failure. Either way every conversation living in that worker ends
(scored 0, counted), a fresh worker takes its place at the next reset
(after three failed starts in a row, new conversations fail at once), and
the step goes on. A worker's requests are served one at a time; several
workers serve a batch's conversations side by side (a CPU-bound
environment gets real parallelism, which threads under the GIL do not give).
"""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing as mp
import os
import secrets
import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from thinkrl.envs.base import EnvError, checked_step
from thinkrl.envs.classes import import_class, make_environment
from thinkrl.envs.verl_interaction import is_verl_interaction
from thinkrl.errors import UserError
from thinkrl.records import Sample

log = logging.getLogger(__name__)
_START_TIMEOUT_S = 120.0
"""A worker must build its environment and listen within this."""
_MAX_FAILED_STARTS = 3
"""Replacement workers in a row that fail to start before new conversations stop trying."""


@dataclass(frozen=True)
class _ServedState:
    worker: "_Worker"
    """The worker process that holds the state (a replaced one lost it)."""
    state_id: int


class _Worker:
    def __init__(self, entry, *, ctx, authkey: bytes, index: int, timeout_s: float) -> None:
        here, there = ctx.Pipe(duplex=False)
        self.index = index
        self.process = ctx.Process(target=serve, args=(entry.class_name, entry.config, entry.name,
                                                       entry.where, timeout_s, authkey, there),
                                   daemon=True, name=f"env-{entry.name}-{index}")
        self.process.start()
        there.close()
        try:
            if not here.poll(_START_TIMEOUT_S):
                raise UserError(f"{entry.where}: the environment's worker process did not start "
                                 f"within {_START_TIMEOUT_S:g} s")
            status, value = here.recv()
            if status != "ok":
                raise UserError(f"{entry.where}: {value}")
            self.conn: Connection = Client(value, authkey=authkey)
        except (EOFError, OSError) as err:
            self.kill()
            raise UserError(f"{entry.where}: the environment's worker process exited while starting "
                             f"(exit code {self.process.exitcode}; {type(err).__name__})") from None
        except BaseException:
            self.kill()
            raise
        finally:
            here.close()
        self.lock = threading.Lock()
        self.alive = True

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()


class ServedEnvironment:
    """The `Environment` of an interaction-file entry with ``workers: N``."""

    def __init__(self, entry, *, default_timeout_s: float, concurrency: int) -> None:
        self.entry = entry
        self.timeout_s = entry.step_timeout_s or default_timeout_s
        # At most `concurrency` calls wait on `workers` workers served one at a time: the
        # loop's outer deadline covers that queue; each call's own is `timeout_s`.
        self.deadline_s = self.timeout_s * math.ceil(concurrency / entry.workers) + 5.0
        self.tool_turns = is_verl_interaction(import_class(entry.class_name, where=entry.where))
        self._ctx = mp.get_context("spawn")
        self._authkey = secrets.token_bytes(32)
        self._workers: list[_Worker | None] = [None] * entry.workers
        self._failed_starts = 0
        self._next = itertools.cycle(range(entry.workers))
        self._lock = threading.Lock()
        self._workers[0] = self._start(0)  # a broken environment fails the run at start
        try:
            self.scores = bool(self._request(_ServedState(self._workers[0], -1), ("scores",), kind="start"))
        except EnvError as err:
            self.shutdown()
            raise UserError(f"{entry.where}: {err}") from None

    def _start(self, index: int) -> _Worker:
        return _Worker(self.entry, ctx=self._ctx, authkey=self._authkey, index=index, timeout_s=self.timeout_s)

    def reset(self, sample: Sample) -> _ServedState:
        with self._lock:
            index = next(self._next)
            worker = self._workers[index]
            if worker is None:
                if self._failed_starts >= _MAX_FAILED_STARTS:
                    raise EnvError("crashed", f"{self.entry.name}: {self._failed_starts} worker processes in a "
                                              "row failed to start; no new conversation can start")
                try:
                    worker = self._workers[index] = self._start(index)
                    self._failed_starts = 0
                except ValueError as err:
                    self._failed_starts += 1
                    raise EnvError("crashed", str(err)) from None
        return _ServedState(worker, self._request(_ServedState(worker, -1), ("reset", sample), kind="reset"))

    def step(self, state: _ServedState, reply: str):
        return checked_step(self._request(state, ("step", state.state_id, reply), kind="step"))

    def close(self, state: _ServedState) -> None:
        self._request(state, ("close", state.state_id), kind="close")

    def _request(self, state: _ServedState, message: tuple, *, kind: str) -> Any:
        worker = state.worker
        with worker.lock:
            if not worker.alive:
                raise EnvError("crashed", f"{self.entry.name}: the worker process that held this "
                                          "conversation was stopped")
            try:
                worker.conn.send(message)
                if not worker.conn.poll(self.timeout_s):
                    self._replace(worker, f"no answer to {kind} within {self.timeout_s:g} s")
                    raise EnvError("timeout", f"{self.entry.name}: no answer to {kind} within "
                                              f"{self.timeout_s:g} s; its worker process was stopped")
                reply = worker.conn.recv()
            except (EOFError, OSError) as err:
                self._replace(worker, type(err).__name__)
                raise EnvError("crashed", f"{self.entry.name}: its worker process exited "
                                          f"(exit code {worker.process.exitcode})") from None
        if reply[0] == "error":
            raise EnvError(reply[1], f"{self.entry.name}: {reply[2]}")
        return reply[1]

    def _replace(self, worker: _Worker, why: str) -> None:
        """Stop `worker` (its lock is held); its conversations are lost, a new
        worker starts at the next reset."""
        worker.alive = False
        worker.kill()
        with self._lock:
            if self._workers[worker.index] is worker:
                self._workers[worker.index] = None
        log.warning("environment %s: worker %d stopped (%s); its conversations end, scored 0",
                    self.entry.name, worker.index, why)

    def shutdown(self) -> None:
        for worker in self._workers:
            if worker is not None:
                worker.alive = False
                worker.kill()


def serve(class_name: str, config: dict, name: str, where: str, timeout_s: float, authkey: bytes,
          report: Connection) -> None:
    """A worker's main: build the environment, listen on 127.0.0.1, answer
    requests one at a time until the trainer goes away."""
    try:
        env = make_environment(class_name, config, name=name, where=where, timeout_s=timeout_s)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
    except Exception as err:  # reported to the trainer, which stops the run at start
        report.send(("error", f"{type(err).__name__}: {err}"))
        return
    report.send(("ok", listener.address))
    conn = listener.accept()
    listener.close()
    states: dict[int, Any] = {}
    ids = itertools.count()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the trainer is gone
        try:
            if request[0] == "scores":
                answer = bool(env.scores)
            elif request[0] == "reset":
                state_id = next(ids)
                states[state_id] = env.reset(request[1])
                answer = state_id
            elif request[0] == "step":
                answer = env.step(states[request[1]], request[2])
            else:
                answer = env.close(states.pop(request[1]))
            conn.send(("ok", answer))
        except EnvError as err:
            conn.send(("error", err.kind, str(err)))
        except Exception as err:  # the environment's failure is that conversation's
            conn.send(("error", "raised", f"{type(err).__name__}: {err}"))
