"""Tests that see learning go the right way, on the pretrained tiny model
(its own EOS, uneven lengths): one update raises the log-probability of
responses with a positive advantage and lowers it for negative ones, through
the real stages (engine, actor, mini-batches, loss); and a short seeded run
raises its training reward. Each fails when the advantage's sign is flipped
anywhere on the way (checked once by flipping it in the trainer and in the
loss: the run is stopped by the divergence guard, the update moves the
wrong way)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.records import TrainBatch
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
ARR = "actor_rollout_ref"
DIGITS = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
          "    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))\n")


def _overrides(model_dir: Path, run_dir: Path, reward: Path, steps: int) -> list[str]:
    reward.write_text(DIGITS)
    return [f"{ARR}.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=8", f"{ARR}.rollout.n=8", f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=64", f"{ARR}.actor.optim.lr=1e-3",
            "data.max_response_length=24", f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.progress_bar=False", "trainer.logger=[]", f"custom_reward_function.path={reward}"]


def test_one_update_raises_the_positive_responses_and_lowers_the_negative(asset_cache, tiny_model_dir,
                                                                         tmp_path):
    cfg = load_config(recipe_path("tiny"), _overrides(tiny_model_dir, tmp_path / "run", tmp_path / "r.py", 1))
    run = build_run(cfg, log=lambda *_: None)
    try:
        rollouts = run.roles.engine.generate(run.state.train_loader.next_batch(), run.spec.sampling)
        seqs, r = rollouts.sequences(), rollouts.response_ids.shape[1]
        mask = rollouts.response_mask.float()
        assert len(set(mask.sum(-1).tolist())) > 1  # uneven lengths: some responses end at EOS
        before = run.roles.actor.compute_log_prob(*seqs, response_length=r)
        sign = torch.tensor([1.0, -1.0]).repeat(len(rollouts) // 2)[:, None]  # alternate +1 / -1
        batch = TrainBatch(*seqs, response_mask=mask, advantages=sign * mask, old_logprobs=before,
                           ref_logprobs=before, model_inputs=rollouts.model_inputs)
        run.roles.actor.update_policy(batch)
        after = run.roles.actor.compute_log_prob(*seqs, response_length=r)
    finally:
        run.close()
    change = ((after - before) * mask).sum(-1)  # per response: log pi(y) after - before
    positive, negative = change[sign[:, 0] > 0], change[sign[:, 0] < 0]
    assert positive.mean() > 0 > negative.mean(), (positive, negative)
    assert (positive > 0).float().mean() >= 0.75 and (negative < 0).float().mean() >= 0.75


def test_a_short_seeded_run_raises_its_training_reward(asset_cache, tiny_model_dir, tmp_path):
    """A reward the tiny model can earn quickly (the share of digits in the
    response): 10 GRPO steps raise it, last three steps against the first three."""
    run_dir = tmp_path / "run"
    train(load_config(recipe_path("tiny"), _overrides(tiny_model_dir, run_dir, tmp_path / "r.py", 10)),
          log=lambda *_: None)
    scores = [json.loads(line)["critic/score/mean"] for line in (run_dir / "metrics.jsonl").open()]
    assert len(scores) == 10
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert last > first + 0.03, scores
