"""Disk checks: free space wherever the run writes (seed 004: a 7B GRPO run
died with `OSError: Not enough disk space` because Ray's temp and spill
files, dataset caches and TMPDIR all defaulted to a small root disk).

Each place the run writes is measured with `shutil.disk_usage` on its
nearest existing folder. Places on the same filesystem share its free
space, so each one is checked against the sum of their needs.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from thinkrl.assets import total_training_steps
from thinkrl.config.checks import execution_backend
from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, gib, ok, warn

BYTES_PER_PARAM_CHECKPOINT = 4 + 8
"""A resumable checkpoint: fp32 weights (4 bytes) + AdamW's two fp32 moments (8 bytes)."""
TMP_FLOOR = 1 * 2**30
"""TMPDIR: tokenizer, compile and pyarrow scratch files; a rough floor."""
RAY_FLOOR = 10 * 2**30
"""Ray's session folder (logs, sockets) plus objects spilled from its store; a rough floor."""
BUILTIN_ASSETS = 200 * 2**20
"""The built-in tiny model and arithmetic set, written on first use."""
FULL_FRACTION = 0.95
"""Ray stops writing spilled objects to a disk fuller than this (its
local_fs_capacity_threshold); warn at it for every location."""


@dataclass(frozen=True, slots=True)
class Location:
    name: str
    path: Path
    need: int
    """Bytes this run may write there (0: unknown or negligible)."""
    why: str
    """What the need is made of."""
    fix: str
    """Which variable or key moves it."""


def nearest_existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def locations(ctx: DoctorContext) -> list[Location]:
    """Where this run writes, with how much it may need there."""
    cfg, env = ctx.cfg, ctx.env
    found = [_checkpoints(ctx),
             Location("tmp", Path(env.get("TMPDIR") or tempfile.gettempdir()), TMP_FLOOR, "scratch files",
                      "export TMPDIR=/big/disk/tmp (and TEMP, TMP) before starting")]
    if execution_backend(cfg) == "ray":
        ray_tmp = Path(cfg.trainer.ray_tmpdir or env.get("RAY_TMPDIR") or "/tmp/ray").expanduser()
        found.append(Location("ray-temp", ray_tmp, RAY_FLOOR, "Ray session files and spilled objects",
                              "set trainer.ray_tmpdir=/big/disk/ray_tmp (or export RAY_TMPDIR): "
                              "Ray's session files and spilled objects go there; a cluster you "
                              "join was started with ray start --temp-dir=... "
                              "--object-spilling-directory=..."))
    from thinkrl.builtin import cache_dir, is_builtin

    model_path, data_specs = cfg.actor_rollout_ref.model.path, [cfg.data.train_files, cfg.data.val_files]
    specs = [model_path] + [s for spec in data_specs for s in ([spec] if isinstance(spec, str) else spec)]
    if any(is_builtin(s) for s in specs):
        found.append(Location("thinkrl-cache", cache_dir(), BUILTIN_ASSETS, "built-in model and data",
                              "export THINKRL_CACHE=/big/disk/thinkrl_cache"))
    if not is_builtin(model_path) and not Path(model_path).expanduser().exists():
        hf_home = Path(env.get("HF_HUB_CACHE") or env.get("HF_HOME") or "~/.cache/huggingface")
        need, why = _param_bytes(ctx, 2, "the model's bf16 weights, downloaded")
        found.append(Location("hf-cache", hf_home, need, why,
                              "export HF_HOME=/big/disk/hf (HF_HUB_CACHE, HF_DATASETS_CACHE for the caches alone)"))
    return found


def _param_bytes(ctx: DoctorContext, per_param: int, why: str) -> tuple[int, str]:
    try:
        params = ctx.param_count
    except NotChecked:
        return 0, why + " (size unknown: the model's config did not load)"
    return params * per_param, why


