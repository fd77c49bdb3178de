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
(scored 0, counted), a fresh worker takes its place at the next reset, and
the step goes on. A worker's requests are served one at a time; several
workers serve a batch's conversations side by side (a CPU-bound
environment gets real parallelism, which threads under the GIL do not give).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import secrets
import threading
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from thinkrl.envs.base import EnvError, checked_step
from thinkrl.records import Sample

log = logging.getLogger(__name__)
_START_TIMEOUT_S = 120.0
"""A worker must build its environment and listen within this."""


@dataclass(frozen=True)
class _ServedState:
    worker: int
    generation: int
    """Which incarnation of that worker holds the state (a replaced worker lost it)."""
    state_id: int


class _Worker:
    def __init__(self, entry, *, ctx, authkey: bytes, index: int) -> None:
        here, there = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=serve, args=(entry.class_name, entry.config, entry.name,
                                                       entry.where, authkey, there),
                                   daemon=True, name=f"env-{entry.name}-{index}")
        self.process.start()
        there.close()
        if not here.poll(_START_TIMEOUT_S):
            self.kill()
            raise ValueError(f"{entry.where}: the environment's worker process did not start "
                             f"within {_START_TIMEOUT_S:g} s")
        status, value = here.recv()
        if status != "ok":
            self.kill()
            raise ValueError(f"{entry.where}: {value}")
        self.conn: Connection = Client(value, authkey=authkey)
        self.lock = threading.Lock()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)


class ServedEnvironment:
    """The `Environment` of an interaction-file entry with ``workers: N``."""

    def __init__(self, entry, *, default_timeout_s: float = 60.0) -> None:
        self.entry = entry
        self.timeout_s = entry.step_timeout_s or default_timeout_s
        self.deadline_s = 2 * self.timeout_s + 5.0
        """The loop's outer deadline: this environment stops its own calls at
        `timeout_s` (killing the worker); the outer one only bounds queueing."""
        self._ctx = mp.get_context("spawn")
        self._authkey = secrets.token_bytes(32)
        self._workers: list[_Worker | None] = [None] * entry.workers
        self._generations = [0] * entry.workers
        self._next = itertools.cycle(range(entry.workers))
        self._lock = threading.Lock()
        self._workers[0] = self._start(0)  # a broken environment fails the run at start
        self.scores = self._request(_ServedState(0, 0, -1), ("scores",), kind="reset")

    def _start(self, index: int) -> _Worker:
        return _Worker(self.entry, ctx=self._ctx, authkey=self._authkey, index=index)

    def reset(self, sample: Sample) -> _ServedState:
        with self._lock:
            index = next(self._next)
            if self._workers[index] is None:
                self._workers[index] = self._start(index)
                self._generations[index] += 1
            generation = self._generations[index]
        state_id = self._request(_ServedState(index, generation, -1), ("reset", sample), kind="reset")
        return _ServedState(index, generation, state_id)

    def step(self, state: _ServedState, reply: str):
        return checked_step(self._request(state, ("step", state.state_id, reply), kind="step"))

    def close(self, state: _ServedState) -> None:
        self._request(state, ("close", state.state_id), kind="close")

    def _request(self, state: _ServedState, message: tuple, *, kind: str) -> Any:
        worker = self._workers[state.worker]
        if worker is None or self._generations[state.worker] != state.generation:
            raise EnvError("crashed", f"{self.entry.name}: the worker process that held this "
                                      "conversation was replaced")
        with worker.lock:
            try:
                worker.conn.send(message)
                if not worker.conn.poll(self.timeout_s):
                    self._replace(state.worker, worker, f"no answer to {kind} within {self.timeout_s:g} s")
                    raise EnvError("timeout", f"{self.entry.name}: no answer to {kind} within "
                                              f"{self.timeout_s:g} s; its worker process was stopped")
                reply = worker.conn.recv()
            except (EOFError, OSError, BrokenPipeError) as err:
                self._replace(state.worker, worker, f"{type(err).__name__}")
                raise EnvError("crashed", f"{self.entry.name}: its worker process exited "
                                          f"(exit code {worker.process.exitcode})") from None
        if reply[0] == "error":
            raise EnvError(reply[1], f"{self.entry.name}: {reply[2]}")
        return reply[1]

    def _replace(self, index: int, worker: _Worker, why: str) -> None:
        """Stop `worker`; its conversations are lost, a new one starts at the next reset."""
        worker.kill()
        with self._lock:
            if self._workers[index] is worker:
                self._workers[index] = None
        log.warning("environment %s: worker %d stopped (%s); its conversations end, scored 0",
                    self.entry.name, index, why)

    def shutdown(self) -> None:
        for worker in self._workers:
            if worker is not None:
                worker.kill()


def serve(class_name: str, config: dict, name: str, where: str, authkey: bytes, report: Connection) -> None:
    """A worker's main: build the environment, listen on 127.0.0.1, answer
    requests one at a time until the trainer goes away."""
    from thinkrl.envs.classes import make_environment

    try:
        env = make_environment(class_name, config, name=name, where=where)
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
