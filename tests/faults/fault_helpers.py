"""Helpers for the fault tests: a small tiny-model run driven through the
command line (`thinkrl.cli.main`, or a real `python -m thinkrl` process), and
a look at what it left on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from thinkrl.checkpoint.verify import verify_checkpoint

REPO = Path(__file__).resolve().parents[2]


def overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    """A tiny run: 4 prompts x 4 responses of <= 16 tokens per step."""
    return ["--config", "tiny", "--skip-doctor",
            f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "data.max_response_length=16", "data.val_batch_size=100",
            "trainer.val_before_train=False", "trainer.test_freq=-1",
            "trainer.progress_bar=False", "trainer.logger=[]", *extra]


@pytest.fixture
def tiny(asset_cache, tiny_model_dir, tmp_path):
    """(run_dir, argv builder) for a tiny run in tmp_path/run. Imported by
    each test module (a conftest.py here would shadow tests/conftest.py for
    the tests that `from conftest import ...`)."""
    run_dir = tmp_path / "run"
    return run_dir, lambda *extra: ["train", *overrides(tiny_model_dir, run_dir, *extra)]


def steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def on_disk(run_dir: Path) -> list[str]:
    """Checkpoint folders (complete or not) and temporary saves in run_dir."""
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("global_step_"))


def intact(folder: Path) -> bool:
    verify_checkpoint(folder)
    return True


def spawn(argv: list[str], *, output: Path | None = None) -> subprocess.Popen:
    """`python -m thinkrl ARGV` as a user would start it; its stdout and
    stderr go to pipes, or to `output`.out / `output`.err when given (a
    process left running cannot then block on a full pipe). faulthandler is
    on, so SIGABRT makes it print every thread's stack."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]),
           "PYTHONFAULTHANDLER": "1"}
    if output is None:
        out = err = subprocess.PIPE
    else:
        out, err = open(f"{output}.out", "w"), open(f"{output}.err", "w")
    # SIGINT at its default, as a terminal starts a program: a test run launched in
    # the background (`cmd &` in a script, nohup) ignores it, and so would this child,
    # whose Python then never raises KeyboardInterrupt.
    return subprocess.Popen([sys.executable, "-m", "thinkrl", *argv], env=env, text=True,
                            stdout=out, stderr=err, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