def _checkpoints(ctx: DoctorContext) -> Location:
    trainer = ctx.cfg.trainer
    path = Path(trainer.default_local_dir)
    fix = ("set trainer.default_local_dir to a larger disk, keep fewer (trainer.max_actor_ckpt_to_keep) "
           "or save less often (trainer.save_freq)")
    if trainer.save_freq <= 0:
        return Location("checkpoints", path, 0, "no checkpoints (trainer.save_freq <= 0): metrics only", fix)
    keep = trainer.max_actor_ckpt_to_keep
    one, why = _param_bytes(ctx, BYTES_PER_PARAM_CHECKPOINT, "fp32 weights + AdamW moments")
    if keep:  # rotate keeps all when keep is None or 0
        # save_checkpoint writes the new checkpoint before rotate deletes the
        # oldest, so for a moment keep + 1 are on disk.
        count = keep + 1
        held = f"at the peak: the {keep} kept + the one being written"
    else:
        count = _checkpoint_count(ctx)
        held = "all kept (trainer.max_actor_ckpt_to_keep unset)"
    need, why = one * count, f"{count} checkpoint(s) x {gib(one)} {held}; {why}"
    existing = _resumed_bytes(ctx)
    if existing:
        # Those already on disk are used space, not free space this run still needs;
        # the next save is written before any is removed, so one is always needed.
        need = max(one, need - existing)
        why += f"; {gib(existing)} of it is already on disk (the checkpoints this run resumes with)"
    return Location("checkpoints", path, need, why, fix)


def _resumed_bytes(ctx: DoctorContext) -> int:
    """Bytes of the complete checkpoints in the run directory that a resumed
    run keeps counting (trainer.resume_mode=auto); 0 for a fresh start."""
    from thinkrl.checkpoint.store import complete_checkpoints

    trainer = ctx.cfg.trainer
    if trainer.resume_mode != "auto":
        return 0
    return sum(p.stat().st_size for folder in complete_checkpoints(Path(trainer.default_local_dir))
               for p in folder.rglob("*") if p.is_file())


def _checkpoint_count(ctx: DoctorContext) -> int:
    """Checkpoints a run keeps when max_actor_ckpt_to_keep is unset: all."""
    trainer = ctx.cfg.trainer
    batches_per_epoch = 1
    if trainer.total_training_steps is None:
        from thinkrl.doctor.data import KEYS, dataset_of
        try:
            rows = len(dataset_of(ctx, KEYS[0]).rows)
        except NotChecked:
            return 1
        batches_per_epoch = max(rows // ctx.cfg.data.train_batch_size, 1)
    steps = total_training_steps(ctx.cfg, batches_per_epoch=batches_per_epoch)
    return max(1, math.ceil(steps / trainer.save_freq))


def check_space(ctx: DoctorContext) -> list[CheckResult]:
    """Free space at each location against what the run may write there."""
    places = locations(ctx)
    anchors = {p.name: nearest_existing(p.path) for p in places}
    device = {name: os.stat(anchor).st_dev for name, anchor in anchors.items()}
    results = []
    for place in places:
        usage = shutil.disk_usage(anchors[place.name])
        sharing = [p for p in places if device[p.name] == device[place.name]]
        need = sum(p.need for p in sharing)
        others = [p.name for p in sharing if p is not place]
        found = (f"{place.path}: {gib(usage.free)} free of {gib(usage.total)}; needs ~{gib(place.need)} "
                 f"({place.why})")
        if others:
            found += f"; the same disk holds {', '.join(others)}: ~{gib(need)} in all"
        fuller = 1 - usage.free / usage.total if usage.total else 1.0
        name = f"disk/{place.name}"
        if usage.free < need:
            results.append(fail(name, found, place.fix))
        elif fuller >= FULL_FRACTION or usage.free < 2 * need:
            results.append(warn(name, found + f" ({100 * fuller:.0f}% full)", place.fix))
        else:
            results.append(ok(name, found))
    return results


CHECKS = [check_space]
