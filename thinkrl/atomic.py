"""Replace a file all at once: a reader sees the old file or the new one,
never half of one.

Everything is written to a hidden temporary file in the target's folder (a
rename is atomic only within one file system) and renamed over the target
when complete; a failure removes the temporary file and leaves the target as
it was. `durable=True` also fsyncs the file before the rename and the folder
after it, so the new content survives a power loss (checkpoint trackers).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


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
