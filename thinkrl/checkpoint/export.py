"""A checkpoint's actor as a standalone Hugging Face folder.

A sharded checkpoint (ray backend: actor_dcp/) is gathered into one
model.safetensors on the way, in this process, with no process group.

Every checkpoint keeps the actor as a Hugging Face folder already (`actor/`:
config.json, generation_config.json, model.safetensors, and the run's
tokenizer, which is saved into each checkpoint so that any one of them can be
copied away and exported on its own). Export checks that the checkpoint is
complete and copies that folder's files; nothing is converted, so the
exported model gives the trained actor's log-probs bit for bit.

A LoRA checkpoint's actor is PEFT's adapter folder: exported as it is, or
with `merge` as the base model with the adapter merged in (a plain Hugging
Face folder; the base folder is only read).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from thinkrl.checkpoint.adapter import is_adapter_checkpoint, write_merged_model
from thinkrl.checkpoint.sharded import is_sharded_checkpoint, write_whole_weights
from thinkrl.checkpoint.hf_weights import weight_files
from thinkrl.checkpoint.sharded import ACTOR_DIR
from thinkrl.checkpoint.store import fsync_dir, fsync_file, resolve_checkpoint
from thinkrl.errors import UserError


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, merge: bool = False,
                      base: str | None = None, log=print) -> Path:
    """Write the actor of `checkpoint` (a global_step_N folder, or a run
    directory: its latest) as a Hugging Face folder `out`, which must not
    exist or be empty. A LoRA checkpoint gives its adapter folder, or with
    `merge` the merged model (`base` overrides the adapter's recorded base
    model). Returns `out`."""
    folder = resolve_checkpoint(checkpoint, log=log)
    source = folder / ACTOR_DIR
    adapter = is_adapter_checkpoint(folder)
    if (merge or base) and not adapter:
        raise UserError(f"{folder} holds a fully trained model, not a LoRA adapter: export it "
                         "without --merge/--base")
    if not adapter and not (source / "config.json").is_file():
        raise UserError(f"{folder}: no {ACTOR_DIR}/config.json; it was not written by "
                         "thinkrl's checkpointing")
    sharded = is_sharded_checkpoint(folder) and not adapter  # an adapter is whole in actor/
    if not sharded and not adapter:
        weight_files(source)  # a clear error when the weights are missing
    out = Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; choose a new path")
    # Copy into a sibling and rename, so an interrupted export leaves no
    # folder that looks finished.
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # copyfile, not copy2: the export gets ordinary permissions, not the save's.
        shutil.copytree(source, tmp, copy_function=shutil.copyfile)
        if sharded:  # the ranks' shards, gathered into one model.safetensors
            write_whole_weights(folder, tmp)
        if adapter and merge:
            used = write_merged_model(source, tmp, base=base)
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                (tmp / name).unlink()
            log(f"merged the adapter into the base model {used}")
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
