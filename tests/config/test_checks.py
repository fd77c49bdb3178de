"""Cross-field checks: derived sizes by hand, one error listing every problem."""

from __future__ import annotations

import importlib
import importlib.util
import shlex
from pathlib import Path

import pytest

from thinkrl.config import load_config
from thinkrl.config.sizes import DerivedSizes
from thinkrl.config.inactive import inactive_settings
from thinkrl.config.checks import validate

# The verl launch line lives in test_loading.py (tests/ is not a package, so load it by path).
_spec = importlib.util.spec_from_file_location("_config_test_loading", Path(__file__).with_name("test_loading.py"))
assert _spec is not None and _spec.loader is not None
_loading_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loading_tests)
VERL_SEED_LINE: str = _loading_tests.VERL_SEED_LINE

ARR = "actor_rollout_ref"
# A small valid run: 8 prompts x 4 responses on 2 devices.
SMALL = [
    "data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.rollout.n=4",
    "trainer.n_gpus_per_node=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
]


def _problems(*overrides: str) -> str:
    with pytest.raises(ValueError) as err:
        validate(load_config(None, [*SMALL, *overrides]))
    return str(err.value)


def test_verl_seed_line_derived_sizes() -> None:
    sizes = validate(load_config(None, shlex.split(VERL_SEED_LINE)))
    # 8 devices; 512 prompts x n=5 = 2560 responses; 512 / mini 32 = 16 mini-batches;
    # 32 x 5 = 160 responses per mini-batch, / 8 devices = 20 each; micro 2 -> 20 / 2 = 10 accumulations.
    assert sizes.world_size == 8
    assert sizes.prompts_per_step == 512
    assert sizes.responses_per_step == 2560
    assert sizes.mini_batches_per_step == 16
    assert sizes.responses_per_mini_batch == 160
    assert sizes.responses_per_mini_batch_per_device == 20
    assert sizes.micro_batch_size_per_device == 2
    assert sizes.grad_accum_steps == 10
    assert sizes.optimizer_steps_per_step == 16  # 16 mini-batches x 1 epoch
    assert sizes.log_prob_micro_batch_size_per_device == 4
    assert sizes.ref_log_prob_micro_batch_size_per_device == 4
    assert (sizes.prompt_length, sizes.response_length) == (1024, 2048)


def test_table_shows_the_numbers() -> None:
    table = validate(load_config(None, shlex.split(VERL_SEED_LINE))).table()
    assert "data.train_batch_size 512 x rollout.n 5" in table
    for label, value in [("responses per step", "2560"), ("mini-batches per step", "16"),
                         ("grad accumulation steps", "10"), ("per device", "20")]:
        line = next(row for row in table.splitlines() if row.strip().startswith(label))
        assert value in line.split()
    # two aligned columns: every value ends at the same column
    ends = {row.index("  =") if "  =" in row else row.index("  tokens") for row in table.splitlines()}
    assert len(ends) == 1


