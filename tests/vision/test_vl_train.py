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

from train_batches import random_advantage_batch
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
        "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1", "trainer.save_freq=1",
        "trainer.val_before_train=False", "reward.num_workers=0"]
    result = train(load_config(None, overrides), log=lambda *_: None)
    records = _metrics(result)
    assert records[-1]["step"] == 1 and records[-1]["actor/skipped_updates"] == 0
    assert (Path(result.run_dir) / "logs" / "rank_1.log").is_file()  # two Ray ranks ran
    # The vision tower trains but text prompts never reach it: AdamW has no state
    # for it, so the sharded checkpoint has none, and the resume must accept that.
    resumed = train(load_config(None, overrides + ["trainer.total_training_steps=2"]),
                    log=lambda *_: None)
    assert [r["step"] for r in _metrics(resumed)] == [1, 2]


def test_image_and_text_prompts_on_two_ray_ranks_equal_one_process(asset_cache, tiny_vl_dir,
                                                                   tmp_path):
    # Rows with and without images spread over 2 ranks: the frozen tower is
    # gathered with the root, so a rank without images never waits for a
    # gather of its own; log-probs and the update equal one process's.
    import pyarrow.parquet as pq

    from thinkrl.build import build_run
    from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows
    from thinkrl.data.synthetic import INSTRUCTION
    drawn = pq.read_table(write_splits(tmp_path / "img", train=2, test=1)["train"]).to_pylist()
    text = to_verl_rows([Example(question=f"What is {a} + 1?", ground_truth=str(a + 1),
                                 data_source="thinkrl/arith", ability="math") for a in (3, 5)],
                        split="train", instruction=INSTRUCTION)
    for row in text:
        row["images"] = []
    write_rows(drawn + text, tmp_path / "mixed.parquet")

    def cfg(name, *extra):
        return load_config(None, small_run(tiny_vl_dir, tmp_path / name, tmp_path / "mixed.parquet",
                                           tmp_path / "mixed.parquet") + [
            "data.train_batch_size=4", "data.shuffle=False", "data.max_prompt_length=128",
            "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.model.freeze_vision_tower=True", "reward.num_workers=0",
            "trainer.ray_wait_timeout_s=120", *extra])

    local = build_run(cfg("local"), log=lambda *_: None)
    sharded = build_run(cfg("ray", "trainer.n_gpus_per_node=2"), log=lambda *_: None)
    try:
        assert sharded.roles.actor.group.world_size == 2
        prompts = local.state.train_loader.next_batch()
        assert [len(g) for g in prompts.model_inputs.image_grid_thw] == [1, 1, 0, 0]
        rollouts = local.roles.engine.generate(prompts, local.spec.sampling)
        seqs, r = rollouts.sequences(), rollouts.response_ids.shape[1]
        images = {"model_inputs": rollouts.model_inputs}
        old_local = local.roles.actor.compute_log_prob(*seqs, response_length=r, **images)
        old_ray = sharded.roles.actor.compute_log_prob(*seqs, response_length=r, **images)
        torch.testing.assert_close(old_ray, old_local, rtol=0, atol=1e-5)
        ref_ray = sharded.roles.reference.compute_ref_log_prob(*seqs, response_length=r, **images)
        torch.testing.assert_close(ref_ray, old_local, rtol=0, atol=1e-5)
        # the engine of rank 0 alone (prompts 0-1, with images) and rank 1 (text)
        ray_rollouts = sharded.roles.engine.generate(prompts, sharded.spec.sampling)
        assert len(ray_rollouts) == len(rollouts)

        batch = random_advantage_batch(rollouts, old_local)
        m_local = local.roles.actor.update_policy(batch)
        m_ray = sharded.roles.actor.update_policy(batch)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm"):
            assert m_ray[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-7), key
        after = sharded.roles.actor.full_weights()
        for name, tensor in local.roles.actor.group.rank.actor.model.state_dict().items():
            torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-5, msg=name)

        # The sharded checkpoint exports as a VL folder (image-text-to-text class,
        # processor files) holding exactly the trained weights, and evaluates.
        from safetensors.torch import load_file
        from transformers import AutoModelForImageTextToText

        from thinkrl.checkpoint.export import export_checkpoint
        from thinkrl.checkpoint.state import save_checkpoint
        from thinkrl.commands.eval import run_eval
        from thinkrl.run import Progress
        folder = save_checkpoint(sharded, Progress(step=1), log=lambda *_: None)
        assert (folder / "actor_dcp").is_dir()
        exported = export_checkpoint(folder, tmp_path / "hf", log=lambda *_: None)
        assert (exported / "preprocessor_config.json").is_file()
        assert load_file(exported / "model.safetensors")  # one file, in the hub's names
        model = AutoModelForImageTextToText.from_pretrained(exported)
        assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, after[name]), name
        result, settings = run_eval(cfg("eval", f"actor_rollout_ref.model.path={folder}",
                                        "data.val_batch_size=4"), log=lambda *_: None)
        assert len(result.generations) == 4 * result.n and "val-core/" in " ".join(result.metrics())
    finally:
        local.close()
        sharded.close()
