"""Runs that stop: a destroyed policy, Ctrl-C mid-step and mid-save, a full
disk, a bug. Each ends in one message (no traceback on the terminal) and
leaves intact checkpoints only. Docstrings are rows of docs/reliability.md's
fault table."""

from __future__ import annotations

import errno
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from fault_helpers import intact, on_disk, spawn, steps_logged, tiny  # noqa: F401  (fixture)

from thinkrl.checkpoint.lock import LOCK_FILE
from thinkrl.checkpoint.store import TRACKER
from thinkrl.cli import main

pytestmark = pytest.mark.slow


def _fail_saving(step: int, error: BaseException, monkeypatch) -> None:
    """torch.save raises `error` while writing global_step_<step>'s optimizer."""
    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if f"global_step_{step}." in str(f) and Path(f).name == "optimizer.pt":
            raise error
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_lr_1e6_destroys_the_model_at_step_1(tiny, capsys):
    """Case: optim.lr=1e6 (the weights' norm grows 10^4x at step 1).
    Behaviour: the divergence guard stops at step 1 (exit 1) saying the weights in memory are dropped.
    Kept: no checkpoint of the destroyed model; its metrics record, for the report."""
    run_dir, argv = tiny
    assert main(argv("actor_rollout_ref.actor.optim.lr=1e6", "trainer.total_training_steps=3",
                     "trainer.save_freq=1")) == 1
    err = capsys.readouterr().err
    assert "training stopped: step 1: the policy is destroyed: the weights' L2 norm grew" in err
    assert "the weights in memory are the destroyed ones and are dropped" in err
    assert "No checkpoint is on disk" in err
    assert on_disk(run_dir) == [] and steps_logged(run_dir) == [1]


def test_destroyed_after_a_good_checkpoint(tiny, capsys, monkeypatch):
    """Case: the policy destroyed at step 2, after a good step-1 checkpoint (weights x -1e4,
    what lr=1e6's weight decay does in one step).
    Behaviour: stops at step 2 before saving it; the message names global_step_1 as kept.
    Kept: global_step_1, intact; no global_step_2."""
    import thinkrl.trainer as trainer

    run_dir, argv = tiny
    real = trainer.train_step

    def step_that_destroys(run, step, **options):
        metrics = real(run, step, **options)
        if step == 2:
            with torch.no_grad():
                for p in run.roles.actor.group.rank.actor.model.parameters():
                    p.mul_(-1e4)
        return metrics

    monkeypatch.setattr(trainer, "train_step", step_that_destroys)
    assert main(argv("trainer.total_training_steps=3", "trainer.save_freq=1")) == 1
    err = capsys.readouterr().err
    assert "step 2: the policy is destroyed" in err and "Kept on disk: global_step_1" in err
    assert on_disk(run_dir) == ["global_step_1"] and intact(run_dir / "global_step_1")
    assert steps_logged(run_dir) == [1, 2]


def _signal_after_first_checkpoint(tiny, sig: int) -> tuple[int, str]:
    """A training process, `sig` once its first checkpoint is on disk: (exit code, stderr)."""
    run_dir, argv = tiny
    logs = run_dir.parent / "train"
    process = spawn(argv("trainer.total_training_steps=200", "trainer.save_freq=1"), output=logs)
    deadline = time.monotonic() + 300
    while not (run_dir / "global_step_1" / "meta.json").exists() and time.monotonic() < deadline:
        assert process.poll() is None, Path(f"{logs}.err").read_text()
        time.sleep(0.2)
    process.send_signal(sig)
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:  # show where it hangs (faulthandler), then fail
        process.send_signal(signal.SIGABRT)
        process.wait()
    return process.returncode, Path(f"{logs}.err").read_text()


