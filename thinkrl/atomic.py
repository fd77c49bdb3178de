"""Replace a file all at once: a reader sees the old file or the new one,
never half of one.

Everything is written to a hidden temporary file in the target's folder (a
rename is atomic only within one file system) and renamed over the target
when complete; a failure removes the temporary file and leaves the target as
it was. `durable=True` also fsyncs the file before the rename and the folder
after it, so the new content survives a power loss (checkpoint trackers).
`build_once` does the same for a whole folder that several processes may
ask for at once (the built-in models and data sets).
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def atomic_path(path: str | Path, *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to `path` to write to (creating the
    folder); on a clean exit it replaces `path`, on an error it is removed and
    the error propagates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str, *, durable: bool = False) -> Path:
    """Write `text` (UTF-8) to `path` through `atomic_path`; returns `path`."""
    with atomic_path(path, durable=durable) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def build_once(folder: str | Path, make: Callable[[Path], None], *, done: str, log=print) -> Path:
    """`folder`, made by `make(tmp)` in a temporary folder beside it and
    renamed into place, unless `folder/done` exists already. One process at
    a time builds it (an exclusive lock on a file beside it): another that
    asks meanwhile waits, then finds it made, so two runs started from an
    empty cache both get the same folder. A folder without `done` (a build
    from before this lock that stopped half-way) is replaced, and the
    temporary folders of killed builds are removed. `make` may log the
    temporary path: callers name `folder` in their own lines."""
    folder = Path(folder)
    if (folder / done).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process that is making {folder} ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / done).exists():  # the other process made it
            return folder
        for stale in folder.parent.glob(f".{folder.name}.tmp-*"):  # of builds that were killed
            shutil.rmtree(stale, ignore_errors=True)
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        try:
            make(tmp)
            if not (tmp / done).exists():
                raise RuntimeError(f"making {folder} wrote no {done}")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
