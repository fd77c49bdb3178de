"""Every exit is a message: how `thinkrl COMMAND` ends when something goes wrong.

    a user mistake (UserError: thinkrl's checks of config, data, files,
    installation and checkpoints raise it, SetupError included)
        "thinkrl: error: <problem; fix>"                                   exit 2
    a guard stopped the run (RunStopped, FloatingPointError)
        "thinkrl: training stopped: <why, what is kept>" + resume line      exit 1
    the disk is full (ENOSPC / EDQUOT, or a writer's "No space left")
        the folder, its free space, the space needed + resume line          exit 1
    another OSError (permissions, a missing file)
        "thinkrl: error: <what the system said>"                            exit 1
    Ctrl-C
        what is kept on disk + the exact command that resumes              exit 130
    anything else: a bug in thinkrl
        one line naming it as a bug; the traceback goes to <run dir>/error.log,
        then the resume line                                               exit 1

Only a UserError is the user's. A ValueError raised anywhere else (inside
torch, the standard library, or an invariant of thinkrl's own) is a bug:
reporting it as a config mistake sent users hunting for a typo that was not
theirs, and left them without the line that resumes the run.
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

from thinkrl.errors import (DiskFull, RunStopped, UserError, WorkerFailed, free_bytes, is_disk_full,
                            is_failed_write)


class Terminated(BaseException):
    """SIGTERM arrived (what job schedulers send before they kill): raised in
    the main thread, so that every `finally` runs (workers stopped, the lock
    released) as for Ctrl-C. Not an Exception: nothing may swallow it."""


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_command(function: Callable, args, *, argv: list[str], err=None) -> int:
    """`function(args)` with every failure turned into a message and an exit code."""
    from thinkrl.checkpoint.lock import forget_last_locked, last_locked_run_dir

    err = err or sys.stderr
    forget_last_locked()

    def say(message: str) -> None:
        print(message, file=err, flush=True)

    try:
        with sigterm_raises():
            return function(args)
    except KeyboardInterrupt:
        say("\nthinkrl: stopped by Ctrl-C. " + kept_and_resume(argv, last_locked_run_dir()))
        return 130
    except Terminated:
        say("\nthinkrl: stopped by SIGTERM (a job scheduler's stop, or `kill`). "
            + kept_and_resume(argv, last_locked_run_dir()))
        return 143
    except (RunStopped, FloatingPointError) as stop:
        say(f"thinkrl: training stopped: {stop}")
        say(resume_line(argv, last_locked_run_dir()))
        return 1
    except WorkerFailed as failed:  # its own words, whole: rank, node, stage, log tail
        say(f"thinkrl: a worker failed: {failed}")
        say(resume_line(argv, last_locked_run_dir()))
        return 1
    except DiskFull as full:
        say(f"thinkrl: the disk is full: {full}")
        say(resume_line(argv, last_locked_run_dir()))
        return 1
    except Exception as error:  # classified below; BaseException (SystemExit) passes
        run_dir = last_locked_run_dir()
        if is_disk_full(error, folder=run_dir):
            say(f"thinkrl: the disk is full: {disk_full_message(error, folder=_written_in(error, run_dir))}")
            say(resume_line(argv, last_locked_run_dir()))
            return 1
        if is_user_error(error):
            say(f"thinkrl: error: {error}")
            return 2
        if is_failed_write(error):
            folder = _written_in(error, run_dir)
            say(f"thinkrl: error: writing in {folder or 'the run folder'} failed "
                f"({type(error).__name__}: {str(error)[:200]}), not for lack of space: the folder is "
                "read-only or not writable by this user. Make it writable, or point "
                "trainer.default_local_dir at a folder that is")
            say(resume_line(argv, run_dir))
            return 1
        if isinstance(error, OSError):
            say(f"thinkrl: error: {error}")
            return 1
        log = write_error_log(error, argv=argv, run_dir=last_locked_run_dir())
        say(f"thinkrl: internal error: this is a bug in thinkrl, not in your config or data "
            f"({type(error).__name__}: {str(error)[:300]}). The traceback is in {log}; please "
            "report it with that file.")
        say(resume_line(argv, last_locked_run_dir()))
        return 1


def is_user_error(error: BaseException) -> bool:
    """A UserError (SetupError and DamagedCheckpoint are ones): a mistake the message's fix resolves."""
    return isinstance(error, UserError)


