"""Damaged checkpoints: truncated weights or optimizer, a bad safetensors
header, flipped bits, NaN weights, a missing meta.json.

One 2-step run (a checkpoint each step) is made once; each test copies it,
damages global_step_2, the latest, and continues to step 3 through the
command line. The run must skip the damaged checkpoint with a warning naming
the problem, resume from global_step_1, redo step 2 (replacing the damaged
folder) and finish. Docstrings are rows of docs/reliability.md's fault table.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fault_helpers import intact, on_disk, overrides, steps_logged
from safetensors.torch import load_file, save_file

from thinkrl.checkpoint.store import TRACKER
from thinkrl.checkpoint.verify import sha256_file
from thinkrl.cli import main

pytestmark = pytest.mark.slow
WEIGHTS = Path("actor") / "model.safetensors"


@pytest.fixture(scope="module")
def two_steps(asset_cache, tiny_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    run_dir = tmp_path_factory.mktemp("faults-ckpt") / "run"
    assert main(["train", *overrides(tiny_model_dir, run_dir, "trainer.total_training_steps=2",
                                     "trainer.save_freq=1")]) == 0
    return tiny_model_dir, run_dir


def _continue(two_steps, tmp_path, damage, capsys) -> tuple[Path, str]:
    model_dir, straight = two_steps
    run_dir = tmp_path / "run"
    shutil.copytree(straight, run_dir)
    damage(run_dir / "global_step_2")
    capsys.readouterr()
    assert main(["train", *overrides(model_dir, run_dir, "trainer.total_training_steps=3",
                                     "trainer.save_freq=1")]) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and f"{run_dir / 'global_step_1'}" in out
    assert steps_logged(run_dir) == [1, 2, 3]  # step 2 redone once, its old record dropped
    assert on_disk(run_dir) == ["global_step_1", "global_step_2", "global_step_3"]
    assert all(intact(run_dir / name) for name in on_disk(run_dir))
    assert (run_dir / TRACKER).read_text().strip() == "3"
    return run_dir, out


def _truncate(path: Path, keep: int) -> None:
    with path.open("r+b") as f:
        f.truncate(keep)


def _reseal(folder: Path, rel: str) -> None:
    """Record `rel`'s current checksum in meta.json: damage the checksum cannot see."""
    meta = json.loads((folder / "meta.json").read_text())
    meta["files"][rel] = {"bytes": (folder / rel).stat().st_size, "sha256": sha256_file(folder / rel)}
    (folder / "meta.json").write_text(json.dumps(meta))


def test_truncated_weights(two_steps, tmp_path, capsys):
    """Case: the latest checkpoint's model.safetensors truncated.
    Behaviour: skipped with a warning (bytes saved vs found); resumes from the newest intact one.
    Kept: every intact checkpoint; the damaged one is replaced when the run redoes its step."""
    _, out = _continue(two_steps, tmp_path, lambda f: _truncate(f / WEIGHTS, 100), capsys)
    assert "skipping checkpoint global_step_2" in out and "actor/model.safetensors has 100 bytes" in out
    assert "falling back to global_step_1" in out


def test_truncated_optimizer(two_steps, tmp_path, capsys):
    """Case: the latest checkpoint's optimizer.pt truncated.
    Behaviour: skipped with a warning naming optimizer.pt; resumes from the newest intact one.
    Kept: every intact checkpoint; the run finishes."""
    _, out = _continue(two_steps, tmp_path, lambda f: _truncate(f / "optimizer.pt", 1000), capsys)
    assert "optimizer.pt has 1000 bytes" in out


def test_bad_safetensors_header(two_steps, tmp_path, capsys):
    """Case: a safetensors header overwritten (its length field says 2**60 bytes).
    Behaviour: skipped: the checksum differs, and even without one the header does not read.
    Kept: every intact checkpoint; the run finishes."""
    def damage(folder):
        with (folder / WEIGHTS).open("r+b") as f:
            f.write((2**60).to_bytes(8, "little"))
        _reseal(folder, WEIGHTS.as_posix())  # only the header check can see it now

    _, out = _continue(two_steps, tmp_path, damage, capsys)
    assert "does not read as safetensors" in out


def test_flipped_bit(two_steps, tmp_path, capsys):
    """Case: one flipped bit in trainer_state.pt (size unchanged).
    Behaviour: skipped: its sha256 no longer matches (before, it resumed silently).
    Kept: every intact checkpoint; the run finishes."""
    def damage(folder):
        data = bytearray((folder / "trainer_state.pt").read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / "trainer_state.pt").write_bytes(bytes(data))

    _, out = _continue(two_steps, tmp_path, damage, capsys)
    assert "trainer_state.pt does not match its saved sha256" in out


def test_nan_weights(two_steps, tmp_path, capsys):
    """Case: NaN in the latest checkpoint's weights (checksum resealed to match).
    Behaviour: skipped: 'non-finite value(s)' named by tensor (before, it loaded and crashed in sampling).
    Kept: every intact checkpoint; the run finishes."""
    def damage(folder):
        tensors = load_file(folder / WEIGHTS)
        name = sorted(tensors)[0]
        tensors[name][0] = float("nan")
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
        _reseal(folder, WEIGHTS.as_posix())

    _, out = _continue(two_steps, tmp_path, damage, capsys)
    assert "non-finite value(s) (NaN or inf)" in out


def test_missing_meta_json(two_steps, tmp_path, capsys):
    """Case: the latest global_step_N without meta.json (a save that never finished).
    Behaviour: not a checkpoint: resumes from the one before; rotation deletes such folders.
    Kept: every complete checkpoint; the incomplete folder is replaced or removed."""
    run_dir, out = _continue(two_steps, tmp_path, lambda f: (f / "meta.json").unlink(), capsys)
    assert "names step '2', which is not a complete checkpoint" in out
    # An older incomplete folder is removed by rotation at the next save.
    (run_dir / "global_step_1" / "meta.json").unlink()
    model_dir, _ = two_steps
    assert main(["train", *overrides(model_dir, run_dir, "trainer.total_training_steps=4",
                                     "trainer.save_freq=1")]) == 0
    assert "global_step_1: an incomplete checkpoint (no meta.json)" in capsys.readouterr().out
    assert on_disk(run_dir) == ["global_step_2", "global_step_3", "global_step_4"]


def test_weights_saved_are_always_finite(two_steps):
    """Case: a save asked for while the weights hold NaN.
    Behaviour: refused: RunStopped names the tensor; nothing is written.
    Kept: the checkpoints already on disk."""
    from thinkrl.checkpoint.state import save_checkpoint
    from thinkrl.run import Progress
    from thinkrl.errors import RunStopped

    from thinkrl.parallel.fsdp import parameter_stats

    model = torch.nn.Linear(2, 2)

    class Actor:  # only what the check reads before writing anything
        def weight_stats(self) -> dict:
            return {**parameter_stats(model), "vocab_size": 2}

    run_dir = two_steps[1]
    fake = SimpleNamespace(roles=SimpleNamespace(actor=Actor()), spec=SimpleNamespace(run_dir=run_dir))
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    before = on_disk(run_dir)
    with pytest.raises(RunStopped, match="not saving a checkpoint: 1 weight tensor.* weight"):
        save_checkpoint(fake, Progress(step=9))
    assert on_disk(run_dir) == before
