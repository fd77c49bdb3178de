"""Checkpoint folders without a model: atomic saves, finding the latest, rotation,
RNG round trips, resume_mode and config checks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from thinkrl.checkpoint.resume import checkpoint_to_resume, should_save
from thinkrl.checkpoint.state import capture_rng, restore_rng
from thinkrl.checkpoint.store import (MARKER, TRACKER, atomic_checkpoint, complete_checkpoints,
                                      latest_checkpoint, remove_own_unfinished_saves, remove_stale_tmp,
                                      resolve_checkpoint, rotate)
from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.config.schema import TrainerConfig
from thinkrl.errors import DiskFull


def _save(run_dir: Path, step: int) -> Path:
    with atomic_checkpoint(run_dir, step, {"step": step}) as tmp:
        (tmp / "weights.bin").write_bytes(bytes([step]))
    return run_dir / f"global_step_{step}"


def test_atomic_save_writes_marker_then_tracker(tmp_path):
    folder = _save(tmp_path, 3)
    # The marker lists every file with its size and sha256 (hashlib.sha256(bytes([3]))).
    assert json.loads((folder / MARKER).read_text()) == {"step": 3, "files": {"weights.bin": {
        "bytes": 1, "sha256": "084fed08b978af4d7d196a7446a86b58009e636b611db16211b65a9aadff29c5"}}}
    assert (tmp_path / TRACKER).read_text() == "3\n"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_failed_save_leaves_previous_latest(tmp_path):
    _save(tmp_path, 1)
    with pytest.raises(DiskFull, match="one checkpoint needs about 0.0 MiB"):
        with atomic_checkpoint(tmp_path, 2, {"step": 2}) as tmp:
            (tmp / "weights.bin").write_bytes(b"partial")
            raise OSError(28, "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", TRACKER]
    assert (tmp_path / TRACKER).read_text() == "1\n"
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_1"


def test_latest_ignores_unfinished_and_unmarked_folders(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    (tmp_path / "global_step_3.tmp-99999999").mkdir()  # a save killed mid-write
    (tmp_path / "global_step_4").mkdir()  # no completion marker
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["global_step_1", "global_step_2"]
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_2"
    messages = []
    (tmp_path / TRACKER).write_text("4\n")  # names the folder without its marker
    assert latest_checkpoint(tmp_path, log=messages.append) == tmp_path / "global_step_2"
    assert "not a complete checkpoint" in messages[0]
    remove_stale_tmp(tmp_path, log=lambda *_: None)
    assert not (tmp_path / "global_step_3.tmp-99999999").exists()


def test_a_save_cut_before_its_block_starts_is_removed_when_the_run_closes(tmp_path):
    """A stop raised after atomic_checkpoint made its folder but before the
    `with` block begins skips the block's cleanup until the generator is
    finalised, which a reference still held delays past the exit. The
    close-time sweep removes this process's unfinished folders and keeps
    complete ones and a checkpoint moved aside."""
    import os

    _save(tmp_path, 1)
    saving = atomic_checkpoint(tmp_path, 2, {"step": 2})
    cut = saving.__enter__()  # entered, then the stop: __exit__ never runs
    (cut / "weights.bin").write_bytes(b"x")
    complete = tmp_path / f"global_step_3.tmp-{os.getpid()}"
    complete.mkdir()
    (complete / MARKER).write_text("{}")
    moved_aside = tmp_path / f"global_step_1.tmp-{os.getpid()}-replaced"
    moved_aside.mkdir()
    other = tmp_path / "global_step_4.tmp-99999999"  # another process's: remove_stale_tmp's to judge
    other.mkdir()
    notes = []
    remove_own_unfinished_saves(tmp_path, log=notes.append)
    assert not cut.exists() and notes == [f"removing {cut.name}: this run's checkpoint save that a stop cut short"]
    assert complete.exists() and moved_aside.exists() and other.exists()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["global_step_1"]


def test_a_stop_right_after_the_save_folder_is_made_removes_it(tmp_path, monkeypatch):
    """The signal handled as mkdir returns (inside pathlib) is inside the cleanup's try."""
    real_mkdir = Path.mkdir

    def mkdir_then_stop(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if ".tmp-" in self.name:
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "mkdir", mkdir_then_stop)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 1)
    assert list(tmp_path.iterdir()) == []


