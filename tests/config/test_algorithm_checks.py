"""Checks of the algorithm keys: estimators, policy losses, DAPO switches."""

from __future__ import annotations

import pytest

from thinkrl.config import load_config
from thinkrl.config.inactive import inactive_settings
from thinkrl.config.checks import validate

ARR = "actor_rollout_ref"
SMALL = ["data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.rollout.n=4"]


def _problems(*overrides: str) -> str:
    with pytest.raises(ValueError) as err:
        validate(load_config(None, [*SMALL, *overrides]))
    return str(err.value)


def _ok(*overrides: str):
    return load_config(None, [*SMALL, *overrides])


def test_verl_dapo_launch_keys_validate():
    validate(_ok("data.gen_batch_size=24", "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                 "algorithm.filter_groups.max_num_gen_batches=10", f"{ARR}.actor.clip_ratio_low=0.2",
                 f"{ARR}.actor.clip_ratio_high=0.28", "reward_model.reward_manager=dapo",
                 "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=128",
                 "reward_model.overlong_buffer.penalty_factor=1.0"))


def test_every_estimator_and_loss_mode_is_accepted():
    for estimator in ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                      "grpo_passk", "gpg", "remax", "gae"):
        validate(_ok(f"algorithm.adv_estimator={estimator}"))
    for mode in ("vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo"):
        validate(_ok(f"{ARR}.actor.policy_loss.loss_mode={mode}"))
    assert "loss_mode=ppo: use one of: vanilla, gspo" in _problems(f"{ARR}.actor.policy_loss.loss_mode=ppo")


def test_group_estimators_need_groups():
    assert "rloo compares the responses" in _problems("algorithm.adv_estimator=rloo", f"{ARR}.rollout.n=1")
    validate(_ok("algorithm.adv_estimator=reinforce_plus_plus", f"{ARR}.rollout.n=1"))


def test_dynamic_sampling_needs_a_metric_and_groups():
    assert "filter_groups.metric=null: dynamic sampling needs" in _problems("algorithm.filter_groups.enable=True")
    assert "drop nothing" in _problems("algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc",
                                       f"{ARR}.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus")
    assert "before the KL-in-reward penalty" in _problems(
        "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_final_reward",
        "algorithm.use_kl_in_reward=True")


def test_gen_batch_size_only_with_dynamic_sampling():
    assert "data.gen_batch_size=24: it sizes the generation batches" in _problems("data.gen_batch_size=24")
    validate(_ok("data.gen_batch_size=8"))  # verl's DAPO default: equal to train_batch_size


def test_overlong_buffer_must_fit_the_response_limit():
    message = _problems("reward_model.overlong_buffer.enable=True", "data.max_response_length=64")
    assert "overlong_buffer.len=0" in message and "0 < len <= 64" in message
    assert "len=65" in _problems("reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=65",
                                 "data.max_response_length=64")


def test_clip_ratio_low_of_one_or_more_only_for_cispo():
    assert "clip_ratio_low=10.0" in _problems(f"{ARR}.actor.clip_ratio_low=10")
    validate(_ok(f"{ARR}.actor.clip_ratio_low=10", f"{ARR}.actor.policy_loss.loss_mode=cispo"))


def test_covariance_bounds_and_ratios():
    assert "clip_cov_lb=5.0" in _problems(f"{ARR}.actor.policy_loss.clip_cov_lb=5")
    assert "kl_cov_ratio=0.0" in _problems(f"{ARR}.actor.policy_loss.kl_cov_ratio=0")
    assert "tau_neg=0.0" in _problems(f"{ARR}.actor.tau_neg=0")


def test_inactive_algorithm_settings_are_noted():
    notes = "\n".join(inactive_settings(_ok(f"{ARR}.actor.tau_pos=2", "algorithm.gamma=0.9",
                                            "reward_model.overlong_buffer.len=4")))
    assert f"{ARR}.actor.tau_pos=2.0 has no effect: policy_loss.loss_mode is not sapo" in notes
    assert "algorithm.gamma=0.9 has no effect" in notes
    assert "reward_model.overlong_buffer.len=4 has no effect" in notes
    assert not inactive_settings(_ok("algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.9"))
