"""The R1-Zero recipe: its keys validate as written, and it trains 2 steps on
the tiny model with the qwen_r1 template and the r1 reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thinkrl.cli import main, recipe_path
from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.data.templates import R1_INSTRUCTION
from thinkrl.trainer import train

pytestmark = pytest.mark.slow


def test_the_recipe_validates_as_written():
    cfg = load_config(recipe_path("r1_zero"), [])
    sizes = validate(cfg)
    assert (cfg.data.template, cfg.reward.scorer) == ("qwen_r1", "r1")
    assert sizes.world_size == 8 and sizes.responses_per_step == 128 * 8


def test_two_steps_on_the_tiny_model(asset_cache, tiny_model_dir, tmp_path):
    data = tmp_path / "data"
    assert main(["prep", "builtin", "--template", "qwen_r1", "--output", str(data)]) == 0
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
        f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
        "trainer.n_gpus_per_node=1", "trainer.device=cpu", "actor_rollout_ref.rollout.name=native",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "data.max_prompt_length=480", "data.max_response_length=16", "data.val_batch_size=100",
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]", "reward.num_workers=1",
        "trainer.generations_log_freq=1", "trainer.log_train_generations=2",
    ]
    cfg = load_config(recipe_path("r1_zero"), overrides)
    result = train(cfg, log=lambda *_: None)
    records = [json.loads(line) for line in
               (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    # The r1 reward reports its two parts; a tiny arithmetic model writes no tags yet.
    assert records[1]["reward/format/mean"] == 0.0
    assert records[1]["reward/errors"] == 0 and records[1]["reward/timeouts"] == 0
    assert any(k.startswith("val-core/") for k in records[0])
    # The model saw MindSpeed-RL's R1-Zero prompt: the default system turn, the
    # instruction opening the user turn, the question after it, and nothing
    # appended (prep --template qwen_r1).
    saved = Path(result.run_dir) / "generations" / "train_step_2.jsonl"
    generations = [json.loads(line) for line in saved.read_text().splitlines()]
    assert len(generations) == 2
    prompt = generations[0]["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                             f"<|im_start|>user\n{R1_INSTRUCTION}\n")
    assert prompt.endswith("<|im_start|>assistant\n") and "####" not in prompt
