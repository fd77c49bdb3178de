"""Faults around the run folder: two runs in one folder, a user's data set
overwritten by `thinkrl prep`.

Each test's docstring is one row of the fault table in docs/reliability.md
(`python bench/fault_table.py` reruns them and prints it): Case, Behaviour, Kept.
"""

from __future__ import annotations

import time

import pytest
from fault_helpers import on_disk, spawn, steps_logged, tiny  # noqa: F401  (fixture)

from thinkrl.checkpoint.lock import LOCK_FILE
from thinkrl.cli import main

pytestmark = pytest.mark.slow

_HOLD = """
import sys, time
from thinkrl.checkpoint.lock import RunLock
lock = RunLock.acquire(sys.argv[1], log=lambda *_: None)
(lock.run_dir / "metrics.jsonl").write_text('{"step": 1}\\n')
print("locked", flush=True)
time.sleep(600)
"""


def test_second_run_into_a_live_runs_folder(tiny, capsys):
    """Case: a second run started into the folder of a live run.
    Behaviour: refused at once (exit 2), naming the holder (pid, host, start) and how to proceed.
    Kept: the live run's files, untouched (no config.yaml, metrics or checkpoint of the second)."""
    import subprocess
    import sys

    run_dir, argv = tiny
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        assert main(argv("trainer.total_training_steps=1", "trainer.save_freq=1")) == 2
        err = capsys.readouterr().err
        assert f"is in use by another thinkrl run (pid {holder.pid} on host" in err
        assert "trainer.experiment_name=<another name>" in err and "Traceback" not in err
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    finally:
        holder.kill()
        holder.wait()


def test_lock_file_deleted_under_a_live_run(tiny, capsys):
    """Case: thinkrl.lock deleted while a run is live (to "unstick" it), then a second run started.
    Behaviour: refused (exit 2): the run folder itself is locked; the message says the lock file was deleted (before: both ran, each step logged twice).
    Kept: the live run's files, untouched."""
    import subprocess
    import sys

    run_dir, argv = tiny
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        (run_dir / LOCK_FILE).unlink()
        before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        assert main(argv("trainer.total_training_steps=1", "trainer.save_freq=1")) == 2
        err = capsys.readouterr().err
        assert "is in use by another thinkrl run" in err and "was deleted while it ran" in err
        after = {p.name: p.read_bytes() for p in run_dir.iterdir()}
        assert after.pop(LOCK_FILE) == b"" and after == before  # only an empty lock file made
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_live_run_on_another_host(tiny, capsys):
    """Case: the run folder on a shared disk holds the lock record of a run on another host, touched 20 s ago.
    Behaviour: refused (exit 2), naming that host's run and its last sign of life, and the file to delete if it is dead (before: taken over with a note).
    Kept: the other host's lock record and every file of the folder."""
    import json
    import os

    run_dir, argv = tiny
    run_dir.mkdir(parents=True, exist_ok=True)
    record = json.dumps({"pid": 4242, "host": "node-7", "started": time.time() - 3600})
    (run_dir / LOCK_FILE).write_text(record)
    os.utime(run_dir / LOCK_FILE, (time.time() - 20, time.time() - 20))
    assert main(argv("trainer.total_training_steps=1")) == 2
    err = capsys.readouterr().err
    assert "pid 4242 on host node-7" in err and "last sign of life 20 s ago" in err
    assert f"delete {run_dir / LOCK_FILE}" in err
    assert (run_dir / LOCK_FILE).read_text() == record
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]


def test_two_runs_started_half_a_second_apart(tiny):
    """Case: the same recipe launched twice, 0.5 s apart, into one folder.
    Behaviour: one trains (exit 0), the other is refused (exit 2) before writing anything.
    Kept: one run's metrics (each step once) and its intact checkpoints; the lock released."""
    run_dir, argv = tiny
    args = argv("trainer.total_training_steps=3", "trainer.save_freq=1")
    first = spawn(args)
    time.sleep(0.5)
    second = spawn(args)
    outputs = [p.communicate(timeout=600) for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 2], outputs
    refused = [err for (_, err), p in zip(outputs, (first, second)) if p.returncode == 2][0]
    assert "is in use by another thinkrl run" in refused
    assert steps_logged(run_dir) == [1, 2, 3]
    assert on_disk(run_dir) == ["global_step_1", "global_step_2", "global_step_3"]
    assert (run_dir / LOCK_FILE).read_text() == ""  # released on exit


def test_prep_over_an_existing_data_set(tmp_path, capsys):
    """Case: `thinkrl prep --output` into a folder that holds a data set.
    Behaviour: refused (exit 2) naming the files; `--overwrite` replaces them.
    Kept: the existing files, byte for byte."""
    out = tmp_path / "data"
    assert main(["prep", "builtin", "--output", str(out)]) == 0
    before = (out / "train.parquet").read_bytes()
    (out / "train.parquet").write_bytes(b"hand-made")
    assert main(["prep", "builtin", "--output", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (out / "train.parquet").read_bytes() == b"hand-made"
    assert main(["prep", "builtin", "--output", str(out), "--overwrite"]) == 0
    assert (out / "train.parquet").read_bytes() == before


def test_truncated_model_weights_at_start(tiny, tiny_model_dir, tmp_path, capsys):
    """Case: the model folder's model.safetensors truncated (a download cut short).
    Behaviour: exit 2 naming the folder and the fix (before: a raw safetensors traceback).
    Kept: the run folder holds only the released lock file."""
    import shutil

    run_dir, argv = tiny
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    assert main([*argv("trainer.total_training_steps=1"), f"actor_rollout_ref.model.path={model}"]) == 2
    err = capsys.readouterr().err
    assert f"actor_rollout_ref.model.path='{model}': cannot load the model" in err
    assert "Re-download" in err and "Traceback" not in err
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]
