"""On-policy distillation end to end on the pretrained test model (real EOS,
uneven lengths): GRPO + OPD and pure OPD train locally, a wrong teacher stops
the run before any model loads, and 2 Ray ranks score as one process does.
The teacher is the test model's recipe pretrained longer (same tokenizer,
other log-probs). Every Ray wait has a 120 s deadline."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import pretrained_tiny

from thinkrl.build import build_run
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.errors import UserError
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only
TEACHER = "distillation.teacher_models.teacher_model"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> Path:
    """The test model's recipe pretrained four times longer: the same tokenizer
    (trained on the same text), a model further along."""
    return pretrained_tiny(tmp_path_factory.mktemp("teacher") / "teacher", pretrain_steps=60)


def _overrides(model_dir: Path, teacher: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_response_length=32",
            "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.progress_bar=False",
            "trainer.logger=[]", "reward.num_workers=0", "trainer.ray_wait_timeout_s=120",
            "distillation.enabled=True", f"{TEACHER}.model_path={teacher}", *extra]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_plus_opd_trains_with_both_losses(asset_cache, tiny_model_dir, teacher_dir, tmp_path):
    cfg = load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, teacher_dir, tmp_path / "run", "trainer.total_training_steps=2",
        "distillation.distillation_loss.distillation_loss_coef=0.5"))
    train(cfg, log=lambda *_: None)
    for record in _metrics(tmp_path / "run"):
        assert record["distillation/reverse_kl"] > 0.01  # the moved weights disagree
        assert record["timing_s/teacher"] > 0
        assert "actor/pg_loss" in record and "actor/kl_loss" in record  # the task loss is kept
        assert record["distillation/loss"] > 0  # k3, minimised directly


def test_pure_opd_lowers_the_reverse_kl(asset_cache, tiny_model_dir, teacher_dir, tmp_path):
    """No task loss: the student moves toward the teacher on its own samples."""
    cfg = load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, teacher_dir, tmp_path / "run", "trainer.total_training_steps=10",
        "actor_rollout_ref.actor.optim.lr=2e-3", "distillation.distillation_loss.use_task_rewards=False"))
    notes: list[str] = []
    train(cfg, log=notes.append)
    assert any("use_kl_loss=True has no effect" in n for n in notes)  # the recipe's KL loss is dropped
    records = _metrics(tmp_path / "run")
    assert all("actor/pg_loss" not in r and "actor/kl_loss" not in r for r in records)
    kl = [r["distillation/reverse_kl"] for r in records]
    assert sum(kl[-3:]) / 3 < 0.7 * sum(kl[:2]) / 2, kl  # sampled: it falls, not every step


def test_policy_gradient_form_runs_as_thinking_machines_opd(asset_cache, tiny_model_dir, teacher_dir, tmp_path):
    cfg = load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, teacher_dir, tmp_path / "run", "trainer.total_training_steps=1",
        "distillation.distillation_loss.use_task_rewards=False", "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=True", "actor_rollout_ref.actor.use_kl_loss=False"))
    train(cfg, log=lambda *_: None)
    (record,) = _metrics(tmp_path / "run")
    assert "distillation/pg_clipfrac" in record and record["distillation/abs_loss"] > 0


def _broken_teacher(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The test model whose tokenizer gives two tokens each other's ids."""
    out = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model_dir, out)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("problem", ["tokenizer", "missing", "source"])
def test_a_wrong_teacher_stops_the_run_at_start(problem, asset_cache, tiny_model_dir, tmp_path):
    teacher, extra = tiny_model_dir, []
    if problem == "tokenizer":
        teacher = _broken_teacher(tiny_model_dir, tmp_path)
    elif problem == "missing":
        teacher = tmp_path / "no-such-teacher"
    else:  # two teachers keyed to other data sources: the rows of thinkrl/arith have none
        extra = [f"+{TEACHER}.key=openai/gsm8k", "+distillation.teacher_models.math.key=math",
                 f"+distillation.teacher_models.math.model_path={tiny_model_dir}"]
    cfg = load_config(recipe_path("tiny"), _overrides(tiny_model_dir, teacher, tmp_path / "run", *extra))
    with pytest.raises(UserError) as caught:
        build_run(cfg, log=lambda *_: None)
    said = str(caught.value)
    expected = {"tokenizer": "its tokenizer is not the student's", "missing": "there is no folder",
                "source": "rows of data_source thinkrl/arith have no teacher"}[problem]
    assert expected in said, said
    assert (f"{TEACHER}.model_path" in said) or problem == "source"