def test_unset_micro_sizes_fall_back() -> None:
    # 2 prompts x n=2 = 4 responses per mini-batch on 1 device; no micro size: one micro-batch of 4.
    sizes = validate(load_config(None, ["data.train_batch_size=4", f"{ARR}.actor.ppo_mini_batch_size=2",
                                        f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_epochs=3"]))
    assert sizes.micro_batch_size_per_device == 4 and sizes.grad_accum_steps == 1
    assert sizes.log_prob_micro_batch_size_per_device == 4  # the actor's
    assert sizes.optimizer_steps_per_step == 6  # 2 mini-batches x 3 epochs
    assert (sizes.prompt_length, sizes.response_length) == (512, 512)


def test_deprecated_global_micro_size_is_split_over_devices() -> None:
    # 4 prompts x 4 = 16 responses / 2 devices = 8 each; global micro 8 / 2 devices = 4 -> 2 accumulations.
    sizes = validate(load_config(None, [*SMALL[:-1], f"{ARR}.actor.ppo_micro_batch_size=8",
                                        f"{ARR}.ref.log_prob_micro_batch_size=4"]))
    assert sizes.micro_batch_size_per_device == 4 and sizes.grad_accum_steps == 2
    assert sizes.ref_log_prob_micro_batch_size_per_device == 2
    assert isinstance(sizes, DerivedSizes)


def test_train_batch_not_multiple_of_mini_batch() -> None:
    message = _problems("data.train_batch_size=10")
    assert "data.train_batch_size=10" in message
    assert f"{ARR}.actor.ppo_mini_batch_size=4" in message
    assert "divisor of 10 (e.g. 2 or 5)" in message


def test_mini_batch_responses_not_divisible_by_devices() -> None:
    # 4 prompts x 3 = 12 responses per mini-batch over 8 devices.
    message = _problems(f"{ARR}.rollout.n=3", "trainer.n_gpus_per_node=8")
    assert f"{ARR}.actor.ppo_mini_batch_size 4 x {ARR}.rollout.n 3 = 12" in message
    assert "8 devices (trainer.n_gpus_per_node 8 x trainer.nnodes 1)" in message
    assert "multiple of 8" in message


def test_micro_batch_does_not_divide_per_device_responses() -> None:
    # 16 responses / 2 devices = 8 per device; micro 3 does not divide 8.
    message = _problems(f"{ARR}.actor.ppo_micro_batch_size_per_gpu=3")
    assert "16 / 2 = 8" in message and "micro-batch size 3" in message
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu to a divisor of 8 (e.g. 2 or 4)" in message


def test_deprecated_micro_batch_not_divisible_by_devices() -> None:
    message = _problems(f"{ARR}.actor.ppo_micro_batch_size_per_gpu=null", f"{ARR}.actor.ppo_micro_batch_size=3")
    assert f"{ARR}.actor.ppo_micro_batch_size=3" in message
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu" in message


def test_grpo_needs_groups() -> None:
    message = _problems(f"{ARR}.rollout.n=1")
    assert f"{ARR}.rollout.n=1" in message and f"{ARR}.rollout.n>=2" in message


def test_one_error_lists_every_problem() -> None:
    message = _problems(
        "data.train_batch_size=10",
        f"{ARR}.actor.loss_agg_mode=mean",
        f"{ARR}.actor.kl_loss_type=k9",
        "algorithm.adv_estimator=ppo",
        f"{ARR}.actor.clip_ratio_c=0.5",
        f"{ARR}.rollout.top_p=0",
        f"{ARR}.rollout.top_k=0",
        f"{ARR}.model.lora_rank=-8",
        f"{ARR}.actor.use_kl_loss=True",
        "algorithm.use_kl_in_reward=True",
        f"{ARR}.actor.ulysses_sequence_parallel_size=2",
        "trainer.device=tpu",
        "trainer.backend=slurm",
        "data.truncation=cut",
    )
    assert message.startswith("the config has 13 problems:")  # the two KL switches make one
    for expected in [
        "data.train_batch_size=10", "loss_agg_mode=mean: use one of: token-mean", "kl_loss_type=k9",
        "adv_estimator=ppo: use one of: grpo, rloo", "clip_ratio_c=0.5", "top_p=0.0", "top_k=0",
        "lora_rank=-8: must be 0 (train every weight) or a rank >= 1", "counts the KL twice",
        "ulysses_sequence_parallel_size=2", "trainer.device=tpu",
        "trainer.backend=slurm", "data.truncation=cut",
    ]:
        assert expected in message


def test_positive_sizes_are_checked_before_dividing() -> None:
    message = _problems("data.train_batch_size=0", f"{ARR}.actor.ppo_mini_batch_size=-1", "trainer.total_epochs=0")
    assert "data.train_batch_size=0: must be a whole number >= 1" in message
    assert f"{ARR}.actor.ppo_mini_batch_size=-1" in message and "trainer.total_epochs=0" in message


def test_tensor_parallel_must_divide_devices_for_external_engines() -> None:
    message = _problems(f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=4")
    assert "tensor_model_parallel_size=4" in message and "use one of 1, 2" in message
    validate(load_config(None, [*SMALL, f"{ARR}.rollout.tensor_model_parallel_size=4"]))  # native ignores it


def test_clip_ratios_fall_back_and_are_checked() -> None:
    validate(load_config(None, [*SMALL, f"{ARR}.actor.clip_ratio_low=0.2", f"{ARR}.actor.clip_ratio_high=0.28"]))
    assert f"{ARR}.actor.clip_ratio_low=1.5" in _problems(f"{ARR}.actor.clip_ratio_low=1.5")


def test_resume_path_needs_a_path() -> None:
    assert "trainer.resume_from_path=null" in _problems("trainer.resume_mode=resume_path")


def test_inactive_settings_only_for_changed_values() -> None:
    assert inactive_settings(load_config(None, SMALL)) == []
    notes = inactive_settings(load_config(None, [
        *SMALL, "trainer.n_gpus_per_node=1", f"{ARR}.rollout.enforce_eager=True", f"{ARR}.rollout.gpu_memory_utilization=0.9",
        f"{ARR}.actor.fsdp_config.param_offload=True", "data.dataloader_num_workers=2",
        f"{ARR}.actor.kl_loss_coef=0.1", f"{ARR}.actor.use_torch_compile=False",
    ]))
    joined = "\n".join(notes)
    assert len(notes) == 6
    assert f"{ARR}.rollout.enforce_eager=True has no effect" in joined and "rollout.name=native" in joined
    assert f"{ARR}.actor.fsdp_config.param_offload=True" in joined and "backend=local" in joined
    assert "data.dataloader_num_workers=2" in joined
    assert "use_kl_loss is False" in joined
    # on two devices (the ray backend, FSDP2) the offload is live, the layout knobs are not
    sharded = inactive_settings(load_config(None, [
        *SMALL, "trainer.device=cuda", f"{ARR}.actor.fsdp_config.param_offload=True",
        f"{ARR}.actor.fsdp_config.fsdp_size=2"]))
    assert len(sharded) == 1 and f"{ARR}.actor.fsdp_config.fsdp_size=2" in sharded[0]
    # with vLLM selected, its own settings are live
    vllm = load_config(None, [*SMALL, f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.enforce_eager=True"])
    assert inactive_settings(vllm) == []


def test_fused_kernels_is_live_only_with_the_shared_prompt_pass() -> None:
    one = [*SMALL, "trainer.n_gpus_per_node=1"]  # one device: the local backend, whole weights
    alone = inactive_settings(load_config(None, [*one, f"{ARR}.model.use_fused_kernels=True"]))
    assert len(alone) == 1 and "use_remove_padding=True" in alone[0]
    both = [f"{ARR}.model.use_fused_kernels=True", f"{ARR}.model.use_remove_padding=True"]
    assert inactive_settings(load_config(None, [*one, *both])) == []
    # 2 devices: FSDP2 shards take the shared-prompt pass too (tests/parallel/test_fsdp_shared_prompt.py)
    assert inactive_settings(load_config(None, [*SMALL, *both])) == []


@pytest.mark.parametrize("key, registry", [
    ("algorithm.adv_estimator", "thinkrl.algos.advantages:ADVANTAGE_ESTIMATORS"),
    (f"{ARR}.actor.policy_loss.loss_mode", "thinkrl.algos.policy_losses:POLICY_LOSSES"),
    (f"{ARR}.actor.loss_agg_mode", "thinkrl.algos.losses:LOSS_AGG_MODES"),
    ("algorithm.kl_penalty", "thinkrl.algos.kl:KL_ESTIMATORS"),
    ("reward.scorer", "thinkrl.rewards.registry:SCORER_NAMES"),
    ("data.template", "thinkrl.data.templates:TEMPLATES"),
])
def test_an_unknown_choice_is_refused_with_every_name_its_registry_holds(key, registry):
    module, name = registry.split(":")
    registered = list(getattr(importlib.import_module(module), name))
    message = _problems(f"{key}=no_such_name")
    listed = message.split(f"{key}=no_such_name: use one of: ")[1].splitlines()[0]
    assert [n for n in listed.rstrip(".").split(", ") if n != "auto"] == registered


def test_a_zero_learning_rate_is_accepted_with_a_note():
    cfg = load_config(None, [*SMALL, f"{ARR}.actor.optim.lr=0"])
    validate(cfg)
    notes = [n for n in inactive_settings(cfg) if ".optim.lr" in n]
    assert len(notes) == 1 and notes[0].startswith(f"{ARR}.actor.optim.lr=0.0 has no effect: ")
    assert "learns nothing" in notes[0]
    assert not [n for n in inactive_settings(load_config(None, SMALL)) if ".optim.lr" in n]


def test_a_deprecated_micro_batch_beside_its_per_device_key_is_refused_not_ignored() -> None:
    """verl refuses `actor.ppo_micro_batch_size` beside `..._per_gpu`; thinkrl
    used to take the per-device one and ignore the other silently."""
    message = _problems(f"{ARR}.actor.ppo_micro_batch_size=8",
                        f"{ARR}.rollout.log_prob_micro_batch_size=8", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=4")
    assert f"{ARR}.actor.ppo_micro_batch_size=8: {ARR}.actor.ppo_micro_batch_size_per_gpu=2 is set too" in message
    assert f"keep {ARR}.rollout.log_prob_micro_batch_size_per_gpu (per device)" in message
    validate(load_config(None, [*SMALL[:-1], f"{ARR}.actor.ppo_micro_batch_size=4"]))  # alone: 4 / 2 devices
