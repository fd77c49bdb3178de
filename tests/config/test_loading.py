"""Loading: defaults < YAML recipe < overrides, typed values, helpful errors."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from thinkrl.config import Config, load_config
from thinkrl.config.loading import config_to_dict, flatten_keys

# verl's GRPO example launch line (examples/grpo_trainer, geo3k), as typed in a shell.
VERL_SEED_LINE = """
algorithm.adv_estimator=grpo data.train_files=/workspace/verl/gsm8k/train.parquet
data.val_files=/workspace/verl/gsm8k/test.parquet data.train_batch_size=512 data.max_prompt_length=1024
data.max_response_length=2048 data.filter_overlong_prompts=True data.truncation='error' data.image_key=images
actor_rollout_ref.model.path=/models/Qwen2.5-VL-7B-Instruct actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=32
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 actor_rollout_ref.actor.use_kl_loss=True
actor_rollout_ref.actor.kl_loss_coef=0.01 actor_rollout_ref.actor.kl_loss_type=low_var_kl
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.use_torch_compile=False
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.tensor_model_parallel_size=4 actor_rollout_ref.rollout.name=vllm
+actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True
actor_rollout_ref.rollout.gpu_memory_utilization=0.5 actor_rollout_ref.rollout.enable_chunked_prefill=False
actor_rollout_ref.rollout.enforce_eager=True actor_rollout_ref.rollout.free_cache_engine=True
actor_rollout_ref.rollout.n=5 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.use_kl_in_reward=False trainer.critic_warmup=0
trainer.logger=console trainer.project_name='verl_grpo_example_geo3k'
trainer.experiment_name='qwen2_5_vl_7b_function_rm' trainer.n_gpus_per_node=8 trainer.nnodes=1
trainer.save_freq=-1 trainer.test_freq=-1 trainer.total_epochs=15 trainer.device=npu
"""
SEED_WITH_QUOTES = VERL_SEED_LINE.split()  # as a Python list keeps them
SEED_AS_SHELL_PASSES_IT = shlex.split(VERL_SEED_LINE)  # the shell strips them


@pytest.mark.parametrize("overrides", [SEED_WITH_QUOTES, SEED_AS_SHELL_PASSES_IT], ids=["quoted", "shell"])
def test_verl_seed_line_lands_typed(overrides: list[str]) -> None:
    cfg = load_config(None, overrides)
    arr = cfg.actor_rollout_ref
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.data.train_files == "/workspace/verl/gsm8k/train.parquet"
    assert cfg.data.val_files == "/workspace/verl/gsm8k/test.parquet"
    assert (cfg.data.train_batch_size, cfg.data.max_prompt_length, cfg.data.max_response_length) == (512, 1024, 2048)
    assert cfg.data.filter_overlong_prompts is True
    assert cfg.data.truncation == "error"
    assert cfg.data.image_key == "images"
    assert arr.model.path == "/models/Qwen2.5-VL-7B-Instruct"
    assert arr.actor.optim.lr == 1e-6 and isinstance(arr.actor.optim.lr, float)
    assert arr.model.use_remove_padding is True
    assert arr.actor.ppo_mini_batch_size == 32
    assert arr.actor.ppo_micro_batch_size_per_gpu == 2
    assert arr.actor.use_kl_loss is True
    assert arr.actor.kl_loss_coef == 0.01
    assert arr.actor.kl_loss_type == "low_var_kl"
    assert arr.actor.entropy_coeff == 0.0 and isinstance(arr.actor.entropy_coeff, float)
    assert arr.actor.use_torch_compile is False
    assert arr.model.enable_gradient_checkpointing is True
    assert arr.actor.fsdp_config.param_offload is False
    assert arr.actor.fsdp_config.optimizer_offload is False
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 4
    assert arr.rollout.tensor_model_parallel_size == 4
    assert arr.rollout.name == "vllm"
    assert arr.rollout.engine_kwargs == {"vllm": {"disable_mm_preprocessor_cache": True}, "sglang": {}}
    assert arr.rollout.gpu_memory_utilization == 0.5
    assert arr.rollout.enable_chunked_prefill is False
    assert arr.rollout.enforce_eager is True
    assert arr.rollout.free_cache_engine is True
    assert arr.rollout.n == 5
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 4
    assert arr.ref.fsdp_config.param_offload is True
    assert cfg.algorithm.use_kl_in_reward is False
    assert cfg.trainer.critic_warmup == 0
    assert cfg.trainer.logger == ["console"]
    assert cfg.trainer.project_name == "verl_grpo_example_geo3k"
    assert cfg.trainer.experiment_name == "qwen2_5_vl_7b_function_rm"
    assert (cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes) == (8, 1)
    assert (cfg.trainer.save_freq, cfg.trainer.test_freq, cfg.trainer.total_epochs) == (-1, -1, 15)
    assert cfg.trainer.device == "npu"
    assert cfg.trainer.default_local_dir == "runs/verl_grpo_example_geo3k/qwen2_5_vl_7b_function_rm"


def test_defaults_are_verls() -> None:
    cfg = load_config()
    assert cfg.trainer.default_local_dir == "runs/thinkrl/run"
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 0.999]
    assert cfg.actor_rollout_ref.actor.fsdp_config.wrap_policy == {"min_num_params": 0}
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.0
    assert cfg.data.train_batch_size == 1024
    # mutable defaults are not shared between instances
    Config().trainer.logger.append("wandb")
    assert Config().trainer.logger == ["console"]


def test_number_forms() -> None:
    cfg = load_config(None, ["actor_rollout_ref.actor.optim.lr=1e-6", "actor_rollout_ref.actor.clip_ratio=1",
                             "actor_rollout_ref.actor.optim.betas=[0.9,1e-3]", "data.train_batch_size='8'"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-06
    assert cfg.actor_rollout_ref.actor.clip_ratio == 1.0 and isinstance(cfg.actor_rollout_ref.actor.clip_ratio, float)
    assert cfg.actor_rollout_ref.actor.optim.betas == [0.9, 0.001]
    assert cfg.data.train_batch_size == 8


def test_lists_strings_and_nulls() -> None:
    cfg = load_config(None, [
        "trainer.logger=[console,jsonl]", "data.train_files=[a.parquet,b.parquet]", "trainer.project_name=123",
        "actor_rollout_ref.model.tokenizer_path=/tok", "actor_rollout_ref.model.tokenizer_path=null",
        "trainer.experiment_name=\"x y\"", "data.prompt_key=yes", "actor_rollout_ref.rollout.prompt_length=None",
    ])
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert cfg.trainer.project_name == "123"  # str fields keep the text
    assert cfg.actor_rollout_ref.model.tokenizer_path is None
    assert cfg.trainer.experiment_name == "x y"
    assert cfg.data.prompt_key == "yes"  # not YAML 1.1's True
    assert cfg.actor_rollout_ref.rollout.prompt_length is None


def test_booleans() -> None:
    for text, expected in [("true", True), ("False", False), ("1", True), ("0", False), ("'true'", True)]:
        assert load_config(None, [f"data.shuffle={text}"]).data.shuffle is expected


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.shuffle=yes please", "a boolean"),
        ("data.train_batch_size=8.5", "an integer"),
        ("actor_rollout_ref.actor.optim.lr=fast", "a number"),
        ("actor_rollout_ref.rollout.prompt_length=long", "an integer or null"),
        ("trainer.logger={a: 1}", "a list of strings"),
        ("actor_rollout_ref.model.override_config=[1]", "a mapping"),
        ("data.train_batch_size=True", "an integer"),
    ],
)
def test_wrong_type_names_key_value_type_and_example(override: str, expected: str) -> None:
    key, _, value = override.partition("=")
    with pytest.raises(ValueError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert key in message and value in message and expected in message
    assert "e.g. " + key + "=" in message


@pytest.mark.parametrize(
    ("override", "suggestion"),
    [
        ("actor_rollout_ref.actor.ppo_mini_bach_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        ("data.batch_size=8", "data.train_batch_size"),
        ("actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs"),
        ("+trainer.n_gpu_per_node=2", "trainer.n_gpus_per_node"),
    ],
)
def test_unknown_key_suggests_the_right_one(override: str, suggestion: str) -> None:
    with pytest.raises(ValueError, match="unknown config key") as err:
        load_config(None, [override])
    assert suggestion in str(err.value)


def test_malformed_overrides_say_how_to_write_one() -> None:
    with pytest.raises(ValueError, match=r"KEY=VALUE.*data\.train_batch_size=8"):
        load_config(None, ["data.train_batch_size"])
    with pytest.raises(ValueError, match="section"):
        load_config(None, ["data=3"])
    with pytest.raises(ValueError, match="single value"):
        load_config(None, ["data.train_batch_size.x=3"])


def test_plus_adds_keys_only_inside_mappings() -> None:
    cfg = load_config(None, [
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
        "+actor_rollout_ref.actor.ppo_epochs=2",  # on a known key: just sets it
        "++trainer.seed=7",
    ])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.0}
    assert cfg.actor_rollout_ref.actor.ppo_epochs == 2 and cfg.trainer.seed == 7
    with pytest.raises(ValueError, match=r"\+actor_rollout_ref\.rollout\.engine_kwargs\.vllm\.swap_space"):
        load_config(None, ["actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])


def test_mapping_values_merge_into_sections_and_dicts() -> None:
    cfg = load_config(None, [
        "actor_rollout_ref.actor.optim={lr: 2e-6, warmup_style: cosine}",
        "actor_rollout_ref.rollout.engine_kwargs={vllm: {swap_space: 4}}",
    ])
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-6
    assert cfg.actor_rollout_ref.actor.optim.warmup_style == "cosine"
    assert cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"swap_space": 4}, "sglang": {}}
    cfg = load_config(None, ["++actor_rollout_ref.rollout.engine_kwargs={vllm: {}}"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {}}


def test_interpolation_follows_names_after_all_overrides() -> None:
    cfg = load_config(None, ["trainer.experiment_name=exp1", "trainer.project_name=proj"])
    assert cfg.trainer.default_local_dir == "runs/proj/exp1"
    cfg = load_config(None, [
        "trainer.default_local_dir=/ckpt/${trainer.experiment_name}-${data.train_batch_size}",
        "actor_rollout_ref.rollout.prompt_length=${data.max_prompt_length}",
        "data.max_prompt_length=300",
    ])
    assert cfg.trainer.default_local_dir == "/ckpt/run-1024"
    assert cfg.actor_rollout_ref.rollout.prompt_length == 300


def test_interpolation_errors() -> None:
    with pytest.raises(ValueError, match=r"trainer\.project_name"):
        load_config(None, ["trainer.default_local_dir=${trainer.projct_name}"])
    with pytest.raises(ValueError, match="loop"):
        load_config(None, ["trainer.project_name=${trainer.experiment_name}",
                           "trainer.experiment_name=${trainer.project_name}"])


def test_recipe_merges_nested_and_flat_keys_then_overrides(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "data:\n  train_batch_size: 16\n  max_prompt_length: 128\n"
        "actor_rollout_ref:\n  rollout:\n    n: 4\n    engine_kwargs:\n      vllm: {swap_space: 2}\n"
        "  actor.optim.lr: 1e-5\n"
        "trainer.logger: [console, jsonl]\n"
        "algorithm:\n",  # an empty section is fine
        encoding="utf-8",
    )
    cfg = load_config(recipe, ["data.train_batch_size=32"])
    assert cfg.data.train_batch_size == 32  # override wins
    assert cfg.data.max_prompt_length == 128
    assert cfg.data.max_response_length == 512  # untouched default
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert cfg.actor_rollout_ref.rollout.engine_kwargs == {"vllm": {"swap_space": 2}, "sglang": {}}
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-5
    assert cfg.trainer.logger == ["console", "jsonl"]


def test_recipe_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ValueError, match="nope.yaml.*does not exist"):
        load_config(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("data: [1, 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="broken.yaml.*not valid YAML"):
        load_config(broken)
    typo = tmp_path / "typo.yaml"
    typo.write_text("data:\n  batch_size: 8\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"typo\.yaml.*data\.batch_size.*data\.train_batch_size"):
        load_config(typo)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("data:\n  shuffle: maybe\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"wrong\.yaml.*data\.shuffle.*boolean"):
        load_config(wrong)


def test_config_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = load_config(None, SEED_AS_SHELL_PASSES_IT)
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config_to_dict(cfg)), encoding="utf-8")
    assert load_config(saved) == cfg


def test_flatten_keys() -> None:
    keys = flatten_keys(Config())
    assert keys == flatten_keys(Config)
    assert "actor_rollout_ref.actor.optim.lr" in keys
    assert "actor_rollout_ref.rollout.engine_kwargs" in keys  # mapping fields are leaves
    assert "actor_rollout_ref.rollout.val_kwargs.top_p" in keys
    assert not any(k.endswith(".optim") for k in keys)
    assert len(keys) == len(set(keys))
