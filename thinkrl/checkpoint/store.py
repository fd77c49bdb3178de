"""Checkpoint folders on disk: naming, atomic writes, finding the latest, rotation.

A run directory holds

    global_step_N/                      one complete checkpoint (see thinkrl.checkpoint.state)
    global_step_N.tmp-<pid>/            a save in progress (or one that crashed): never read
    latest_checkpointed_iteration.txt   the step of the last completed save (verl's name)

A save writes everything into the `.tmp-<pid>` sibling, fsyncs it, writes the
completion marker `meta.json` last, renames the folder into place and only
then rewrites the tracker file (write a temporary file, then `os.replace`).
A crash or a full disk at any point therefore leaves either the new complete
checkpoint or the previous one as "latest", never a half-written one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from thinkrl.atomic import atomic_write_text, fsync_dir, fsync_file
from thinkrl.checkpoint.verify import FILES_KEY, MARKER, DamagedCheckpoint, file_digests, newest_intact, verify_checkpoint
from thinkrl.errors import UserError, is_disk_full

TRACKER = "latest_checkpointed_iteration.txt"
_NAME = re.compile(r"^global_step_(\d+)$")
_TMP = re.compile(r"^global_step_\d+\.tmp-")
_TMP_PID = re.compile(r"^global_step_\d+\.tmp-(\d+)")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"global_step_{step}"


def is_complete(folder: Path) -> bool:
    return folder.is_dir() and _NAME.match(folder.name) is not None and (folder / MARKER).is_file()


def step_of(folder: Path) -> int:
    match = _NAME.match(folder.name)
    if match is None:
        raise UserError(f"{folder}: not a checkpoint folder (expected a name global_step_N)")
    return int(match.group(1))


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The complete checkpoints of `run_dir`, oldest step first."""
    if not run_dir.is_dir():
        return []
    return sorted((p for p in run_dir.iterdir() if is_complete(p)), key=step_of)


def latest_checkpoint(run_dir: Path, *, log=print) -> Path | None:
    """The checkpoint the tracker file names if it is complete, else the
    newest complete one (a save may have died before the tracker moved, or the
    tracker's folder may have been deleted), else None."""
    found = complete_checkpoints(run_dir)
    tracker = run_dir / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        named = checkpoint_dir(run_dir, int(text)) if text.isdigit() else None
        if named is not None and is_complete(named):
            return named
        if found:
            log(f"{tracker} names step {text!r}, which is not a complete checkpoint; "
                f"using the newest complete one, {found[-1].name}")
    return found[-1] if found else None


def candidates_newest_first(run_dir: Path, *, log=print) -> list[Path]:
    """The complete checkpoints to try when resuming: the tracker's (or the
    newest) first, then the older ones, newest first."""
    latest = latest_checkpoint(run_dir, log=log)
    if latest is None:
        return []
    return [latest, *(p for p in reversed(complete_checkpoints(run_dir)) if p != latest)]


def resolve_checkpoint(path: str | Path, *, log=print) -> Path:
    """A `global_step_N` folder as given, or a run directory's newest intact
    one; the folder is verified (checksums, finite weights) either way."""
    path = Path(path).expanduser().resolve()
    if is_complete(path):
        try:
            verify_checkpoint(path)
        except DamagedCheckpoint as err:
            raise DamagedCheckpoint(f"{err}; {_available(path.parent)}") from None
        return path
    if _NAME.match(path.name) and path.is_dir():
        raise UserError(f"{path} is an incomplete checkpoint (no {MARKER}: its save did not "
                         f"finish); {_available(path.parent)}")
    if path.is_dir():
        candidates = candidates_newest_first(path, log=log)
        intact = newest_intact(candidates, log=log)
        if intact is not None:
            return intact
        if candidates:
            raise DamagedCheckpoint(f"{path}: every checkpoint is damaged "
                                    f"({', '.join(p.name for p in candidates)}); see the warnings above")
        raise UserError(f"{path} holds no complete checkpoint (global_step_N folder with "
                         f"{MARKER}); save one with trainer.save_freq > 0")
    raise UserError(f"checkpoint {path} does not exist; {_available(path.parent)}")


def _available(run_dir: Path) -> str:
    names = [p.name for p in complete_checkpoints(run_dir)]
    if not names:
        return f"{run_dir} holds no complete checkpoint"
    return f"complete checkpoints in {run_dir}: {', '.join(names)}"


def remove_stale_tmp(run_dir: Path, *, log=print) -> None:
    """Delete the temporary folders of saves that never finished (a crash, a
    full disk): they are never read and may be large. A folder whose writer
    (the pid in its name) is alive and not this process is kept: the run lock
    should make that impossible, so it is reported, never deleted under a
    live writer."""
    if not run_dir.is_dir():
        return
    from thinkrl.checkpoint.lock import pid_alive

    for stale in sorted(p for p in run_dir.iterdir() if _TMP.match(p.name)):
        pid = _tmp_owner(stale)
        if pid is not None and pid != os.getpid() and pid_alive(pid):
            log(f"keeping {stale.name}: process {pid}, which may be writing it, is alive")
            continue
        log(f"removing {stale.name}: an unfinished checkpoint save of an earlier run")
        shutil.rmtree(stale, ignore_errors=True)