def test_a_stop_between_the_final_renames_puts_the_older_copy_back(tmp_path, monkeypatch):
    """Saving a step again moves the older folder aside first; a stop before
    the new one takes its place restores the older one (never no copy)."""
    _save(tmp_path, 1)
    real_rename = Path.rename

    def rename(self, target):
        if ".tmp-" in self.name and not self.name.endswith("-replaced"):
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 1)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("global")] == ["global_step_1"]
    assert (tmp_path / "global_step_1" / "weights.bin").read_bytes() == bytes([1])
    assert complete_checkpoints(tmp_path) == [tmp_path / "global_step_1"]


def test_tracker_wins_over_later_steps_of_an_older_run(tmp_path):
    _save(tmp_path, 5)  # left by an earlier, longer run
    _save(tmp_path, 2)  # this run's last save moved the tracker
    assert latest_checkpoint(tmp_path) == tmp_path / "global_step_2"


def test_saving_a_step_again_replaces_it(tmp_path):
    _save(tmp_path, 1)
    with atomic_checkpoint(tmp_path, 1, {"step": 1, "again": True}) as tmp:
        (tmp / "new.bin").write_bytes(b"x")
    assert sorted(p.name for p in (tmp_path / "global_step_1").iterdir()) == [MARKER, "new.bin"]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_rotation_keeps_the_newest_up_to_the_current_step(tmp_path):
    for step in (1, 2, 3, 9):  # 9: an older run's, beyond this run's step 3
        _save(tmp_path, step)
    removed = rotate(tmp_path, keep=2, current_step=3, log=lambda *_: None)
    assert [p.name for p in removed] == ["global_step_1"]
    assert [p.name for p in complete_checkpoints(tmp_path)] == [
        "global_step_2", "global_step_3", "global_step_9"]
    assert rotate(tmp_path, keep=None, current_step=3) == []


def test_resolve_run_dir_and_missing_checkpoint(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2)
    assert resolve_checkpoint(tmp_path) == tmp_path / "global_step_2"
    assert resolve_checkpoint(tmp_path / "global_step_1") == tmp_path / "global_step_1"
    with pytest.raises(ValueError, match="global_step_7 does not exist.*global_step_1, global_step_2"):
        resolve_checkpoint(tmp_path / "global_step_7")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path / "empty_run")


def test_resume_modes(tmp_path):
    _save(tmp_path, 4)
    quiet = dict(log=lambda *_: None)
    assert checkpoint_to_resume(TrainerConfig(), tmp_path, **quiet) == tmp_path / "global_step_4"
    assert checkpoint_to_resume(TrainerConfig(resume_mode="disable"), tmp_path, **quiet) is None
    chosen = TrainerConfig(resume_mode="resume_path", resume_from_path=str(tmp_path))
    assert checkpoint_to_resume(chosen, tmp_path / "elsewhere", **quiet) == tmp_path / "global_step_4"
    missing = TrainerConfig(resume_mode="resume_path", resume_from_path=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="trainer.resume_from_path=.*nope"):
        checkpoint_to_resume(missing, tmp_path, **quiet)
    assert checkpoint_to_resume(TrainerConfig(), tmp_path / "fresh", **quiet) is None


def test_save_schedule():
    every_2 = TrainerConfig(save_freq=2)
    assert [s for s in range(1, 6) if should_save(every_2, s, 5)] == [2, 4, 5]  # and the last
    assert not any(should_save(TrainerConfig(save_freq=0), s, 5) for s in range(1, 6))


def test_rng_states_round_trip():
    state = capture_rng()
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    restore_rng(state)
    assert torch.equal(torch.rand(3), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


@pytest.mark.parametrize("override, message", [
    ("trainer.resume_mode=latest", "trainer.resume_mode"),
    ("trainer.max_actor_ckpt_to_keep=0", "trainer.max_actor_ckpt_to_keep"),
    ("trainer.resume_mode=resume_path", "trainer.resume_from_path"),
])
def test_config_checks(override, message):
    from thinkrl.cli import recipe_path

    cfg = load_config(recipe_path("tiny"), [override])
    with pytest.raises(ValueError, match=message):
        validate(cfg)
