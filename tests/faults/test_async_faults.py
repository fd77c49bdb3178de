"""Async training's faults, through real `python -m thinkrl` processes: Ctrl-C
leaves no rollout process behind; kill -9 of either side at a random moment,
then the same command again, gives the metrics of the unbroken run.
Docstrings are rows of docs/reliability.md's fault table."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_helpers import spawn, tiny  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

ASYNC = ("async_training.mode=one_step_off", "async_training.partial_rollout=False",
         "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.save_freq=1")
STEPS = 4


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with open(task / "children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)


def run_to_end(argv: list[str], logs: Path) -> int:
    process = spawn(argv, output=logs)
    try:
        return process.wait(timeout=600)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait()
        raise AssertionError(Path(f"{logs}.err").read_text()[-3000:])


def started(argv: list[str], run_dir: Path, logs: Path) -> tuple[subprocess.Popen, int]:
    """A training process once its first checkpoint is on disk, and its rollout process's pid."""
    process = spawn(argv, output=logs)
    deadline = time.monotonic() + 300
    while not (run_dir / "global_step_1" / "meta.json").exists() and time.monotonic() < deadline:
        assert process.poll() is None, Path(f"{logs}.err").read_text()[-3000:]
        time.sleep(0.2)
    rollout = [c for c in children(process.pid) if "thinkrl-rollout" in _cmdline(c) or _is_spawn(c)]
    assert len(rollout) == 1, [(c, _cmdline(c)) for c in children(process.pid)]
    return process, rollout[0]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    except OSError:
        return ""


def _is_spawn(pid: int) -> bool:
    return "multiprocessing.spawn" in _cmdline(pid)


def records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/", "fully_async/rollouter/"))}
            for r in rows]


def test_ctrl_c_leaves_no_rollout_process(tiny):
    """Case: Ctrl-C to an async (one-step-off) training process after its first checkpoint.
    Behaviour: exit 130 with the resume command; the rollout process is stopped with it.
    Kept: every finished checkpoint; no process left running."""
    run_dir, argv = tiny
    process, rollout = started(argv(*ASYNC, "trainer.total_training_steps=200"), run_dir,
                               run_dir.parent / "train")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 130
    assert gone_within(rollout, 15), f"the rollout process {rollout} outlived the driver"


@pytest.mark.parametrize("side", ["trainer", "rollout"])
def test_kill_9_of_either_side_then_resume_equals_the_unbroken_run(tiny, tmp_path, side):
    """Case: kill -9 of the trainer process, or of the rollout process, of an async
    (one-step-off) run at a random moment after its first checkpoint; then the same command.
    Behaviour: a dead trainer takes its rollout process with it (its pipe closes); a dead
    rollout process stops the run (exit 1) naming it. The second command resumes, and every
    step's metrics equal those of a run never interrupted (the checkpoint keeps the batch in
    flight, generated with the previous step's weights).
    Kept: every finished checkpoint; no process left running."""
    run_dir, argv = tiny
    straight_dir = tmp_path / "straight"
    command = argv(*ASYNC, f"trainer.total_training_steps={STEPS}")
    straight = [a if not a.startswith("trainer.default_local_dir=") else
                f"trainer.default_local_dir={straight_dir}" for a in command]
    assert run_to_end(straight, tmp_path / "straight") == 0
    delay = random.uniform(0.0, 1.5)
    process, rollout = started(command, run_dir, tmp_path / "broken")
    time.sleep(delay)
    try:
        os.kill(process.pid if side == "trainer" else rollout, signal.SIGKILL)
    except ProcessLookupError:  # a fast machine finished the run (and reaped the rollout) first
        pass
    code = process.wait(timeout=300)
    err = Path(f"{tmp_path / 'broken'}.err").read_text()
    assert gone_within(rollout, 15), f"the rollout process outlived a kill -9 of the {side} ({delay:.2f} s)"
    if side == "rollout" and code != 0:  # it may have finished before the kill landed
        assert code == 1 and "thinkrl: a worker failed: the rollout process" in err, err[-3000:]
    assert run_to_end(command, tmp_path / "resumed") == 0
    got, want = records(run_dir), records(straight_dir)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1)), delay
    for a, b in zip(want, got):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-7), (side, f"killed after {delay:.2f} s", a["step"])
