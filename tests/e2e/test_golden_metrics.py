"""A seeded tiny run against metrics committed from an earlier release.

golden_metrics.json holds the metrics of 3 seeded steps (validation before
training, KL loss, two mini-batches per step so the old-log-prob pass runs)
as thinkrl 2f1ea49 wrote them, before the roles were rebuilt per rank for
the ray backend. A refactor that changes any number fails here at once;
a change meant to alter the numbers rewrites the file and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
GOLDEN = Path(__file__).with_name("golden_metrics.json")


def test_seeded_run_reproduces_the_golden_metrics(asset_cache, tiny_model_dir, tmp_path):
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={tmp_path}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "data.max_response_length=16",
        "data.val_batch_size=100", "trainer.total_training_steps=3", "trainer.test_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]", "reward.num_workers=0"]
    train(load_config(recipe_path("tiny"), overrides), log=lambda *_: None)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    golden = json.loads(GOLDEN.read_text())
    assert len(records) == len(golden)
    for got, want in zip(records, golden):
        for key, value in want.items():
            # float32 on one CPU kind; 1e-6 leaves room for another BLAS build only
            assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (want["step"], key)
