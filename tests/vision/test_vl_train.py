"""GRPO steps with a tiny Qwen2.5-VL: image prompts, GSM8K text, seed 004's line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from thinkrl.cli import main
from thinkrl.config import load_config
from thinkrl.data.image_arith import write_splits
from thinkrl.data.prep import PrepRequest, prepare
from thinkrl.report import render_report
from thinkrl.trainer import train

from vl_helpers import SEED_004, SHARED, seed_004_overrides, small_run

pytestmark = pytest.mark.slow
GSM8K = SHARED / "data" / "gsm8k"


def _metrics(result) -> list[dict]:
    lines = (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def gsm8k_files(tmp_path_factory) -> dict[str, Path]:
    if not (GSM8K / "train.jsonl").is_file():
        pytest.skip("../shared/data/gsm8k is absent")
    raw, out = tmp_path_factory.mktemp("gsm8k-raw"), tmp_path_factory.mktemp("gsm8k")
    # The first rows of each split: the real text, few enough to validate on quickly.
    for split, rows in (("train", 8), ("test", 4)):
        lines = (GSM8K / f"{split}.jsonl").read_text().splitlines()[:rows]
        (raw / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    written = prepare(PrepRequest(source="gsm8k", output=out, inputs=[str(raw)]))
    return {w.split: w.path for w in written}


def test_two_grpo_steps_on_image_prompts(asset_cache, tiny_vl_dir, tmp_path):
    files = write_splits(tmp_path / "data", train=4, test=2, seed=1)
    overrides = small_run(tiny_vl_dir, tmp_path / "run", files["train"], files["test"]) + [
        "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "data.max_prompt_length=128", "actor_rollout_ref.actor.use_kl_loss=True",
        # two optimizer steps per step: the old-policy log-prob pass runs on images too
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.model.freeze_vision_tower=True",
        # A random model scores 0 everywhere (no policy gradient): the entropy
        # bonus gives every weight, the tower's too if it were not frozen, a gradient.
        "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.optim.lr=1e-3",
        "trainer.log_train_generations=2", "trainer.log_val_generations=2",
        "trainer.generations_log_freq=1",
        "trainer.save_freq=2"]
    result = train(load_config(None, overrides), log=lambda *_: None)
    records = _metrics(result)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert "val-core/thinkrl/arith/reward/mean@1" in records[0]
    for record in records[1:]:
        assert record["actor/skipped_updates"] == 0
        assert record["actor/kl_loss"] >= 0
    # The first mini-batch of a step is still on-policy: pi_old = pi there, so
    # its clipped fraction can only come from the second one.
    assert records[1]["actor/pg_clipfrac"] <= 0.5
    run_dir = Path(result.run_dir)
    # model.freeze_vision_tower: the tower's weights are the initial ones, the rest moved.
    before = load_file(tiny_vl_dir / "model.safetensors")
    after = load_file(run_dir / "global_step_2" / "actor" / "model.safetensors")
    tower = [name for name in before if ".visual." in f".{name}"]
    assert tower and all(torch.equal(before[name], after[name]) for name in tower)
    assert any(not torch.equal(before[name], after[name]) for name in before if name not in tower)
    # Generation logs carry the prompt's image as a thumbnail; the report shows it.
    for name in ("train_step_1.jsonl", "val_step_0.jsonl"):
        saved = [json.loads(line) for line in (run_dir / "generations" / name).open()]
        assert saved and all(g["images"][0].startswith("data:image/png;base64,") for g in saved)
        assert all("<image>" in g["prompt"] for g in saved)
    page = render_report(run_dir).html.read_text()
    assert page.count('<img class="thumb"') >= 2
    # The checkpoint holds the image processor: `thinkrl eval` on it reads image rows.
    assert (run_dir / "global_step_2" / "actor" / "preprocessor_config.json").is_file()
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run_dir), "--data", str(files["test"]),
                 "--max-new-tokens", "4", "--out", str(out), "trainer.device=cpu"]) == 0
    evaluated = [json.loads(line) for line in (out / "generations.jsonl").open()]
    assert len(evaluated) == 2 and all(g["images"] for g in evaluated)


def test_two_grpo_steps_on_gsm8k_text(asset_cache, tiny_vl_dir, gsm8k_files, tmp_path):
    overrides = small_run(tiny_vl_dir, tmp_path / "run", gsm8k_files["train"],
                          gsm8k_files["test"]) + [
        "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=False",
        "data.max_prompt_length=1024", "data.filter_overlong_prompts=True",
        "actor_rollout_ref.actor.use_kl_loss=True"]
    result = train(load_config(None, overrides), log=lambda *_: None)
    records = _metrics(result)
    assert [r["step"] for r in records[:2]] == [1, 2]
    assert all(r["actor/skipped_updates"] == 0 for r in records[:2])


def test_seed_004_launch_line_runs_one_step(asset_cache, tiny_vl_dir, gsm8k_files, tmp_path):
    if SEED_004 is None:
        pytest.skip("../shared/seeds is absent")
    line = seed_004_overrides()
    assert "actor_rollout_ref.model.path=/models/Qwen2.5-VL-7B-Instruct" in line
    assert "data.image_key=images" in line
    # The seed's line, then only what points it at this machine (later keys win).
    overrides = line + small_run(tiny_vl_dir, tmp_path / "run", gsm8k_files["train"],
                                 gsm8k_files["test"]) + ["trainer.total_training_steps=1"]
    cfg = load_config(None, overrides)
    assert cfg.trainer.total_epochs == 15 and cfg.data.max_prompt_length == 1024
    result = train(cfg, log=lambda *_: None)
    records = _metrics(result)
    assert records[-1]["step"] == 1 and result.steps == 1


def test_seed_004_text_prompts_on_two_ray_ranks(asset_cache, tiny_vl_dir, gsm8k_files, tmp_path):
    # Seed 004 runs 8 devices: text prompts on a VL model shard with FSDP2 over
    # Ray ranks like a causal LM (the vision tower's blocks are never called).
    pytest.importorskip("ray")
    if SEED_004 is None:
        pytest.skip("../shared/seeds is absent")
    overrides = seed_004_overrides() + small_run(
        tiny_vl_dir, tmp_path / "run", gsm8k_files["train"], gsm8k_files["test"]) + [
        "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1",
        "trainer.val_before_train=False", "reward.num_workers=0"]
    result = train(load_config(None, overrides), log=lambda *_: None)
    records = _metrics(result)
    assert records[-1]["step"] == 1 and records[-1]["actor/skipped_updates"] == 0
    assert (Path(result.run_dir) / "logs" / "rank_1.log").is_file()  # two Ray ranks ran
