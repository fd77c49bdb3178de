"""Every algorithm recipe in thinkrl/recipes trains 2 steps end to end on the tiny test model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow

ALGORITHM_RECIPES = ["dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                     "grpo_passk", "gpg", "remax", "dapo", "gspo", "sapo", "clip_cov", "kl_cov", "gmpo", "cispo",
                     "ppo"]

# The tiny test model rarely solves a problem, so every group would score 0 and DAPO's
# dynamic sampling would find no group to keep: this reward varies with the response instead.
PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2)
'''


def test_every_bundled_algorithm_recipe_is_tested():
    bundled = {p.stem for p in Path(recipe_path("tiny")).parent.glob("*.yaml")}
    # calculator: tests/faults/test_multi_turn_run.py; smol, gym: tests/models/test_smollm2.py;
    # opd: tests/distill/test_distill_run.py
    assert bundled - {"tiny", "r1_zero", "calculator", "smol", "gym", "opd"} == set(ALGORITHM_RECIPES)


@pytest.mark.parametrize("recipe", ALGORITHM_RECIPES)
def test_recipe_trains_two_steps(recipe, tiny_run, tmp_path):
    overrides = [*tiny_run, "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                 "data.max_response_length=16", "data.val_batch_size=100",
                 "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=False",
                 "trainer.progress_bar=False", "trainer.logger=[]"]
    if recipe == "dapo":
        reward = tmp_path / "parity_reward.py"
        reward.write_text(PARITY_REWARD)
        overrides += ["data.gen_batch_size=4", f"custom_reward_function.path={reward}",
                      "reward_model.overlong_buffer.len=4", "reward_model.overlong_buffer.log=True"]
    result = train(load_config(recipe_path(recipe), overrides), log=lambda *_: None)
    records = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["actor/skipped_updates"] == 0
        assert record["actor/grad_norm"] == record["actor/grad_norm"]  # not NaN
        assert "actor/pg_loss" in record and "critic/advantages/mean" in record
    if recipe == "ppo":
        for record in records:  # verl's critic metrics, and the critic's own update
            assert record["critic/grad_norm"] == record["critic/grad_norm"] and record["critic/lr"] == 2e-3
            for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/values/mean",
                        "critic/returns/max", "critic/vf_explained_var", "timing_s/values", "timing_s/update_critic"):
                assert key in record, key
    if recipe == "remax":
        assert all(r["timing_s/gen_max"] > 0 for r in records)
    if recipe == "dapo":
        for record in records:
            assert record["train/num_gen_batches"] >= 1
            assert record["train/num_kept_prompts"] >= 4  # at least train_batch_size groups found
            assert "reward/overlong_reward/mean" in record
