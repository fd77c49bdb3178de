"""A checkpoint's actor as a standalone Hugging Face folder.

A sharded checkpoint (ray backend: actor_dcp/) is gathered into one
model.safetensors on the way, in this process, with no process group.

Every checkpoint keeps the actor as a Hugging Face folder already (`actor/`:
config.json, generation_config.json, model.safetensors, and the run's
tokenizer, which is saved into each checkpoint so that any one of them can be
copied away and exported on its own). Export checks that the checkpoint is
complete and copies that folder's files; nothing is converted, so the
exported model gives the trained actor's log-probs bit for bit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from thinkrl.checkpoint.sharded import is_sharded_checkpoint, write_whole_weights
from thinkrl.checkpoint.hf_weights import weight_files
from thinkrl.checkpoint.sharded import ACTOR_DIR
from thinkrl.checkpoint.store import fsync_dir, fsync_file, resolve_checkpoint


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, log=print) -> Path:
    """Write the actor of `checkpoint` (a global_step_N folder, or a run
    directory: its latest) as a Hugging Face folder `out`, which must not
    exist or be empty. Returns `out`."""
    folder = resolve_checkpoint(checkpoint, log=log)
    source = folder / ACTOR_DIR
    if not (source / "config.json").is_file():
        raise ValueError(f"{folder}: no {ACTOR_DIR}/config.json; it was not written by "
                         "thinkrl's checkpointing")
    sharded = is_sharded_checkpoint(folder)
    if not sharded:
        weight_files(source)  # a clear error when the weights are missing
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an empty folder; choose a new path")
    # Copy into a sibling and rename, so an interrupted export leaves no
    # folder that looks finished.
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # copyfile, not copy2: the export gets ordinary permissions, not the save's.
        shutil.copytree(source, tmp, copy_function=shutil.copyfile)
        if sharded:  # the ranks' shards, gathered into one model.safetensors
            write_whole_weights(folder, tmp)
        for path in tmp.iterdir():
            fsync_file(path)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(out.parent)
    log(f"exported {folder} to {out} "
        f"({', '.join(sorted(p.name for p in out.iterdir()))})")
    return out