def _written_in(error: BaseException, run_dir: Path | None) -> Path | None:
    """The folder a failed write was in: the error's file, else the run's folder."""
    filename = getattr(error, "filename", None)
    return Path(filename).parent if filename else run_dir


def disk_full_message(error: BaseException, *, folder: Path | None = None,
                      needed: int | None = None) -> str:
    """The folder, its free space, and the space needed (when known)."""
    folder = folder or _written_in(error, Path.cwd())
    free = free_bytes(folder)
    need = (f"; it needs about {_size(needed)} more there" if needed else
            "; it needs at least a few MB there to go on")
    return (f"writing in {folder} failed ({type(error).__name__}: {str(error)[:200]}): "
            f"{_size(free)} free{need}. Free space there, keep fewer checkpoints "
            "(trainer.max_actor_ckpt_to_keep) or point trainer.default_local_dir at a larger "
            "disk; `thinkrl doctor` checks the space before a run")


def write_error_log(error: BaseException, *, argv: list[str], run_dir: Path | None) -> Path:
    """Append the traceback to <run dir>/error.log (a temp file without a run dir)."""
    path = run_dir / "error.log" if run_dir is not None and run_dir.is_dir() else \
        Path(tempfile.gettempdir()) / "thinkrl-error.log"
    text = (f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} thinkrl {shlex.join(argv)}\n"
            + "".join(traceback.format_exception(error)))
    try:
        with path.open("a") as f:
            f.write(text)
    except OSError:  # no place to write: the traceback goes to the terminal instead
        print(text, file=sys.stderr)
        return Path("(the terminal above)")
    return path


def kept_and_resume(argv: list[str], run_dir: Path | None) -> str:
    """What a stopped run left on disk, and the command that continues it."""
    if run_dir is None:
        return "Nothing of a run was written yet."
    return resume_line(argv, run_dir)


def resume_line(argv: list[str], run_dir: Path | None) -> str:
    if run_dir is None or not argv or argv[0] != "train":
        return ""
    from thinkrl.checkpoint.store import latest_checkpoint

    latest = latest_checkpoint(run_dir, log=lambda *_: None)
    if latest is None:
        return (f"No checkpoint was saved in {run_dir} (none was due yet, or trainer.save_freq "
                f"<= 0): the same command starts over from step 0: thinkrl {shlex.join(argv)}")
    from thinkrl.checkpoint.resume import missing_for_resume

    if missing_for_resume(latest):
        return (f"Kept: {latest.name}, the newest checkpoint in {run_dir} (weights only: "
                f"checkpoint.save_contents), and metrics.jsonl. It cannot be resumed from; export "
                f"it with: thinkrl export {latest} --out DIR")
    return (f"Kept: {latest.name}, the newest checkpoint in {run_dir}, and metrics.jsonl. "
            f"Resume with: thinkrl {shlex.join(resume_argv(argv))}")


def resume_argv(argv: list[str]) -> list[str]:
    """`argv` made to continue from the run directory's newest checkpoint:
    trainer.resume_mode=auto (whatever the command line or recipe said) and
    no resume_from_path. A bare `thinkrl train` gets `--config tiny` too: with
    an override and no --config it would start from verl's defaults."""
    keep = [a for a in argv if not a.startswith(("trainer.resume_mode=",
                                                  "trainer.resume_from_path="))]
    if not any(a == "--config" or a.startswith("--config=") or "=" in a for a in keep[1:]):
        keep = [keep[0], "--config", "tiny", *keep[1:]]
    return [*keep, "trainer.resume_mode=auto"]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
