"""One run per run directory: an exclusive lock taken before anything is written.

Two runs writing one folder corrupt each other without an error: every step
twice in `metrics.jsonl`, each replacing the other's `global_step_N` and
`config.yaml`, and a starting run deleting the save a live one is writing.
The default folder `runs/<project>/<experiment>` makes this the easy case
(launch the same recipe twice), so a run holds

    <run dir>/thinkrl.lock      {"pid", "host", "started", "command"} of the holder

with `fcntl.flock(LOCK_EX | LOCK_NB)` for as long as it runs. flock, not
POSIX record locks: the kernel drops it when the process dies (kill -9
included), and two opens of the file conflict even inside one process, so
two runs started from one Python session are refused too.

A lock file whose flock is free but whose content names a holder is one a
run left behind without releasing (killed, crashed, power loss): it is taken
over with a note. The file is never deleted (a run that opened the old file
and one that created a new one could both hold "the" lock); releasing
empties it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from thinkrl.errors import SetupError

LOCK_FILE = "thinkrl.lock"

_last_locked: Path | None = None


def last_locked_run_dir() -> Path | None:
    """The run directory this process locked last (held now or released):
    where an unexpected error's traceback is written (`error.log`)."""
    return _last_locked


def forget_last_locked() -> None:
    """Start of a command: a run directory locked by an earlier command of
    this process (tests, notebooks) is not this command's."""
    global _last_locked
    _last_locked = None


class RunLock:
    """The exclusive lock of one run directory; `release()` (idempotent) frees it."""

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self._fd = run_dir, fd

    @classmethod
    def acquire(cls, run_dir: str | Path, *, log=print) -> "RunLock":
        """Create `run_dir` and lock it, or raise SetupError naming the holder.

        A free flock means no live holder on this host (the kernel drops the
        lock of a dead process), so a record left in the file is a run that
        died: it is taken over with a note."""
        global _last_locked
        run_dir = Path(run_dir).expanduser().resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise SetupError(f"{run_dir} is in use by another thinkrl run ({describe(holder)}); two "
                             "runs in one folder overwrite each other's checkpoints and metrics",
                             _how_to_proceed(run_dir)) from None
        try:
            previous = _read_holder(fd)
            if previous and previous.get("host") not in (None, socket.gethostname()):
                log(f"note: taking over {path} from a run on another host ({describe(previous)}); "
                    "if it still runs, stop one of the two: this file system may not share "
                    "locks between machines")
            elif previous:
                log(f"note: taking over {path}: the run that held it ({describe(previous)}) "
                    "ended without releasing it (killed or crashed)")
            _write_holder(fd)
        except BaseException:
            os.close(fd)  # closing drops the flock
            raise
        _last_locked = run_dir
        return cls(run_dir, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the lock file and drop the lock; safe to call twice."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)  # an empty file: released cleanly, no takeover note
        except OSError:
            pass  # a full or read-only disk: closing still frees the lock
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def describe(holder: dict | None) -> str:
    """'pid 123 on host h, started 2026-01-01 10:00:00 (5 min ago)' or what is known."""
    if not holder:
        return "details not written yet: it started a moment ago"
    parts = [f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"]
    started = holder.get("started")
    if isinstance(started, (int, float)):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        parts.append(f"started {stamp} ({_ago(time.time() - started)} ago)")
    if holder.get("command"):
        parts.append(f"command: {holder['command']}")
    return ", ".join(parts)


def _how_to_proceed(run_dir: Path) -> str:
    return (f"wait for that run to finish (or stop it), or give this run its own folder: "
            f"trainer.experiment_name=<another name> (or trainer.default_local_dir=<folder>, "
            f"now {run_dir})")


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _read_holder(fd: int) -> dict | None:
    """The holder recorded in the lock file; None when empty or unreadable
    (a holder that locked but has not written yet)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    try:
        holder = json.loads(data.decode()) if data.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _write_holder(fd: int) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(["thinkrl", *sys.argv[1:]]) if sys.argv else ""}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(record) + "\n").encode())
    os.fsync(fd)


def pid_alive(pid: object) -> bool:
    """Whether a process of this pid runs on this host (pids are reused, so
    this errs towards 'alive')."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
