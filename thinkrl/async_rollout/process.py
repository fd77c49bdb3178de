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


def _serve(conn, spec: RankSpec, chunk_tokens: int, threads: int) -> None:
    """The process's main loop (spawned)."""
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
    except BaseException:  # a failed start (a missing model folder...): the driver shows why
        _send(conn, (0, False, traceback.format_exc()))
        return
    try:
        _send(conn, (0, True, os.getpid()))
        while handle(inbox.popleft() if inbox else _recv(conn)):
            pass
    except (EOFError, ConnectionError, KeyboardInterrupt):
        return  # the driver is gone


class RolloutProcess:
    """The driver's handle on the rollout process.

    Two threads move the messages, so that neither side ever blocks on the
    other: the sender writes requests as the process reads them (a weight
    load waits there, not in the trainer, while the process decodes), the
    receiver reads every reply as soon as it is written (a process sending
    a batch of responses never waits for the trainer)."""

    def __init__(self, spec: RankSpec, *, chunk_tokens: int, threads: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        context = mp.get_context("spawn")
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, spec, chunk_tokens, threads),
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