def test_ctrl_c_mid_step(tiny):
    """Case: SIGINT (Ctrl-C) to a training process after its first checkpoint.
    Behaviour: exit 130 with no traceback; prints what is kept and the exact resume command.
    Kept: every finished checkpoint, intact; no temporary save folder; the lock released."""
    run_dir, _ = tiny
    code, err = _signal_after_first_checkpoint(tiny, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and "thinkrl: stopped by Ctrl-C" in err
    kept = on_disk(run_dir)
    assert kept and all(".tmp-" not in name for name in kept)
    assert all(intact(run_dir / name) for name in kept)
    newest = max(kept, key=lambda name: int(name.rsplit("_", 1)[1]))
    assert f"Kept: {newest}, the newest checkpoint" in err
    assert re.search(r"Resume with: thinkrl train .* trainer\.resume_mode=auto", err)
    assert (run_dir / LOCK_FILE).read_text() == ""


def test_sigterm_mid_step(tiny):
    """Case: SIGTERM (a job scheduler's stop) to a training process after its first checkpoint.
    Behaviour: exit 143 with no traceback; says it was stopped by SIGTERM, what is kept and the
    resume command (before: no message at all).
    Kept: every finished checkpoint, intact; no temporary save folder; the lock released."""
    run_dir, _ = tiny
    code, err = _signal_after_first_checkpoint(tiny, signal.SIGTERM)
    assert code == 143, err
    assert "Traceback" not in err and "thinkrl: stopped by SIGTERM" in err
    kept = on_disk(run_dir)
    assert kept and all(".tmp-" not in name for name in kept)
    assert all(intact(run_dir / name) for name in kept)
    assert re.search(r"Resume with: thinkrl train .* trainer\.resume_mode=auto", err)
    assert (run_dir / LOCK_FILE).read_text() == ""


def test_ctrl_c_mid_save(tiny, capsys, monkeypatch):
    """Case: Ctrl-C while global_step_2 is being written.
    Behaviour: exit 130; the half-written save is removed; the resume command is printed.
    Kept: global_step_1 (the tracker names it), intact."""
    run_dir, argv = tiny
    _fail_saving(2, KeyboardInterrupt(), monkeypatch)
    assert main(argv("trainer.total_training_steps=3", "trainer.save_freq=1")) == 130
    err = capsys.readouterr().err
    assert "Kept: global_step_1" in err and "Resume with: thinkrl train" in err
    assert on_disk(run_dir) == ["global_step_1"] and intact(run_dir / "global_step_1")
    assert (run_dir / TRACKER).read_text().strip() == "1"


def test_sigterm_right_after_the_save_folder_is_made(tiny, capsys, monkeypatch):
    """Case: SIGTERM handled the instant mkdir made global_step_2's temporary folder (a slow
    mkdir on a disk busy with the last save's fsyncs; CI kept such a folder once).
    Behaviour: exit 143; the folder is removed with the save's other cleanup.
    Kept: global_step_1, intact; no temporary save folder."""
    from thinkrl.exits import Terminated

    run_dir, argv = tiny
    real_mkdir = Path.mkdir

    def mkdir_then_stop(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name.startswith("global_step_2.tmp-"):
            raise Terminated()

    monkeypatch.setattr(Path, "mkdir", mkdir_then_stop)
    assert main(argv("trainer.total_training_steps=3", "trainer.save_freq=1")) == 143
    assert "stopped by SIGTERM" in capsys.readouterr().err
    assert on_disk(run_dir) == ["global_step_1"] and intact(run_dir / "global_step_1")


def test_disk_full_mid_save_then_resume(tiny, capsys, monkeypatch):
    """Case: the disk fills while global_step_2 is written (ENOSPC from the writer).
    Behaviour: exit 1 naming the folder, its free space and one checkpoint's size; the same command resumes once space is free.
    Kept: global_step_1, intact; the partial save removed."""
    run_dir, argv = tiny
    _fail_saving(2, OSError(errno.ENOSPC, "No space left on device"), monkeypatch)
    args = argv("trainer.total_training_steps=3", "trainer.save_freq=1")
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"thinkrl: the disk is full: saving global_step_2 in {run_dir} failed" in err
    assert "MiB free, one checkpoint needs about" in err and "global_step_1 stays" in err
    assert on_disk(run_dir) == ["global_step_1"] and steps_logged(run_dir) == [1, 2]
    monkeypatch.undo()  # space freed
    assert main(args) == 0
    assert on_disk(run_dir) == ["global_step_1", "global_step_2", "global_step_3"]
    assert steps_logged(run_dir) == [1, 2, 3]


def test_a_bug_writes_error_log(tiny, capsys, monkeypatch):
    """Case: an unexpected exception inside thinkrl (here a KeyError in the advantage stage).
    Behaviour: exit 1, one line calling it a bug in thinkrl; the traceback goes to <run dir>/error.log.
    Kept: the checkpoints saved before it; error.log."""
    import thinkrl.trainer as trainer

    run_dir, argv = tiny
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyError("advantages")
        return real(*args, **kwargs)

    real = trainer.compute_advantages
    monkeypatch.setattr(trainer, "compute_advantages", broken)
    assert main(argv("trainer.total_training_steps=3", "trainer.save_freq=1")) == 1
    err = capsys.readouterr().err
    assert "this is a bug in thinkrl" in err and "Traceback" not in err
    assert f"{run_dir / 'error.log'}" in err
    log = (run_dir / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "KeyError: 'advantages'" in log
    assert on_disk(run_dir) == ["global_step_1"]
