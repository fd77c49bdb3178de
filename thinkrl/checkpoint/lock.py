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

The run directory itself is flocked too: deleting `thinkrl.lock` under a
live run (to "unstick" it) would otherwise let a second run create a new
file and lock that; the directory cannot be swapped under a live run.

A lock file whose flock is free but whose content names a holder is one a
run left behind without releasing (killed, crashed, power loss): it is taken
over with a note. The file is never deleted (a run that opened the old file
and one that created a new one could both hold "the" lock); releasing
empties it.

A record of another host is different: a file system shared between
machines (NFS) may not carry flocks from one to the other, so a free flock
proves nothing there. A live run touches its lock file every `HEARTBEAT_S`;
another host's record whose file was touched within `STALE_AFTER_S` is a
live run and refused; an older one is a run that died, taken over with a note.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

from thinkrl.errors import SetupError

LOCK_FILE = "thinkrl.lock"
HEARTBEAT_S = 30.0
"""How often a live run touches its lock file: the sign of life another host goes by."""
STALE_AFTER_S = 600.0
"""Another host's record whose file was not touched for this long belongs to a dead run."""

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

    def __init__(self, run_dir: Path, fd: int, dir_fd: int) -> None:
        self.run_dir, self._fd, self._dir_fd = run_dir, fd, dir_fd
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="thinkrl-lock-heartbeat",
                                           daemon=True)
        self._heartbeat.start()

    @classmethod
    def acquire(cls, run_dir: str | Path, *, log=print) -> "RunLock":
        """Create `run_dir` and lock it, or raise SetupError naming the holder.

        A free flock means no live holder on this host (the kernel drops the
        lock of a dead process), so a record left in the file is a run that
        died: it is taken over with a note. Another host's record is judged
        by its heartbeat (see the module docstring)."""
        global _last_locked
        run_dir = Path(run_dir).expanduser().resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        # Neither descriptor is inherited by child processes (Python's default).
        dir_fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
        fd = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            dir_free, file_free = _try_lock(dir_fd), _try_lock(fd)
            if not (dir_free and file_free):
                raise _in_use(run_dir, _read_holder(fd), file_locked=not file_free)
            previous = _read_holder(fd)
            if previous and previous.get("host") not in (None, socket.gethostname()):
                silent = time.time() - os.fstat(fd).st_mtime
                if silent < STALE_AFTER_S:
                    raise _in_use(run_dir, previous, file_locked=True, silent_s=silent)
                log(f"note: taking over {path} from a run on another host ({describe(previous)}); "
                    f"it gave no sign of life for {_ago(silent)} (a live run touches the file "
                    f"every {HEARTBEAT_S:.0f} s)")
            elif previous:
                log(f"note: taking over {path}: the run that held it ({describe(previous)}) "
                    "ended without releasing it (killed or crashed)")
            _write_holder(fd)
        except BaseException:
            for opened in (fd, dir_fd):  # closing drops the flock
                if opened is not None:
                    os.close(opened)
            raise
        _last_locked = run_dir
        return cls(run_dir, fd, dir_fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _beat(self) -> None:
        """Touch the lock file every HEARTBEAT_S until released."""
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self._fd)
            except OSError:  # a full or read-only disk: the next beat tries again
                pass

    def release(self) -> None:
        """Empty the lock file and drop the lock; safe to call twice."""
        if self._fd is None:
            return
        self._stop.set()
        self._heartbeat.join(timeout=5)
        try:
            os.ftruncate(self._fd, 0)  # an empty file: released cleanly, no takeover note
        except OSError:
            pass  # a full or read-only disk: closing still frees the lock
        os.close(self._fd)
        os.close(self._dir_fd)
        self._fd = self._dir_fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    """Take the exclusive flock of `fd` if free; whether it was."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _in_use(run_dir: Path, holder: dict | None, *, file_locked: bool,
            silent_s: float | None = None) -> SetupError:
    """The refusal: who holds `run_dir`, as far as its lock file tells."""
    if file_locked:
        who = describe(holder)
    else:  # the directory is locked but its lock file is not: the file was deleted
        who = (f"its {LOCK_FILE} was deleted while it ran, so which run it is is not known; "
               "look for a thinkrl process with this folder")
    if silent_s is not None:
        who += (f"; last sign of life {_ago(silent_s)} ago, from another host, whose lock this "
                "file system may not show here")
    fix = _how_to_proceed(run_dir)
    if silent_s is not None:
        fix += (f"; if that run is dead, delete {run_dir / LOCK_FILE}, or wait until it has "
                f"been silent for {_ago(STALE_AFTER_S)}")
    return SetupError(f"{run_dir} is in use by another thinkrl run ({who}); two runs in one "
                      "folder overwrite each other's checkpoints and metrics", fix)


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
