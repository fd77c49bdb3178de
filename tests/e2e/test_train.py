"""End-to-end GRPO runs on a tiny model: every stage, the metrics file, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from thinkrl.cli import main, recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow


def _overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "data.max_response_length=16", "data.val_batch_size=100",
        "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]", *extra,
    ]


def _run(model_dir, run_dir, *extra):
    cfg = load_config(recipe_path("tiny"), _overrides(model_dir, run_dir, *extra))
    result = train(cfg, log=lambda *_: None)
    lines = (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines]


def _without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(("timing_s/", "perf/"))}


def test_two_steps_write_verl_metrics(asset_cache, tiny_model_dir, tmp_path):
    result, records = _run(tiny_model_dir, tmp_path / "run", "trainer.test_freq=2")
    assert [r["step"] for r in records] == [0, 1, 2]  # validation before training, 2 steps
    val_key = "val-core/thinkrl/arith/reward/mean@1"
    assert val_key in records[0] and val_key in records[-1]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
                "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr",
                "response_length/mean", "response_length/clip_ratio", "timing_s/gen",
                "timing_s/reward", "timing_s/ref", "timing_s/update_actor", "timing_s/step",
                "perf/throughput", "critic/advantages/mean"):
        assert key in records[1], key
    assert records[1]["actor/skipped_updates"] == 0
    assert (tmp_path / "run" / "config.yaml").exists()
    assert result.steps == 2


def test_seeded_run_gives_identical_metrics(asset_cache, tiny_model_dir, tmp_path):
    _, first = _run(tiny_model_dir, tmp_path / "a", "trainer.val_before_train=False")
    _, second = _run(tiny_model_dir, tmp_path / "b", "trainer.val_before_train=False")
    # trainer.test_freq=-1 (verl's "never"): no validation during training, the last step too
    assert not [k for r in first for k in r if k.startswith("val-")]
    assert [_without_timing(r) for r in first] == [_without_timing(r) for r in second]


def test_off_policy_update_recomputes_old_logprobs(asset_cache, tiny_model_dir, tmp_path):
    # Two mini-batches and two epochs: four optimizer steps per training step,
    # so from the second on pi differs from pi_old and the ratio moves off 1.
    _, records = _run(tiny_model_dir, tmp_path / "run", "trainer.val_before_train=False",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "actor_rollout_ref.actor.ppo_epochs=2",
                      "actor_rollout_ref.actor.optim.lr=1e-3")
    assert records[0]["timing_s/old_log_prob"] > 0
    assert any(r["actor/ppo_kl"] != 0 for r in records)


def test_cli_without_recipe_starts_from_verl_defaults(capsys):
    # verl's default rollout.n=1 cannot work with GRPO: the error says so.
    assert main(["train", "trainer.total_training_steps=1"]) == 2
    assert "rollout.n" in capsys.readouterr().err


def test_cli_rejects_unknown_key_with_suggestion(capsys):
    code = main(["train", "data.train_batch_sise=4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "data.train_batch_size" in err and "Traceback" not in err


def test_cli_names_missing_data_file(asset_cache, tiny_model_dir, tmp_path, capsys):
    (tmp_path / "train.parquet").write_bytes(b"")
    code = main(["train", "--config", "tiny", f"actor_rollout_ref.model.path={tiny_model_dir}",
                 f"data.train_files={tmp_path / 'trian.parquet'}",
                 f"trainer.default_local_dir={tmp_path / 'run'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "trian.parquet" in err and "train.parquet" in err


def test_new_run_in_an_old_run_folder_keeps_old_metrics(asset_cache, tiny_model_dir, tmp_path):
    _run(tiny_model_dir, tmp_path / "run", "trainer.val_before_train=False")
    _, records = _run(tiny_model_dir, tmp_path / "run", "trainer.val_before_train=False")
    assert [r["step"] for r in records] == [1, 2]  # only the new run's steps
    kept = json.loads((tmp_path / "run" / "metrics.previous-1.jsonl").read_text().splitlines()[0])
    assert kept["step"] == 1


def test_gradient_checkpointing_gives_the_same_update(asset_cache, tiny_model_dir, tmp_path):
    _, plain = _run(tiny_model_dir, tmp_path / "a", "trainer.val_before_train=False")
    _, checkpointed = _run(tiny_model_dir, tmp_path / "b", "trainer.val_before_train=False",
                           "actor_rollout_ref.model.enable_gradient_checkpointing=True")
    for a, b in zip(plain, checkpointed):
        assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)
        assert a["critic/score/mean"] == b["critic/score/mean"]


@pytest.mark.parametrize("kind", ["fixed", "adaptive"])
def test_kl_penalty_in_reward(asset_cache, tiny_model_dir, tmp_path, kind):
    _, records = _run(tiny_model_dir, tmp_path / "run", "trainer.val_before_train=False",
                      "actor_rollout_ref.actor.use_kl_loss=False",
                      "algorithm.use_kl_in_reward=True", f"algorithm.kl_ctrl.type={kind}",
                      "algorithm.kl_ctrl.kl_coef=0.05", "actor_rollout_ref.actor.optim.lr=1e-3")
    assert "actor/kl_loss" not in records[0]
    assert records[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)  # pi = pi_ref
    assert records[1]["actor/reward_kl_penalty"] != 0  # the policy moved after step 1 (k1 may be < 0)
    assert records[0]["actor/reward_kl_penalty_coeff"] == 0.05
    # critic/rewards is after the penalty, critic/score before it
    assert records[0]["critic/rewards/mean"] == pytest.approx(records[0]["critic/score/mean"])
    assert records[1]["critic/rewards/mean"] != records[1]["critic/score/mean"]
    if kind == "adaptive":  # step 1's KL of ~0 < target: beta shrinks
        assert records[1]["actor/reward_kl_penalty_coeff"] < 0.05
    else:
        assert records[1]["actor/reward_kl_penalty_coeff"] == 0.05


def test_bfloat16_compute_keeps_float32_master_weights(asset_cache, tiny_model_dir, tmp_path):
    # Mixed precision on the CPU: forward passes in bfloat16 (autocast), the
    # weights AdamW updates in float32, so small updates are not rounded away.
    from thinkrl.build import build_run
    from thinkrl.trainer import train_step

    cfg = load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, tmp_path / "run", "actor_rollout_ref.model.dtype=bfloat16"))
    run = build_run(cfg, log=lambda *_: None)
    before = [p.detach().clone() for p in run.roles.actor.group.rank.actor.model.parameters()]
    metrics = train_step(run, 1)
    run.close()
    assert all(p.dtype == torch.float32 for p in run.roles.actor.group.rank.actor.model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, run.roles.actor.group.rank.actor.model.parameters()))
    assert metrics["actor/skipped_updates"] == 0


def test_sequence_longer_than_the_model_is_caught_at_start(asset_cache, tiny_model_dir, tmp_path):
    cfg = load_config(recipe_path("tiny"), _overrides(tiny_model_dir, tmp_path / "run",
                                                       "data.max_response_length=1000"))
    with pytest.raises(ValueError, match="max_position_embeddings 512"):
        train(cfg, log=lambda *_: None)


def test_overrides_may_come_before_and_after_the_options(monkeypatch):
    """`thinkrl train a=1 --config tiny b=2`: both are overrides (argparse alone
    would reject b=2)."""
    import thinkrl.commands.train as train_command

    seen = {}
    monkeypatch.setattr(train_command, "run", lambda args: seen.update(vars(args)) or 0)
    assert main(["train", "trainer.seed=3", "--config", "tiny", "trainer.progress_bar=False"]) == 0
    assert seen["config"] == "tiny"
    assert seen["overrides"] == ["trainer.seed=3", "trainer.progress_bar=False"]
    with pytest.raises(SystemExit):
        main(["train", "--config", "tiny", "--no-such-flag"])


def test_cfg_job_prints_the_resolved_config_and_runs_nothing(tmp_path, capsys):
    """verl's `--cfg job`: the config a run would use, as YAML, and its problems."""
    import yaml

    run_dir = tmp_path / "run"
    assert main(["train", "--config", "smol", "--cfg", "job", "actor_rollout_ref.rollout.n=4",
                 f"trainer.default_local_dir={run_dir}"]) == 0
    out, err = capsys.readouterr()
    printed = yaml.safe_load(out)
    assert printed["actor_rollout_ref"]["rollout"]["n"] == 4 and printed["data"]["train_files"] == "builtin:sums/train"
    assert "recipe:" in err and not run_dir.exists()
    assert main(["train", "--cfg", "job", "data.train_batch_size=7"]) == 2
    out, err = capsys.readouterr()
    assert yaml.safe_load(out)["data"]["train_batch_size"] == 7 and "data.train_batch_size=7" in err
