"""LoRA runs end to end on one process: a resumed run equals a straight one,
checkpoints hold only the adapter and its AdamW state, the reference is the
base model, export writes PEFT's adapter folder or the merged model with the
actor's log-probs, eval reads a LoRA checkpoint, and a checkpoint of the other
kind is refused with the fix. The base model's folder is never written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.checkpoint.sharded import OPTIMIZER_FILE
from thinkrl.checkpoint.verify import sha256_file
from thinkrl.cli import main, recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

from train_batches import random_advantage_batch

pytestmark = pytest.mark.slow
pytest.importorskip("peft")
STEPS = 4
LORA = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")


def _config(model_dir: Path, run_dir: Path, *extra: str):
    return load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.shuffle=True",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_response_length=16",
        "data.val_batch_size=100", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.divergence_guard=False",
        f"trainer.total_training_steps={STEPS}", "trainer.test_freq=-1", "trainer.save_freq=1",
        "trainer.val_before_train=False", "trainer.progress_bar=False", "trainer.logger=[]",
        "reward.num_workers=0", *LORA, *extra])


def _records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def straight(asset_cache, tiny_model_dir, tmp_path_factory):
    before = _digests(tiny_model_dir)
    run_dir = tmp_path_factory.mktemp("lora") / "run"
    train(_config(tiny_model_dir, run_dir), log=lambda *_: None)
    assert _digests(tiny_model_dir) == before  # the base folder is only read
    return run_dir


def test_checkpoints_hold_the_adapter_only_and_a_resumed_run_equals_the_straight_one(
        straight, tiny_model_dir, tmp_path):
    last = straight / f"global_step_{STEPS}"
    actor = sorted(p.name for p in (last / "actor").iterdir())
    assert "adapter_config.json" in actor and "adapter_model.safetensors" in actor
    assert not any(name.startswith("model") for name in actor) and not (last / "actor_dcp").exists()
    config = json.loads((last / "actor" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (8, 16)
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    from safetensors.torch import load_file
    adapter = load_file(last / "actor" / "adapter_model.safetensors")
    optimizer = torch.load(last / OPTIMIZER_FILE, weights_only=True)
    assert len(optimizer["state"]) == len(adapter)  # AdamW holds the adapter's moments alone
    assert sum(t.numel() for t in adapter.values()) < 0.2 * (tiny_model_dir / "model.safetensors"
                                                             ).stat().st_size / 4

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copytree(straight / "global_step_2", run_dir / "global_step_2")
    shutil.copy(straight / "metrics.jsonl", run_dir / "metrics.jsonl")
    train(_config(tiny_model_dir, run_dir), log=lambda *_: None)
    assert _records(run_dir) == _records(straight)
    assert [r["step"] for r in _records(run_dir)] == list(range(1, STEPS + 1))


def test_the_reference_is_the_base_model_while_the_adapter_trains(asset_cache, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from thinkrl.models.forward import batched_response_logprobs

    run = build_run(_config(tiny_model_dir, tmp_path / "run"), log=lambda *_: None)
    try:
        rank = run.roles.actor.group.rank
        assert rank.reference.model is rank.actor.model  # no second copy of the model
        rollouts = run.roles.engine.generate(run.state.train_loader.next_batch(), run.spec.sampling)
        seqs, r = rollouts.sequences(), rollouts.response_ids.shape[1]
        old = run.roles.actor.compute_log_prob(*seqs, response_length=r)
        batch = random_advantage_batch(rollouts, old)
        for _ in range(3):
            run.roles.actor.update_policy(batch)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        expected = batched_response_logprobs(base, *seqs, response_length=r, temperature=1.0,
                                             micro_batch_size=64)
        ref = run.roles.reference.compute_ref_log_prob(*seqs, response_length=r)
        new = run.roles.actor.compute_log_prob(*seqs, response_length=r)
        mask = rollouts.response_mask.bool()
        torch.testing.assert_close(ref[mask], expected[mask], rtol=0, atol=1e-6)
        assert (new - ref)[mask].abs().max() > 1e-3  # the adapter trained
        # the merged weights an engine would get give the actor's log-probs
        base.load_state_dict(dict(run.roles.actor.group.rank.actor.weights()))
        merged = batched_response_logprobs(base, *seqs, response_length=r, temperature=1.0,
                                           micro_batch_size=64)
        torch.testing.assert_close(merged[mask], new[mask], rtol=0, atol=1e-5)
    finally:
        run.close()


def test_export_writes_the_adapter_or_the_merged_model_and_eval_reads_the_checkpoint(
        straight, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from thinkrl.models.forward import batched_response_logprobs

    assert main(["export", str(straight), "--out", str(tmp_path / "adapter")]) == 0
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir() if p.name.startswith("adapter")) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert main(["export", str(straight), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()
    assert not (tmp_path / "merged" / "adapter_config.json").exists()

    import peft
    ids = torch.randint(1, 100, (2, 12), generator=torch.Generator().manual_seed(3))
    mask, positions = torch.ones_like(ids), torch.arange(12).expand(2, -1)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    theirs = peft.PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), tmp_path / "adapter")
    got = [batched_response_logprobs(m, ids, mask, positions, response_length=6, temperature=1.0,
                                     micro_batch_size=8) for m in (merged, theirs.base_model.model)]
    torch.testing.assert_close(got[0], got[1], rtol=0, atol=1e-5)

    for name, model in (("checkpoint", straight), ("adapter", tmp_path / "adapter")):
        out = tmp_path / f"eval-{name}"
        assert main(["eval", "--model", str(model), "--data", "builtin:arith/test",
                     "--max-new-tokens", "16", "--out", str(out)]) == 0
        assert json.loads((out / "eval.json").read_text())["samples"] > 0, name


def test_a_checkpoint_of_the_other_kind_is_refused_with_the_fix(straight, tiny_model_dir, tmp_path):
    full = ("actor_rollout_ref.model.lora_rank=0",)
    with pytest.raises(ValueError, match="holds a LoRA adapter .* this run trains every weight"):
        train(_config(tiny_model_dir, tmp_path / "full", "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={straight / 'global_step_2'}", *full),
              log=lambda *_: None)
    from thinkrl.checkpoint.export import export_checkpoint
    full_dir = tmp_path / "full-run"
    train(_config(tiny_model_dir, full_dir, "trainer.total_training_steps=1", *full), log=lambda *_: None)
    with pytest.raises(ValueError, match="holds a fully trained model, not a LoRA adapter"):
        export_checkpoint(full_dir, tmp_path / "x", merge=True, log=lambda *_: None)
    with pytest.raises(ValueError, match=r"trained with other settings \(lora_alpha 16.0 -> 32.0\)"):
        train(_config(tiny_model_dir, tmp_path / "alpha", "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={straight / 'global_step_2'}",
                      "actor_rollout_ref.model.lora_alpha=32"), log=lambda *_: None)
    with pytest.raises(ValueError, match="holds a fully fine-tuned actor, not a LoRA adapter"):
        train(_config(tiny_model_dir, tmp_path / "lora-from-full", "trainer.resume_mode=resume_path",
                      f"trainer.resume_from_path={full_dir / 'global_step_1'}"), log=lambda *_: None)


def test_a_lora_critic_saves_its_adapters_and_head_and_resumes_exactly(asset_cache, tiny_model_dir, tmp_path):
    """PPO with a critic, both with LoRA (critic.model.lora_*): the critic's
    checkpoint is its adapters and value head with their AdamW state, and a
    run resumed at step 2 equals the unbroken one, critic metrics included."""
    def config(run_dir: Path):
        return load_config(recipe_path("ppo"), [
            f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "critic.ppo_mini_batch_size=2", "critic.shuffle=True", "critic.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=1e-2", "critic.model.lora_rank=4", "critic.model.lora_alpha=8", *LORA,
            "data.max_response_length=12", "trainer.val_before_train=False", "trainer.total_training_steps=3",
            "trainer.test_freq=-1", "trainer.save_freq=1", "trainer.progress_bar=False", "trainer.logger=[]",
            "reward.num_workers=0"])

    straight = tmp_path / "straight"
    train(config(straight), log=lambda *_: None)
    critic = straight / "global_step_3" / "critic"
    from safetensors.torch import load_file
    saved = load_file(critic / "adapter_model.safetensors")
    assert "base_model.model.score.weight" in saved and not (critic / "model.safetensors").exists()
    assert all("lora_" in k or ".score." in k for k in saved)  # adapters, the head whole
    state = torch.load(straight / "global_step_3" / "critic_optimizer.pt", weights_only=True)
    assert len(state["state"]) == len(saved)  # AdamW holds the adapters' and the head's moments alone
    assert json.loads((critic / "adapter_config.json").read_text())["r"] == 4

    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(straight / "global_step_2", resumed / "global_step_2")
    shutil.copy(straight / "metrics.jsonl", resumed / "metrics.jsonl")
    train(config(resumed), log=lambda *_: None)
    assert _records(resumed) == _records(straight)
    assert all("critic/vf_loss" in r for r in _records(resumed))
