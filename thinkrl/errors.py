"""An error a user can fix, with what is wrong and what to do kept apart.

Its message is both ("problem; fix"), so code that only prints it loses
nothing; `thinkrl doctor` shows them in separate columns without parsing
text. A ValueError, so every caller that handles user mistakes handles it.
"""

from __future__ import annotations

import difflib
import errno
from pathlib import Path


class UserError(ValueError):
    """A mistake the user fixes (config, data, files, installation, a
    checkpoint that does not fit the run); the message says what and how.
    `thinkrl COMMAND` reports it as such (exit 2). Any other exception
    reaching a command, a ValueError of thinkrl's own included, is a bug:
    a traceback in error.log and the resume line (`thinkrl.exits`)."""


class SetupError(UserError):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix

    def __reduce__(self):  # pickled whole (it crosses from Ray workers to the driver)
        return type(self), (self.problem, self.fix)


def problem_and_fix(err: Exception, *, default_fix: str = "see the message") -> tuple[str, str]:
    """(problem, fix) of any error: a SetupError's own parts, else the whole message."""
    if isinstance(err, SetupError):
        return err.problem, err.fix
    return str(err), default_fix


class RunStopped(RuntimeError):
    """The run stopped itself on purpose (a guard fired: destroyed weights,
    failing rewards). Its message says why, what is kept on disk and how to
    go on; the command line prints it without a traceback and exits 1."""


class WorkerFailed(RuntimeError):
    """A rank of the ray backend died, raised, or missed its deadline; the
    message says which, where, during what, and the rank's last log lines."""


class DiskFull(SetupError):
    """A write failed because the disk is full; names the folder, its free
    space and the space needed."""


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left", "StorageFull", "Disk quota exceeded")
_WRITE_FAILED_TEXT = "file write failed"  # torch.save's words for any failed write, without a cause
NEARLY_FULL_BYTES = 64 * 2**20


def is_disk_full(error: BaseException, *, folder: Path | None = None) -> bool:
    """ENOSPC/EDQUOT anywhere in the cause chain, or a writer (safetensors)
    that says so only in its message. torch.save reports every failed write
    as "file write failed": that counts as a full disk only when `folder`,
    where it wrote, is known and has less than NEARLY_FULL_BYTES free (a
    read-only or unwritable folder fails with the same words)."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(seen) for text in _DISK_FULL_TEXT):
            return True
        if _WRITE_FAILED_TEXT in str(seen) and folder is not None:
            return free_bytes(folder) < NEARLY_FULL_BYTES
        seen = seen.__cause__ or seen.__context__
    return False


def is_failed_write(error: BaseException) -> bool:
    """A write refused for another reason than space (a read-only or
    unwritable folder), as the writers report it."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return True
        if _WRITE_FAILED_TEXT in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def free_bytes(folder: Path) -> int:
    """Free space on the disk of `folder` (its nearest existing parent); 0 when unreadable."""
    import shutil

    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


def nearest_files(path: Path) -> str:
    """' Nearest existing files in F: ...' from the deepest folder of `path`
    that exists (for error messages about a path that does not)."""
    folder = path.parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return ""
    names = sorted(p.name for p in folder.iterdir())
    close = difflib.get_close_matches(path.name, names, n=5, cutoff=0.3) or names[:5]
    if not close:
        return f" The folder {folder} is empty."
    return f" Nearest existing files in {folder}: {', '.join(close)}."
