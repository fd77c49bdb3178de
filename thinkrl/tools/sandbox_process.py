"""Running one sandbox call's process: its output read through pipes with a
cap (nothing the code writes lands on the host's disk), its exit awaited on
a pidfd up to the wall-clock deadline (no polling), and everything it
started killed before it is reaped."""

from __future__ import annotations

import json
import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from thinkrl.tools.call_cgroup import CallCgroup

_GRACE_S = 0.5
"""After the process exits, how long its pipes may stay open (a leftover
holding them, without the jail) before they are read no more."""


@dataclass
class Launch:
    """How to start one call."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    info_fd: int | None = None
    """Read end of bwrap's --info-fd (the sandbox's PID 1, killed first at a time-out)."""


@dataclass
class Finished:
    status: int | None
    """The exit status; None when the call ran past its deadline."""
    stdout: str
    stderr: str


def run_contained(launch: Launch, *, wall_s: float, output_chars: int, cgroup: CallCgroup | None) -> Finished:
    argv = cgroup.wrap(launch.argv) if cgroup is not None else launch.argv
    # stdin: an empty pipe of its own, not the host's /dev/null (whose mode a root host uid could change)
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=launch.cwd, env=launch.env, pass_fds=launch.pass_fds,
                               start_new_session=True)
    process.stdin.close()
    cap = output_chars * 4  # bytes: up to 4 per character
    head, tail = _Head(cap), _Tail(cap)
    pidfd, exited = None, False
    try:
        pidfd = os.pidfd_open(process.pid)
        exited = _read_until_exit(pidfd, {process.stdout.fileno(): head, process.stderr.fileno(): tail}, wall_s)
    finally:
        try:
            _kill_everything(process, pidfd, launch.info_fd, cgroup)
        finally:
            if pidfd is not None:
                os.close(pidfd)
            status = process.wait()
            process.stdout.close()
            process.stderr.close()
    return Finished(status if exited else None, head.text(output_chars), tail.text(output_chars))


class _Head:
    def __init__(self, cap: int) -> None:
        self.cap, self.data, self.more = cap, bytearray(), False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        self.data += chunk[:room]
        self.more |= len(chunk) > room

    def text(self, chars: int) -> str:
        text = self.data.decode("utf-8", "replace")
        return text[:chars] + ("...(truncated)" if self.more or len(text) > chars else "")


class _Tail:
    def __init__(self, cap: int) -> None:
        self.cap, self.data = cap, bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        del self.data[:-self.cap]

    def text(self, chars: int) -> str:
        return self.data.decode("utf-8", "replace")[-chars:]


def _read_until_exit(pidfd: int, sinks: dict, wall_s: float) -> bool:
    """Reads the pipes into their sinks until the process (`pidfd`) has exited
    and the pipes are closed; False when the deadline came first."""
    deadline = time.monotonic() + wall_s
    exited_at = None
    with selectors.DefaultSelector() as selector:
        selector.register(pidfd, selectors.EVENT_READ)
        for fd in sinks:
            selector.register(fd, selectors.EVENT_READ)
        while sinks or exited_at is None:
            now = time.monotonic()
            end = deadline if exited_at is None else min(deadline, exited_at + _GRACE_S)
            if now >= end:
                break
            for key, _ in selector.select(end - now):
                if key.fd == pidfd:
                    selector.unregister(pidfd)
                    exited_at = time.monotonic()
                    continue
                chunk = os.read(key.fd, 65536)
                if chunk:
                    sinks[key.fd].add(chunk)
                else:
                    selector.unregister(key.fd)
                    del sinks[key.fd]
    return exited_at is not None


def _kill_everything(process: subprocess.Popen, pidfd: int | None, info_fd: int | None,
                     cgroup: CallCgroup | None) -> None:
    """The sandbox's PID 1 first (its namespace dies with it and bwrap, its
    parent, reaps it: no zombie is handed to the host's init), then the
    process group and the call's cgroup. The process itself is reaped only
    after, so its id, which names the group, cannot be reused meanwhile."""
    inner = _sandbox_pid(info_fd) if info_fd is not None and pidfd is not None and not _exited(pidfd, 0) \
        else None
    if inner is not None:
        try:
            os.kill(inner, signal.SIGKILL)
            _exited(pidfd, 1.0)  # bwrap exits once its child is gone
        except ProcessLookupError:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        cgroup.kill()


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process of `pidfd` has exited, waiting up to `timeout_s`
    (poll, not select: an fd number past 1024 is fine)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


def _sandbox_pid(info_fd: int) -> int | None:
    """bwrap's --info-fd record: the host pid of the sandbox's PID 1."""
    os.set_blocking(info_fd, False)
    try:
        return int(json.loads(os.read(info_fd, 65536))["child-pid"])
    except (BlockingIOError, ValueError, KeyError, TypeError):
        return None
