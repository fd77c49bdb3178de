"""Every exit is a message: user errors vs bugs, stops, disk full, Ctrl-C,
and the exact resume command."""

from __future__ import annotations

import errno
import io
import json

import torch

from thinkrl.checkpoint.lock import RunLock
from thinkrl.commands.common import recipe_path
from thinkrl.errors import RunStopped, SetupError
from thinkrl.errors import is_disk_full, is_failed_write
from thinkrl.exits import is_user_error, resume_argv, run_command


def _run(function, argv=("train", "--config", "tiny")):
    err = io.StringIO()
    code = run_command(lambda args: function(), None, argv=list(argv), err=err)
    return code, err.getvalue()


def _checkpoint(run_dir, step):
    folder = run_dir / f"global_step_{step}"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"step": step}))


def test_a_valueerror_from_thinkrl_is_a_user_error_one_from_torch_is_a_bug(tmp_path):
    def ours():
        recipe_path("no-such-recipe")  # thinkrl's own check raises the ValueError

    def theirs():
        lock = RunLock.acquire(tmp_path / "run")
        try:
            torch.zeros(2).view(3)  # RuntimeError inside torch
        finally:
            lock.release()

    def torch_value_error():  # a ValueError, but raised inside torch
        torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.zeros(3, dtype=torch.long))

    code, text = _run(ours)
    assert code == 2 and text.startswith("thinkrl: error: --config no-such-recipe: no such file")
    code, text = _run(theirs)
    assert code == 1 and "this is a bug in thinkrl" in text and "RuntimeError" in text
    log = (tmp_path / "run" / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "thinkrl train --config tiny" in log
    assert str(tmp_path / "run" / "error.log") in text
    code, text = _run(torch_value_error)
    assert code == 1 and "bug in thinkrl" in text and "ValueError: Expected input batch_size" in text


def test_a_plain_valueerror_of_thinkrl_s_own_is_a_bug_with_the_resume_line(tmp_path):
    """Only a UserError is the user's: an invariant of thinkrl's that breaks is
    its bug, reported with the traceback's file and the line that resumes."""
    from thinkrl.algos.pass_at_k import pass_at_k

    run_dir = tmp_path / "run"
    _checkpoint(run_dir, 2)

    def invariant():
        lock = RunLock.acquire(run_dir)
        try:
            pass_at_k(4, 5, 1)  # 5 correct of 4: thinkrl's own ValueError, not the user's
        finally:
            lock.release()

    code, text = _run(invariant, argv=["train", "--config", "tiny"])
    assert code == 1 and "this is a bug in thinkrl" in text and "5 correct out of 4" in text
    assert "Resume with: thinkrl train --config tiny trainer.resume_mode=auto" in text


def test_setup_errors_from_anywhere_are_the_users():
    from thinkrl.checkpoint.verify import DamagedCheckpoint
    from thinkrl.errors import UserError

    assert is_user_error(SetupError("problem", "fix")) and is_user_error(UserError("problem; fix"))
    assert is_user_error(DamagedCheckpoint("folder: a file is missing"))
    assert not is_user_error(KeyError("x")) and not is_user_error(ValueError("an invariant broke"))


def test_ctrl_c_prints_what_is_kept_and_the_resume_command(tmp_path):
    run_dir = tmp_path / "run"

    def interrupted():
        lock = RunLock.acquire(run_dir)
        _checkpoint(run_dir, 4)
        lock.release()
        raise KeyboardInterrupt

    code, text = _run(interrupted, argv=["train", "--config", "tiny", "trainer.resume_mode=disable",
                                         f"trainer.default_local_dir={run_dir}"])
    assert code == 130 and "Traceback" not in text
    assert f"Kept: global_step_4, the newest checkpoint in {run_dir}" in text
    assert (f"Resume with: thinkrl train --config tiny trainer.default_local_dir={run_dir} "
            "trainer.resume_mode=auto") in text


def test_ctrl_c_before_any_checkpoint_says_so(tmp_path):
    def interrupted():
        RunLock.acquire(tmp_path).release()
        raise KeyboardInterrupt

    code, text = _run(interrupted, argv=["train"])
    assert code == 130 and "No checkpoint was saved" in text and "thinkrl train" in text


def test_a_stop_exits_1_with_the_resume_line(tmp_path):
    def stopped():
        RunLock.acquire(tmp_path).release()
        _checkpoint(tmp_path, 2)
        raise RunStopped("step 3: the policy is destroyed")

    code, text = _run(stopped)
    assert code == 1 and text.startswith("thinkrl: training stopped: step 3: the policy")
    assert "Resume with: thinkrl train --config tiny trainer.resume_mode=auto" in text


def test_disk_full_is_recognised_in_any_form(tmp_path, monkeypatch):
    import thinkrl.errors as errors

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    # torch.save says "file write failed" for any failed write: a full disk only
    # when the folder it wrote in is (nearly) full; a read-only one fails alike
    torch_save = RuntimeError("[enforce fail at inline_container.cc:595] . "
                              "PytorchStreamWriter failed writing file data/0: file write failed")
    assert not is_disk_full(torch_save) and not is_disk_full(torch_save, folder=tmp_path)
    assert is_failed_write(torch_save)
    monkeypatch.setattr(errors, "free_bytes", lambda folder: 1 << 20)
    assert is_disk_full(torch_save, folder=tmp_path)
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))


def test_disk_full_outside_a_save_names_the_folder(tmp_path):
    def full():
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

    code, text = _run(full, argv=["report", str(tmp_path)])
    assert code == 1 and f"writing in {tmp_path} failed" in text and " free;" in text


def test_a_write_refused_with_space_left_is_not_called_a_full_disk():
    def refused():
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter "
                           "failed writing file data/0: file write failed")

    code, text = _run(refused, argv=["report", "x"])
    assert code == 1 and "not for lack of space" in text and "read-only" in text
    assert "disk is full" not in text and "bug in thinkrl" not in text


def test_resume_argv():
    assert resume_argv(["train"]) == ["train", "--config", "tiny", "trainer.resume_mode=auto"]
    assert resume_argv(["train", "a.b=1", "trainer.resume_mode=resume_path",
                        "trainer.resume_from_path=/x"]) == ["train", "a.b=1", "trainer.resume_mode=auto"]
