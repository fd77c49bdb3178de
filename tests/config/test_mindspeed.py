"""MindSpeed-RL trainer configs as thinkrl input: both real files of seed 000
(../shared/seeds/mindspeed_rl) translate key by key, every key mapped or
explained; unknown keys are refused with the closest known; the convert
command writes a recipe that loads to the same run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from thinkrl.cli import main
from thinkrl.config import config_to_dict, load_config
from thinkrl.config.checks import validate
from thinkrl.config.mindspeed import is_mindspeed_file, translate_file

ARR = "actor_rollout_ref"


@pytest.fixture(scope="module")
def seeds() -> Path:
    from conftest import SHARED_DATA

    folder = SHARED_DATA.parent / "seeds" / "mindspeed_rl"
    if not folder.is_dir():
        pytest.skip("../shared/seeds/mindspeed_rl is absent")
    return folder


@pytest.fixture
def copied(seeds, tmp_path) -> Path:
    """The seed's config folder, copied so a test may edit it."""
    shutil.copytree(seeds, tmp_path / "configs", ignore=shutil.ignore_patterns("*.md"))
    return tmp_path / "configs"


def _file_keys(path: Path) -> set[str]:
    """Every leaf key of a MindSpeed-RL file and of its model file, as the table names them."""
    raw = yaml.safe_load(path.read_text())
    keys = {"defaults.model"}
    for section, body in raw.items():
        if section == "defaults":
            continue
        for key, value in body.items():
            if key == "sampling_config":
                keys.update(f"{section}.{key}.{sub}" for sub in value)
            else:
                keys.add(f"{section}.{key}")
    model = yaml.safe_load((path.parent / "model" / "qwen25_7b.yaml").read_text())["qwen25_7b"]
    keys.update(f"model/qwen25_7b.yaml:{key}" for key in model)
    return keys


@pytest.mark.parametrize("name", ["grpo_trainer_qwen25_7b.yaml", "r1_zero_qwen25_7b.yaml"])
def test_every_key_of_both_files_is_mapped_or_explained(seeds, name):
    path = seeds / name
    assert is_mindspeed_file(path)
    translation = translate_file(path)
    rows = {row.key: row for row in translation.rows}
    assert len(rows) == len(translation.rows)  # one row per key
    assert set(rows) == _file_keys(path)  # none dropped, none invented
    for row in translation.rows:
        assert row.settings or row.note, row.key  # mapped, or the reason it is not
    table = translation.table()
    assert all(f"  {key} = " in table for key in rows)
    validate(load_config(None, translation.overrides()))  # the 8-NPU layout validates as is