def test_two_ray_ranks_score_and_train_as_one_process(asset_cache, tiny_model_dir, teacher_dir, tmp_path):
    pytest.importorskip("ray")
    extra = ("trainer.total_training_steps=1", "actor_rollout_ref.model.use_remove_padding=True")
    local = build_run(load_config(recipe_path("tiny"), _overrides(tiny_model_dir, teacher_dir, tmp_path / "l", *extra)),
                      log=lambda *_: None)
    sharded = build_run(load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, teacher_dir, tmp_path / "r", *extra, "trainer.n_gpus_per_node=2")), log=lambda *_: None)
    try:
        rollouts = local.roles.engine.generate(local.state.train_loader.next_batch(), local.spec.sampling)
        lengths = rollouts.response_mask.sum(-1)
        assert lengths.min() < lengths.max()  # uneven: the ranks stop decoding at different steps
        seqs, r = rollouts.sequences(), rollouts.response_ids.shape[1]
        real = rollouts.response_mask.bool()
        # a teacher of some rows only (several teachers) gets counts that do not split over 2 ranks
        for rows in (slice(0, 15), slice(0, 1), slice(None)):
            part = tuple(t[rows] for t in seqs)
            one = local.roles.teachers.compute_teacher_log_prob("teacher_model", *part, response_length=r)
            two = sharded.roles.teachers.compute_teacher_log_prob("teacher_model", *part, response_length=r)
            torch.testing.assert_close(two[real[rows]], one[real[rows]], rtol=0, atol=1e-5)
        student = local.roles.actor.compute_log_prob(*seqs, response_length=r)
        assert (student - one)[real].abs().max() > 1e-3  # the teacher is another model
        from thinkrl.trainer import train_run
        sharded_result = train_run(sharded, log=lambda *_: None)
        assert sharded_result.steps == 1
        (record,) = _metrics(tmp_path / "r")
        assert record["distillation/reverse_kl"] > 0.01 and record["timing_s/teacher"] > 0
        assert "actor/pg_loss" in record  # GRPO + OPD
    finally:
        local.close()
        sharded.close()
    # pure OPD, the policy-gradient form, on the 2 ranks too
    cfg = load_config(recipe_path("tiny"), _overrides(
        tiny_model_dir, teacher_dir, tmp_path / "pure", *extra, "trainer.n_gpus_per_node=2",
        "distillation.distillation_loss.use_task_rewards=False", "distillation.distillation_loss.loss_mode=k1",
        "distillation.distillation_loss.use_policy_gradient=True"))
    train(cfg, log=lambda *_: None)
    (record,) = _metrics(tmp_path / "pure")
    assert "actor/pg_loss" not in record and record["distillation/abs_loss"] > 0


def test_the_opd_recipe_trains_with_the_test_models(asset_cache, tiny_model_dir, teacher_dir, tmp_path):
    """--config opd as written (pure OPD, k1 as the advantage) with the test
    model as the student and the longer-pretrained one as the teacher."""
    cfg = load_config(recipe_path("opd"), [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"{TEACHER}.model_path={teacher_dir}",
        "data.train_files=builtin:arith/train", "data.val_files=builtin:arith/test", "data.val_batch_size=100",
        "data.max_response_length=24", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.val_before_train=False", "trainer.progress_bar=False", "trainer.logger=[]",
        f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.save_freq=-1"])
    assert cfg.distillation.distillation_loss.use_policy_gradient and cfg.distillation.distillation_loss.loss_mode == "k1"
    train(cfg, log=lambda *_: None)
    records = _metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2]
    assert all("distillation/pg_clipfrac" in r and "actor/pg_loss" not in r for r in records)


def test_the_builtin_teacher_is_trained_exported_and_described_once(asset_cache, tiny_model_dir, tmp_path,
                                                                    monkeypatch):
    """The teacher builder on a 1-step recipe of the test model: the exported
    folder loads, with its tokenizer and a PROVENANCE.json; a second call reuses it."""
    from thinkrl.models import sums_teacher

    recipe = tmp_path / "teacher_recipe.yaml"
    recipe.write_text(f"""
data: {{train_files: builtin:arith/train, val_files: builtin:arith/test, train_batch_size: 4,
       max_prompt_length: 96, max_response_length: 16, val_batch_size: 100}}
actor_rollout_ref:
  model: {{path: {tiny_model_dir}}}
  actor: {{ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 8}}
  rollout: {{n: 2}}
trainer: {{val_before_train: false}}
""")
    monkeypatch.setattr(sums_teacher, "RECIPE", str(recipe))
    monkeypatch.setattr(sums_teacher, "STEPS", 1)
    folder = tmp_path / "teacher"
    said: list[str] = []
    assert sums_teacher.build_sums_teacher(folder, log=said.append) == folder
    provenance = json.loads((folder / "PROVENANCE.json").read_text())
    assert provenance["overrides"][:2] == ["trainer.seed=1", "trainer.total_training_steps=1"]
    assert "held_out_after" in provenance and (folder / "grpo_metrics.jsonl").is_file()
    assert not (folder / "grpo-run").exists()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    AutoModelForCausalLM.from_pretrained(folder)
    assert AutoTokenizer.from_pretrained(folder).get_vocab() == AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    said.clear()
    sums_teacher.build_sums_teacher(folder, log=said.append)  # made: nothing trains again
    assert not any("making the built-in teacher" in line for line in said)
