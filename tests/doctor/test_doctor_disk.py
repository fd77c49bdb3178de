"""Disk checks (seed 004: `OSError: Not enough disk space` with Ray and caches on a small root disk)."""

from __future__ import annotations

import shutil
from collections import namedtuple

from doctor_helpers import context

from thinkrl.doctor import disk
from thinkrl.doctor.disk import BYTES_PER_PARAM_CHECKPOINT, check_space, nearest_existing

Usage = namedtuple("Usage", "total used free")
GiB = 2**30


def _stub_disk(monkeypatch, *, free: float, total: float = 500 * GiB) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(int(total), int(total - free), int(free)))


def test_nearly_full_disk_fails_and_names_the_variables(monkeypatch, tmp_path):
    _stub_disk(monkeypatch, free=300 * 2**20)
    ctx = context("trainer.backend=ray", f"trainer.default_local_dir={tmp_path / 'run'}", param_count=10**6,
                  env={"TMPDIR": str(tmp_path)})
    rows = {r.check: r for r in check_space(ctx)}
    assert rows["disk/ray-temp"].status == "fail"
    assert "RAY_TMPDIR" in rows["disk/ray-temp"].fix and "--object-spilling-directory" in rows["disk/ray-temp"].fix
    assert rows["disk/tmp"].status == "fail" and "TMPDIR" in rows["disk/tmp"].fix
    assert "/tmp/ray" in rows["disk/ray-temp"].found  # Ray's default when RAY_TMPDIR is unset


def test_checkpoint_estimate_counts_weights_and_adamw(monkeypatch, tmp_path):
    # The new checkpoint is written before the oldest is deleted: 2 kept + 1 at the peak.
    # 1e9 parameters x 12 bytes x 3 checkpoints = 36e9 bytes ~ 33.5 GiB; 30 GiB free,
    # which would hold the 2 kept ones (22.4 GiB) but not the peak.
    _stub_disk(monkeypatch, free=30 * GiB)
    ctx = context("trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=2",
                  f"trainer.default_local_dir={tmp_path / 'run'}", param_count=10**9)
    [place] = [p for p in disk.locations(ctx) if p.name == "checkpoints"]
    assert place.need == 3 * 10**9 * BYTES_PER_PARAM_CHECKPOINT
    assert "3 checkpoint(s)" in place.why and "the 2 kept + the one being written" in place.why
    row = next(r for r in check_space(ctx) if r.check == "disk/checkpoints")
    assert row.status == "fail" and "trainer.default_local_dir" in row.fix


def test_without_a_keep_limit_every_checkpoint_counts(tmp_path):
    ctx = context("trainer.save_freq=10", "trainer.total_training_steps=40",
                  f"trainer.default_local_dir={tmp_path}", param_count=1000)
    [place] = [p for p in disk.locations(ctx) if p.name == "checkpoints"]
    assert place.need == 4 * 1000 * BYTES_PER_PARAM_CHECKPOINT
    assert "all kept" in place.why


def test_roomy_disk_passes_and_ray_is_checked_only_for_the_ray_backend(monkeypatch, tmp_path):
    _stub_disk(monkeypatch, free=400 * GiB)
    rows = check_space(context(f"trainer.default_local_dir={tmp_path}", param_count=10**6))
    assert {r.status for r in rows} == {"ok"}
    assert "disk/ray-temp" not in {r.check for r in rows}


def test_hub_model_ids_need_room_in_the_hf_cache(monkeypatch, tmp_path):
    _stub_disk(monkeypatch, free=5 * GiB)
    ctx = context("actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct", param_count=7 * 10**9,
                  env={"HF_HOME": str(tmp_path / "hf")})
    row = next(r for r in check_space(ctx) if r.check == "disk/hf-cache")
    assert row.status == "fail" and "HF_HOME" in row.fix


def test_nearest_existing_folder(tmp_path):
    assert nearest_existing(tmp_path / "a" / "b" / "c") == tmp_path


def test_checkpoints_already_on_disk_are_not_needed_again(monkeypatch, tmp_path):
    # Seed: after a disk-full stop and a cleanup, the doctor refused the resume
    # because it counted the 2 checkpoints on disk as space still to find.
    # 1000 params x 12 bytes = 12000 bytes per checkpoint; keep 2: 3 x 12000 at
    # the peak; 2 x 12002 bytes are already on disk, which leaves 36000 - 24004 =
    # 11996, but one whole checkpoint (12000) is always needed for the next save.
    for step in (10, 20):
        folder = tmp_path / f"global_step_{step}"
        folder.mkdir()
        (folder / "weights").write_bytes(b"w" * 12000)
        (folder / "meta.json").write_text("{}")  # 2 bytes each
    ctx = context("trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=2",
                  f"trainer.default_local_dir={tmp_path}", param_count=1000)
    [place] = [p for p in disk.locations(ctx) if p.name == "checkpoints"]
    assert place.need == 12000
    assert "already on disk" in place.why
    fresh = context("trainer.save_freq=10", "trainer.max_actor_ckpt_to_keep=2",
                    "trainer.resume_mode=disable", f"trainer.default_local_dir={tmp_path}",
                    param_count=1000)
    [place] = [p for p in disk.locations(fresh) if p.name == "checkpoints"]
    assert place.need == 3 * 12000