# The grpo_trainer_qwen25_7b.yaml rows that set thinkrl keys, by hand from the
# file: (MindSpeed-RL key) -> {thinkrl key: value}.
GRPO_MAPPED = {
    "megatron_training.bf16": {f"{ARR}.model.dtype": "auto"},
    "megatron_training.tokenizer_name_or_path": {f"{ARR}.model.path": "./data/models/Qwen2.5-7B"},
    "megatron_training.global_batch_size": {"data.train_batch_size": 4},
    "megatron_training.save_interval": {"trainer.save_freq": 10000},
    "megatron_training.train_iters": {"trainer.total_training_steps": 1000},
    "megatron_training.stage": {"algorithm.adv_estimator": "grpo"},
    "megatron_training.data_path": {"data.train_files": "./dataset/data/train.parquet",
                                    "data.val_files": "./dataset/data/train.parquet",
                                    "data.template": "qwen_r1"},
    "megatron_training.split": {"trainer.val_before_train": False, "trainer.test_freq": -1},
    "actor_config.micro_batch_size": {f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 1},
    "actor_config.lr": {f"{ARR}.actor.optim.lr": 1e-7},
    "actor_config.lr_decay_style": {f"{ARR}.actor.optim.warmup_style": "constant"},
    "actor_config.min_lr": {f"{ARR}.actor.optim.min_lr_ratio": 0.0},
    "actor_config.weight_decay": {f"{ARR}.actor.optim.weight_decay": 0.0},
    "actor_config.lr_warmup_fraction": {f"{ARR}.actor.optim.lr_warmup_steps_ratio": 0.0},
    "actor_config.clip_grad": {f"{ARR}.actor.grad_clip": 10000.0},
    "actor_config.adam_beta1": {f"{ARR}.actor.optim.betas": [0.9, 0.999]},
    "actor_config.adam_beta2": {f"{ARR}.actor.optim.betas": [0.9, 0.999]},
    "actor_config.save": {"trainer.default_local_dir": "./ckpt"},
    "ref_config.micro_batch_size": {f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": 1},
    "rl_config.gamma": {"algorithm.gamma": 1.0},
    "rl_config.lam": {"algorithm.lam": 0.95},
    "rl_config.adv_estimator": {"algorithm.adv_estimator": "grpo",
                                "algorithm.norm_adv_by_std_in_grpo": True,
                                f"{ARR}.actor.loss_agg_mode": "token-mean"},
    "rl_config.kl_penalty": {f"{ARR}.actor.kl_loss_type": "kl"},
    "rl_config.init_kl_coef": {f"{ARR}.actor.use_kl_loss": True, f"{ARR}.actor.kl_loss_coef": 0.05,
                               "algorithm.use_kl_in_reward": False},
    # 4 prompts per data-parallel rank; actor 4 NPUs / (TP4 x PP1) = 1 rank
    "rl_config.mini_batch_size": {f"{ARR}.actor.ppo_mini_batch_size": 4},
    # MindSpeed-RL's datasets drop longer prompts (verl's default truncation=error would stop)
    "rl_config.max_prompt_length": {"data.max_prompt_length": 256, "data.filter_overlong_prompts": True},
    "rl_config.epochs": {f"{ARR}.actor.ppo_epochs": 1},
    "rl_config.clip_ratio": {f"{ARR}.actor.clip_ratio": 0.2},
    "rl_config.entropy_coeff": {f"{ARR}.actor.entropy_coeff": 0.001},
    "rl_config.shuffle_mini_batch": {f"{ARR}.actor.shuffle": False},
    "rl_config.n_samples_per_prompt": {f"{ARR}.rollout.n": 2},
    # MindSpeed-RL's default verifier_function / verifier_weight
    "rl_config.rule_reward": {"reward.verifiers": ["base_acc"], "reward.verifier_weights": [1.0]},
    "rl_config.actor_resource": {"trainer.n_gpus_per_node": 4, "trainer.nnodes": 1,
                                 "trainer.device": "npu"},
    "generate_config.trust_remote_code": {f"{ARR}.model.trust_remote_code": True},
    "generate_config.infer_tensor_parallel_size": {f"{ARR}.rollout.tensor_model_parallel_size": 4,
                                                   f"{ARR}.rollout.name": "vllm"},
    "generate_config.infer_pipeline_parallel_size": {
        f"{ARR}.rollout.pipeline_model_parallel_size": 1},
    "generate_config.max_num_seqs": {f"{ARR}.rollout.max_num_seqs": 16},
    "generate_config.max_model_len": {f"{ARR}.rollout.max_model_len": 4096},
    "generate_config.dtype": {f"{ARR}.rollout.dtype": "bfloat16"},
    "generate_config.gpu_memory_utilization": {f"{ARR}.rollout.gpu_memory_utilization": 0.6},
    "generate_config.offload_train_optimizer": {f"{ARR}.actor.fsdp_config.optimizer_offload": True},
    "generate_config.offload_train_param": {f"{ARR}.actor.fsdp_config.param_offload": True},
    "generate_config.sampling_config.max_tokens": {"data.max_response_length": 256},
    "generate_config.sampling_config.top_p": {f"{ARR}.rollout.top_p": 0.9},
    "generate_config.sampling_config.top_k": {f"{ARR}.rollout.top_k": 50},
    "generate_config.sampling_config.min_p": {f"{ARR}.rollout.min_p": 0.01},
    "generate_config.sampling_config.temperature": {f"{ARR}.rollout.temperature": 0.9},
}
# ... and the rows whose behaviour thinkrl does not reproduce (flagged `!!`)
GRPO_DIFFERS = {"rl_config.rule_reward", "rl_config.reference_resource",
                "rl_config.reward_resource"}


def test_grpo_trainer_translation_key_by_key(seeds):
    translation = translate_file(seeds / "grpo_trainer_qwen25_7b.yaml")
    mapped = {row.key: row.settings for row in translation.rows if row.settings}
    assert mapped == GRPO_MAPPED
    assert {row.key for row in translation.rows if row.differs} == GRPO_DIFFERS
    explained = {row.key: row.note for row in translation.rows if not row.settings}
    assert "hf2mcore" in explained["actor_config.tensor_model_parallel_size"]
    assert "Megatron kernel/fusion" in explained["megatron_training.use_fused_rmsnorm"]
    assert "config.json" in explained["model/qwen25_7b.yaml:num_layers"]
    lines = translation.table().splitlines()
    assert any(l.strip().startswith("rl_config.rule_reward = False") and " !! " in l for l in lines)
    assert any(l.strip().startswith("megatron_training.use_flash_attn = True") and " -- " in l
               for l in lines)


def test_r1_zero_translation_of_what_differs_from_grpo_trainer(seeds):
    settings = translate_file(seeds / "r1_zero_qwen25_7b.yaml").settings
    assert settings[f"{ARR}.actor.optim.lr"] == 5e-7  # YAML's text "5e-7" read as a number
    assert settings[f"{ARR}.actor.optim.warmup_style"] == "cosine"
    assert settings[f"{ARR}.actor.optim.min_lr_ratio"] == pytest.approx(0.1)  # 5e-8 / 5e-7
    assert settings[f"{ARR}.actor.optim.betas"] == [0.9, 0.95]
    # mini_batch_size 512 prompts x 1 rank (8 NPUs / TP2 x PP4) > 64 per step: one update
    assert settings[f"{ARR}.actor.ppo_mini_batch_size"] == 64
    assert (settings["reward.verifiers"], settings["reward.verifier_weights"]) == (["base_acc"], [1.0])
    assert (settings["reward.num_workers"], settings["reward.timeout_s"]) == (4, 120)
    assert settings["trainer.logger"] == ["console", "tensorboard"]
    assert settings[f"{ARR}.rollout.engine_kwargs.vllm.num_scheduler_steps"] == 1
    assert (settings["trainer.n_gpus_per_node"], settings[f"{ARR}.rollout.n"]) == (8, 8)


def test_user_overrides_win_and_a_plain_recipe_is_not_translated(seeds, capsys):
    from thinkrl.commands.common import load_run_config, recipe_path

    cfg = load_run_config(str(seeds / "grpo_trainer_qwen25_7b.yaml"),
                          ["trainer.device=cpu", "data.train_batch_size=8"], log=print)
    assert (cfg.trainer.device, cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (
        "cpu", 8, 2)
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-7  # a number, though JSON writes "1e-07"
    assert "rl_config.n_samples_per_prompt = 2" in capsys.readouterr().out  # the table, at start
    assert not is_mindspeed_file(recipe_path("r1_zero"))


def test_unknown_keys_name_the_closest_known(copied):
    path = copied / "grpo_trainer_qwen25_7b.yaml"
    text = path.read_text().replace("  global_batch_size: 4", "  global_batch_sise: 4")
    text = text.replace("  clip_ratio: 0.2", "  clip_ration: 0.2")
    path.write_text(text + "\nrl_confg:\n  x: 1\n")
    with pytest.raises(ValueError) as err:
        translate_file(path)
    message = str(err.value)
    assert "3 key(s) thinkrl cannot translate" in message
    assert "unknown key megatron_training.global_batch_sise; did you mean global_batch_size" in message
    assert "unknown key rl_config.clip_ration; did you mean clip_ratio" in message
    assert "unknown section 'rl_confg'; did you mean rl_config" in message


def test_the_model_file_must_be_next_to_the_config(copied):
    (copied / "model" / "qwen25_7b.yaml").unlink()
    with pytest.raises(ValueError, match="defaults names model 'qwen25_7b', but .*model/qwen25_7b"
                                         ".yaml does not exist"):
        translate_file(copied / "grpo_trainer_qwen25_7b.yaml")


def test_stage_other_than_grpo_is_refused(copied):
    path = copied / "grpo_trainer_qwen25_7b.yaml"
    path.write_text(path.read_text().replace("stage: ray_grpo", "stage: ray_ppo"))
    with pytest.raises(ValueError, match="stage=ray_ppo: thinkrl translates GRPO recipes"):
        translate_file(path)


def test_config_convert_writes_a_recipe_that_loads_to_the_same_run(seeds, tmp_path, capsys):
    out = tmp_path / "thinkrl.yaml"
    source = seeds / "r1_zero_qwen25_7b.yaml"
    assert main(["config", "convert", str(source), "--out", str(out)]) == 0
    assert "rl_config.verifier_function" in capsys.readouterr().out
    text = out.read_text()
    assert text.startswith("# Written by `thinkrl config convert")
    assert "#   actor_config.pipeline_model_parallel_size = 4" in text  # the table, as comments
    direct = load_config(None, translate_file(source).overrides())
    assert config_to_dict(load_config(out)) == config_to_dict(direct)


def test_absent_keys_take_mindspeed_rl_defaults(copied):
    path = copied / "grpo_trainer_qwen25_7b.yaml"
    text = path.read_text().replace("  init_kl_coef: 0.05\n", "").replace("  rule_reward: false\n", "")
    path.write_text(text)
    rows = {row.key: row for row in translate_file(path).rows}
    # rl_config.py: init_kl_coef 0.01 (with thinkrl's KL loss on), rule_reward True, base_acc
    assert rows["rl_config.init_kl_coef (default)"].settings[f"{ARR}.actor.kl_loss_coef"] == 0.01
    assert rows["rl_config.rule_reward (default)"].settings == {
        "reward.verifiers": ["base_acc"], "reward.verifier_weights": [1.0]}
    assert not rows["rl_config.rule_reward (default)"].differs
