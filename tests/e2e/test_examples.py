"""The examples/ folder runs as the README says (shortened to one step on the
tiny test model): a user's own parquet, reward and verl-style line."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_data"


def _reward():
    spec = importlib.util.spec_from_file_location("example_reward", EXAMPLE / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


def test_the_example_reward_reads_the_last_line_with_numbers():
    score = _reward()
    assert score("sort_numbers", "First 9, then 3.\n3, 9, 41", "3, 9, 41") == 1.0
    assert score("sort_numbers", "3, 9, 41\nso: 41, 9, 3", "3, 9, 41") == 0.0
    assert score("sort_numbers", "no numbers here", "3, 9, 41") == 0.0


@pytest.mark.slow
def test_the_own_data_example_trains_a_step(asset_cache, tiny_model_dir, tmp_path):
    env = {**os.environ, "DATA": str(tmp_path / "data"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", str(EXAMPLE / "run.sh"), f"actor_rollout_ref.model.path={tiny_model_dir}",
         f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.total_training_steps=1",
         "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.progress_bar=False",
         "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_response_length=16"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "data" / "train.parquet").is_file()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1] and "critic/score/mean" in records[0]