def remove_own_unfinished_saves(run_dir: Path, *, log=print) -> None:
    """Delete the `.tmp-<pid>` folders of this process: called when a run
    closes, when no save of it can still be writing. A stop (Ctrl-C, SIGTERM)
    raised between `atomic_checkpoint` making its folder and the `with` block
    starting skips the block's cleanup until the generator is finalised,
    which a reference still held to it can delay past the exit.
    A folder holding the completion marker, or an older checkpoint moved
    aside (`-replaced`), is kept: never delete a complete copy."""
    if not run_dir.is_dir():
        return
    for mine in sorted(p for p in run_dir.iterdir() if _TMP.match(p.name) and _tmp_owner(p) == os.getpid()
                       and not p.name.endswith("-replaced") and not (p / MARKER).exists()):
        log(f"removing {mine.name}: this run's checkpoint save that a stop cut short")
        shutil.rmtree(mine, ignore_errors=True)


def _tmp_owner(folder: Path) -> int | None:
    """The pid in `global_step_N.tmp-<pid>[-replaced]`."""
    match = _TMP_PID.match(folder.name)
    return int(match.group(1)) if match else None


@contextmanager
def atomic_checkpoint(run_dir: Path, step: int, meta: dict) -> Iterator[Path]:
    """Yield an empty temporary folder to write step `step`'s files into; on
    a clean exit, fsync them, write `meta` as the completion marker, rename
    the folder to `global_step_<step>` and point the tracker at it. On an
    error the temporary folder is deleted and the error propagates."""
    final = checkpoint_dir(run_dir, step)
    tmp = run_dir / f"{final.name}.tmp-{os.getpid()}"
    try:  # the folder is made inside: a signal raised right after mkdir still removes it
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        yield tmp
        meta = {**meta, FILES_KEY: file_digests(tmp)}  # read back from the page cache: fast
        (tmp / MARKER).write_text(json.dumps(meta, indent=2) + "\n")  # fsynced below
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync_file(path)
        for path in [*(p for p in tmp.rglob("*") if p.is_dir()), tmp]:
            fsync_dir(path)
        _move_into_place(tmp, final)
    except BaseException as err:
        try:
            written = _bytes_under(tmp)
        except OSError:  # a file removed while counting: the cleanup must still run
            written = 0
        shutil.rmtree(tmp, ignore_errors=True)

        if isinstance(err, Exception) and is_disk_full(err, folder=run_dir):
            raise _disk_full(err, run_dir, step=step, written=written) from err
        raise
    fsync_dir(run_dir)
    atomic_write_text(run_dir / TRACKER, f"{step}\n", durable=True)


def _bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _disk_full(err: Exception, run_dir: Path, *, step: int, written: int):
    """DiskFull naming the folder, its free space and what one checkpoint
    needs (the newest one's size; without one, at least what was written)."""
    from thinkrl.errors import DiskFull

    previous = complete_checkpoints(run_dir)
    size = _bytes_under(previous[-1]) if previous else written
    free = shutil.disk_usage(run_dir).free
    kept = f"{previous[-1].name} stays the newest checkpoint" if previous else "no checkpoint is on disk"
    return DiskFull(
        f"saving global_step_{step} in {run_dir} failed ({type(err).__name__}: {str(err)[:160]}): "
        f"{free / 2**20:.1f} MiB free, one checkpoint needs {'about' if previous else 'more than'} "
        f"{size / 2**20:.1f} MiB; the partial save was removed and {kept}",
        "free space there, keep fewer checkpoints (trainer.max_actor_ckpt_to_keep) or point "
        "trainer.default_local_dir at a larger disk")


def _move_into_place(tmp: Path, final: Path) -> None:
    """rename(tmp, final); an older folder of the same step (a run restarted
    from an earlier step) is moved aside first and deleted after."""
    old = None
    if final.exists():
        old = final.with_name(f"{final.name}.tmp-{os.getpid()}-replaced")
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    try:
        tmp.rename(final)
    except BaseException:  # a stop between the renames: the older copy goes back in place
        if old is not None and not final.exists():
            old.rename(final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def rotate(run_dir: Path, *, keep: int | None, current_step: int, log=print) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints up to
    `current_step` (None keeps all). Checkpoints of later steps, left by an
    earlier run in the same folder, are not this run's to judge: they stay
    until this run reaches and replaces them."""
    remove_incomplete(run_dir, current_step=current_step, log=log)
    if keep is None:
        return []
    mine = [p for p in complete_checkpoints(run_dir) if step_of(p) <= current_step]
    removed = mine[:-keep] if keep > 0 else []
    for folder in removed:
        # Drop the marker first: a crash during rmtree leaves an ignored folder.
        (folder / MARKER).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
        log(f"removed {folder.name} (trainer.max_actor_ckpt_to_keep={keep})")
    return removed


def remove_incomplete(run_dir: Path, *, current_step: int, log=print) -> list[Path]:
    """Delete `global_step_N` folders without a marker (a save whose marker
    was removed, a rotation that died mid-delete) up to `current_step`: no
    run ever reads them, and they may be large."""
    removed = []
    for folder in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        if folder.is_dir() and _NAME.match(folder.name) and not (folder / MARKER).exists() \
                and step_of(folder) <= current_step:
            shutil.rmtree(folder, ignore_errors=True)
            log(f"removed {folder.name}: an incomplete checkpoint (no {MARKER})")
            removed.append(folder)
    return removed


def kept_on_disk(run_dir) -> str:
    """One sentence on the newest checkpoint on disk (and how a rerun uses it)."""
    latest = latest_checkpoint(run_dir, log=lambda *_: None)
    if latest is None:
        return (f"No checkpoint is on disk in {run_dir} (none was due yet, or trainer.save_freq "
                "<= 0): a rerun starts from step 0.")
    return (f"Kept on disk: {latest.name}, the newest checkpoint, saved before this stop; a rerun "
            f"with trainer.resume_mode=auto continues from it ({run_dir}).")
