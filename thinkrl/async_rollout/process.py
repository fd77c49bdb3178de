"""The rollout process: a thin shell around `RolloutServer`, and the driver's
client for it.

One pipe carries requests in order (generate, load weights, generator state)
and their replies, pickled by value (`_send`, `_recv`: torch's shared-memory
tensor passing would leave segments and a resource-sharer thread behind
when either side dies). The server handles them one at a time; under partial
rollout it also applies the weight loads that arrive while it decodes
(`RolloutServer.generate`'s `apply_pending`), ahead of requests queued
before them. The client matches replies to requests by id; every wait has a
deadline (`trainer.ray_wait_timeout_s`) and notices a process that died.

Under streaming rollout (`StreamEngine` built at start) the process decodes
on its own between messages (`_stream`): a "take" is answered by the next
batch the engine emits, a "load" once the engine has applied it.

The process dies with the driver: it exits when its end of the pipe closes
(the driver exited or was killed), and `close` stops it (then kills it).
It ignores SIGINT: a Ctrl-C reaches the whole process group, and the driver,
which handles it, closes the rollout process itself.
"""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp

from thinkrl.errors import WorkerFailed
from thinkrl.workers.policy_rank import RankSpec

_POLL_S = 1.0  # how often a waiting client looks at the process's health


def _send(conn, message) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())


