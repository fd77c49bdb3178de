"""Checkpoint verification without a model: checksums, safetensors headers,
finite weights, falling back to the newest intact checkpoint, rotation of
incomplete folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from thinkrl.checkpoint.resume import checkpoint_to_resume
from thinkrl.checkpoint.store import MARKER, TRACKER, atomic_checkpoint, resolve_checkpoint, rotate
from thinkrl.checkpoint.verify import DamagedCheckpoint, verify_checkpoint
from thinkrl.config.schema import TrainerConfig
from thinkrl.errors import SetupError


def _save(run_dir: Path, step: int, *, value: float = 1.0) -> Path:
    with atomic_checkpoint(run_dir, step, {"step": step}) as tmp:
        (tmp / "actor").mkdir()
        save_file({"w": torch.full((4, 4), value)}, str(tmp / "actor" / "model.safetensors"))
        (tmp / "optimizer.pt").write_bytes(b"x" * 100)
    return run_dir / f"global_step_{step}"


def test_intact_checkpoint_verifies(tmp_path):
    folder = _save(tmp_path, 1)
    assert verify_checkpoint(folder) is True
    assert sorted(json.loads((folder / MARKER).read_text())["files"]) == [
        "actor/model.safetensors", "optimizer.pt"]


@pytest.mark.parametrize("damage, expected", [
    (lambda f: (f / "optimizer.pt").write_bytes(b"x" * 50), "has 50 bytes, 100 were saved"),
    (lambda f: (f / "optimizer.pt").write_bytes(b"y" * 100), "does not match its saved sha256"),
    (lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    (lambda f: (f / MARKER).write_text("{not json"), "meta.json does not read"),
])
def test_damage_is_named(tmp_path, damage, expected):
    folder = _save(tmp_path, 1)
    damage(folder)
    with pytest.raises(DamagedCheckpoint, match=expected):
        verify_checkpoint(folder)


def test_nan_weights_and_bad_header_fail_even_without_checksums(tmp_path):
    folder = _save(tmp_path, 1, value=float("nan"))  # checksums match: the NaN was saved
    with pytest.raises(DamagedCheckpoint, match="16 non-finite value"):
        verify_checkpoint(folder)
    meta = json.loads((folder / MARKER).read_text())
    del meta["files"]  # a checkpoint from before checksums
    (folder / MARKER).write_text(json.dumps(meta))
    (folder / "actor" / "model.safetensors").write_bytes(b"\xff" * 8 + b"garbage")
    with pytest.raises(DamagedCheckpoint, match="does not read as safetensors"):
        verify_checkpoint(folder)


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    latest = _save(tmp_path, 3)
    with (latest / "actor" / "model.safetensors").open("r+b") as f:
        f.truncate(40)
    messages = []
    folder = checkpoint_to_resume(TrainerConfig(resume_mode="auto"), tmp_path, log=messages.append)
    assert folder == tmp_path / "global_step_2"
    assert "skipping checkpoint global_step_3" in messages[0] and "truncated" in messages[0]
    assert "falling back to global_step_2" in messages[1]
    assert latest.is_dir()  # kept for inspection
    # An explicit folder is verified too, and the error lists the others.
    with pytest.raises(DamagedCheckpoint, match="global_step_1, global_step_2"):
        resolve_checkpoint(latest)


def test_resume_refuses_when_every_checkpoint_is_damaged(tmp_path):
    for step in (1, 2):
        (_save(tmp_path, step) / "optimizer.pt").write_bytes(b"")
    with pytest.raises(SetupError, match="every checkpoint .* is damaged") as err:
        checkpoint_to_resume(TrainerConfig(resume_mode="auto"), tmp_path, log=lambda *_: None)
    assert "trainer.resume_mode=disable" in err.value.fix


def test_rotation_removes_incomplete_folders_up_to_the_current_step(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "global_step_2").mkdir()  # no marker: a save that never finished
    (tmp_path / "global_step_2" / "optimizer.pt").write_bytes(b"partial")
    (tmp_path / "global_step_9").mkdir()  # a later step: not this run's to judge yet
    _save(tmp_path, 3)
    messages = []
    rotate(tmp_path, keep=None, current_step=3, log=messages.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_1", "global_step_3", "global_step_9", TRACKER]
    assert "global_step_2: an incomplete checkpoint" in messages[0]
