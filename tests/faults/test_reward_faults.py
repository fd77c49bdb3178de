"""Reward functions that fail hard: a hang at import, a hang on every
response, an exception on every response. Each must stop the run with a
message naming the file or the first error, and save nothing trained on
failed scores. Docstrings are rows of docs/reliability.md's fault table."""

from __future__ import annotations

import textwrap

import pytest
from fault_helpers import on_disk, steps_logged, tiny  # noqa: F401  (fixture)

from thinkrl.checkpoint.lock import LOCK_FILE
from thinkrl.cli import main

pytestmark = pytest.mark.slow

SCORE = "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"


def _reward(tmp_path, text: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_reward_file_hangs_at_import(tiny, tmp_path, capsys):
    """Case: the custom reward file hangs at import (module-level sleep).
    Behaviour: exit 2 after reward.timeout_s, naming the file (before: start-up froze forever).
    Kept: nothing is written to the run folder (only the released lock file)."""
    run_dir, argv = tiny
    path = _reward(tmp_path, "import time\ntime.sleep(1e9)\n" + SCORE + "    return 1.0\n")
    assert main(argv(f"custom_reward_function.path={path}", "reward.timeout_s=1",
                     "trainer.total_training_steps=2", "trainer.save_freq=1")) == 2
    err = capsys.readouterr().err
    assert f"importing custom_reward_function.path={path} within reward.timeout_s=1 s" in err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
    assert (run_dir / LOCK_FILE).read_text() == ""


def test_reward_file_hanging_at_import_stops_the_doctor_too(tiny, tmp_path, capsys):
    """Case: the same file, with the pre-start checks on (no --skip-doctor).
    Behaviour: the doctor's data/reward check imports it in a throwaway process and fails after
    reward.timeout_s naming the file (before: the doctor froze forever); exit 2.
    Kept: nothing is written to the run folder."""
    run_dir, argv = tiny
    path = _reward(tmp_path, "import time\ntime.sleep(1e9)\n" + SCORE + "    return 1.0\n")
    args = [a for a in argv(f"custom_reward_function.path={path}", "reward.timeout_s=1",
                            "trainer.total_training_steps=2") if a != "--skip-doctor"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "data/reward" in err and f"custom_reward_function.path={path}" in err
    assert not run_dir.exists() or sorted(p.name for p in run_dir.iterdir()) in ([], [LOCK_FILE])


def test_reward_hangs_on_every_response(tiny, tmp_path, capsys):
    """Case: the reward function hangs on every response (but the start-up trial's).
    Behaviour: each response stopped at reward.timeout_s until the failures make the breaker certain (9 of
    16 at rate 0.5), the rest left unscored (before: every response waited out); the run stops after step 1 (exit 1).
    Kept: no checkpoint and no metrics of the failed step: nothing was trained on timed-out scores."""
    run_dir, argv = tiny
    path = _reward(tmp_path, "import time\n" + SCORE + "    if solution_str == ground_truth:\n"
                   "        return 1.0  # passes the start-up trial\n    time.sleep(1e9)\n")
    assert main(argv(f"custom_reward_function.path={path}", "reward.timeout_s=0.5",
                     "trainer.total_training_steps=5", "trainer.save_freq=1")) == 1
    err = capsys.readouterr().err
    assert "step 1: the reward function failed on 16 of 16 responses (100 %)" in err
    assert "left unscored once the limit was certain to be passed" in err
    assert "took longer than reward.timeout_s=0.5 s" in err
    assert "No checkpoint was saved" in err  # the resume line
    assert on_disk(run_dir) == [] and steps_logged(run_dir) == []


def test_reward_raises_on_every_response(tiny, tmp_path, capsys):
    """Case: the reward function raises on every response (but the start-up trial's).
    Behaviour: stops after step 1 (exit 1) naming the first error and its row (before: exit 0, val acc 0);
    scoring stops at the 9th error of 16, when the limit is certain to be passed.
    Kept: the checkpoints saved before; nothing trained on failed scores."""
    run_dir, argv = tiny
    path = _reward(tmp_path, SCORE + "    if solution_str == ground_truth:\n"
                   "        return 1.0  # passes the start-up trial\n    raise KeyError('answer')\n")
    assert main(argv(f"custom_reward_function.path={path}", "reward.num_workers=0",
                     "trainer.total_training_steps=5", "trainer.save_freq=1")) == 1
    err = capsys.readouterr().err
    assert "failed on 16 of 16 responses" in err and "reward/errors 9" in err
    assert "7 left unscored once the limit was certain to be passed" in err
    assert "First error: data_source thinkrl/arith, row" in err and "KeyError: 'answer'" in err
    assert on_disk(run_dir) == [] and steps_logged(run_dir) == []


def test_reward_that_raises_on_every_call_stops_the_run_before_step_1(tiny, tmp_path, capsys):
    """Case: the reward function raises on every call (a wrong key in extra_info).
    Behaviour: exit 2 before step 1, naming the file, the row and the error, from trial calls on a row
    per data_source with its gold answer in every format (before: found after a whole step).
    Kept: nothing is written to the run folder."""
    run_dir, argv = tiny
    path = _reward(tmp_path, SCORE + "    return float(extra_info['units'] in solution_str)\n")
    assert main(argv(f"custom_reward_function.path={path}", "trainer.total_training_steps=2")) == 2
    err = capsys.readouterr().err
    assert f"{path} (compute_score) failed on every response of the start-up trial (data_source " \
           "thinkrl/arith, row " in err
    assert "KeyError: 'units'" in err and "Fix the function" in err
    assert not run_dir.exists() or sorted(p.name for p in run_dir.iterdir()) in ([], [LOCK_FILE])


def test_reward_that_hangs_on_every_call_stops_the_run_before_step_1(tiny, tmp_path, capsys):
    """Case: the reward function hangs on every call.
    Behaviour: exit 2 after reward.timeout_s of the start-up trial, naming the file and saying to raise
    reward.timeout_s.
    Kept: nothing is written to the run folder."""
    run_dir, argv = tiny
    path = _reward(tmp_path, "import time\n" + SCORE + "    time.sleep(1e9)\n")
    assert main(argv(f"custom_reward_function.path={path}", "reward.timeout_s=0.5",
                     "trainer.total_training_steps=2")) == 2
    err = capsys.readouterr().err
    assert "failed on every response of the start-up trial" in err
    assert "took longer than reward.timeout_s=0.5 s" in err and "raise reward.timeout_s" in err
    assert not run_dir.exists() or sorted(p.name for p in run_dir.iterdir()) in ([], [LOCK_FILE])