def _serve(conn, spec: RankSpec, chunk_tokens: int, threads: int, stream=None) -> None:
    """The process's main loop (spawned). `stream` (`StreamArgs`): streaming
    rollout's loop (`_stream`) instead of one request at a time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads:
        torch.set_num_threads(threads)
    from thinkrl.async_rollout.server import RolloutServer
    inbox: collections.deque = collections.deque()

    def reply(request_id: int, call) -> None:
        try:
            result = call()
        except BaseException:  # the driver raises it with this process's traceback
            _send(conn, (request_id, False, traceback.format_exc()))
        else:
            _send(conn, (request_id, True, result))

    def pending() -> bool:
        """Has a weight load arrived (while decoding)?"""
        while conn.poll():
            inbox.append(_recv(conn))
        return any(m[1] == "load" for m in inbox)

    def apply_pending() -> None:
        """Weight loads that arrived while decoding, ahead of other requests."""
        pending()
        for message in [m for m in inbox if m[1] == "load"]:
            inbox.remove(message)
            handle(message)

    def handle(message) -> bool:
        request_id, kind, args = message
        if kind == "close":
            _send(conn, (request_id, True, None))
            return False
        if kind == "generate":
            reply(request_id, lambda: server.generate(*args, apply_pending=apply_pending,
                                                      pending=pending))
        else:
            reply(request_id, lambda: getattr(server, kind)(*args))
        return True

    try:
        server = RolloutServer(spec, chunk_tokens=chunk_tokens)
        if stream is not None:
            from thinkrl.async_rollout.stream import StreamEngine
            engine = StreamEngine(server.engine, stream.loader, stream.params, stream.schedule,
                                  slots=stream.slots, partial=stream.partial, seed=stream.seed)
    except BaseException:  # a failed start (a missing model folder...): the driver shows why
        _send(conn, (0, False, traceback.format_exc()))
        return
    try:
        _send(conn, (0, True, os.getpid()))
        if stream is not None:
            return _stream(conn, server, engine, reply)
        while handle(inbox.popleft() if inbox else _recv(conn)):
            pass
    except (EOFError, ConnectionError, KeyboardInterrupt):
        return  # the driver is gone


def _stream(conn, server, engine, reply) -> None:
    """Streaming rollout's loop: decode (`StreamEngine.tick`) while the
    schedule allows, reading the driver's messages between two ticks, and
    block on the pipe only when the engine waits for weights. A "take" is
    answered by the next emitted batch, a "load" when its weights are
    applied (with the served weights' digests), a "snapshot" at once (the
    engine's state between two ticks: `thinkrl.async_rollout.stream_state`).
    After a failure every request gets it."""
    from thinkrl.async_rollout.stream_state import restore, snapshot

    loads: dict[int, int] = {}  # version -> the request id of its load
    takes: collections.deque = collections.deque()
    failure: list[str] = []

    def answer(request_id: int, value) -> None:
        _send(conn, (request_id, False, failure[0]) if failure else (request_id, True, value))

    def restored(state: dict, held_weights) -> object:
        restore(engine, state, held_weights)
        return server.served()

    def handle(message) -> bool:
        request_id, kind, payload = message
        if kind == "close":
            _send(conn, (request_id, True, None))
            return False
        if kind == "load":
            version, weights = payload
            loads[version] = request_id
            engine.offer(version, weights)
        elif kind == "take":
            takes.append(request_id)
        elif kind == "snapshot":  # never of an engine a failed tick left half-updated
            if failure:
                answer(request_id, None)
            else:
                reply(request_id, lambda: snapshot(engine, trainer_version=payload[0]))
        elif kind == "restore":
            reply(request_id, lambda: restored(*payload))
        else:
            reply(request_id, lambda: getattr(server, kind)(*payload))
        return True

    def hand_over() -> None:
        while takes and (failure or engine.ready):
            answer(takes.popleft(), None if failure else engine.take_ready())

    blocked = False
    while True:
        while blocked or conn.poll() or (failure and not takes and not loads):
            if not handle(_recv(conn)):
                return
            blocked = False
        hand_over()  # before the tick, which may wait for a load
        applied = []
        if not failure:
            try:
                blocked = not engine.tick()
                applied = [(v, server.served()) for v in loads if v <= engine.version]
            except BaseException:  # answered to every request from now on
                failure.append(traceback.format_exc())
        for version, served in applied if not failure else [(v, None) for v in loads]:
            answer(loads.pop(version), served)
        hand_over()


class RolloutProcess:
    """The driver's handle on the rollout process.

    Two threads move the messages, so that neither side ever blocks on the
    other: the sender writes requests as the process reads them (a weight
    load waits there, not in the trainer, while the process decodes), the
    receiver reads every reply as soon as it is written (a process sending
    a batch of responses never waits for the trainer)."""

    def __init__(self, spec: RankSpec, *, chunk_tokens: int, threads: int, timeout_s: float,
                 stream=None) -> None:
        self.timeout_s = timeout_s
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, spec, chunk_tokens, threads, stream),
                                       name="thinkrl-rollout", daemon=True)
        self.process.start()
        child.close()
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple[bool, Any]] = {}
        self._kinds: dict[int, str] = {0: "start (loading the model)"}
        self._outbox: queue.Queue = queue.Queue()
        self._inbox: queue.Queue = queue.Queue()
        threading.Thread(target=self._send_loop, name="thinkrl-rollout-send", daemon=True).start()
        threading.Thread(target=self._recv_loop, name="thinkrl-rollout-recv", daemon=True).start()
        self.wait(0)

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                _send(self._conn, message)
            except OSError:  # the process's end closed: it died (the receiver reports it)
                return

    def _recv_loop(self) -> None:
        while True:
            try:
                self._inbox.put(_recv(self._conn))
            except (EOFError, OSError):
                self._inbox.put(None)  # the pipe closed: the process is gone
                return

    def submit(self, kind: str, *args) -> int:
        """Queue a request (sent in order by the sender thread); its id, for `wait`."""
        request_id = next(self._ids)
        self._kinds[request_id] = kind if kind != "load" else f"weight load of policy version {args[0]}"
        self._outbox.put((request_id, kind, args))
        return request_id

    def wait(self, request_id: int, *, on_reply=None, eager=()):
        """The reply to `request_id`. Replies to other requests that arrive
        first are kept for their own `wait`, except those in `eager`: given to
        `on_reply(id, kind, value)` at once (a failed one raises here)."""
        deadline = time.monotonic() + self.timeout_s
        for got in [i for i in self._replies if i in eager and i != request_id]:  # parked before
            on_reply(got, self._kinds[got], self._take(got))
        while request_id not in self._replies:
            if time.monotonic() > deadline:
                raise WorkerFailed(f"the rollout process (pid {self.process.pid}) did not answer "
                                   f"{self._kinds[request_id]} within trainer.ray_wait_timeout_s="
                                   f"{self.timeout_s:g} s; raise it if a rollout legitimately takes "
                                   "longer")
            try:
                reply = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                reply = ()
            if reply is None:  # the pipe closed
                self._inbox.put(None)  # for any later wait too
                self.process.join(5)
            elif reply:
                got, ok, value = reply
                self._replies[got] = (ok, value)
                if got in eager and got != request_id:
                    on_reply(got, self._kinds[got], self._take(got))
                continue
            if not self.process.is_alive():
                raise WorkerFailed(f"the rollout process (pid {self.process.pid}) died with exit "
                                   f"code {self.process.exitcode} during {self._kinds[request_id]}; "
                                   "its last output is above")
        return self._take(request_id)

    def wait_attesting(self, request_id: int, loads: dict, on_load):
        """`wait`, giving every reply to a request in `loads` (weight loads
        awaiting attestation) to `on_load(id, value)` as soon as it comes,
        the awaited request's own reply included when it is one."""
        value = self.wait(request_id, on_reply=lambda got, kind, v: on_load(got, v), eager=loads)
        if request_id in loads:
            on_load(request_id, value)
        return value

    def _take(self, request_id: int):
        ok, value = self._replies.pop(request_id)
        kind = self._kinds.pop(request_id)
        if not ok:
            raise WorkerFailed(f"the rollout process failed during {kind}:\n{value}")
        return value

    def close(self) -> None:
        """Stop the process: ask, then terminate, then kill."""
        if self.process.is_alive():  # (what is still queued there is not needed any more)
            self._outbox.put((-1, "close", ()))
            self.process.join(2)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._outbox.put(None)
        self._conn.close()
