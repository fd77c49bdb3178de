"""The critic.* keys (PPO with a critic): verl's launch keys, sizes, mistakes and notes."""

from __future__ import annotations

import pytest

from thinkrl.config import load_config
from thinkrl.config.inactive import inactive_settings
from thinkrl.config.checks import validate

ARR = "actor_rollout_ref"
PPO = ["algorithm.adv_estimator=gae", "data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=4",
       f"{ARR}.rollout.n=2"]


def _problems(*overrides: str) -> str:
    with pytest.raises(ValueError) as err:
        validate(load_config(None, [*PPO, *overrides]))
    return str(err.value)


def test_verls_ppo_launch_keys_validate_with_verls_defaults():
    # the critic lines of verl's examples/ppo_trainer/run_gemma.sh
    cfg = load_config(None, [*PPO, "critic.optim.lr=1e-5", "critic.model.use_remove_padding=False",
                             "critic.model.path=google/gemma-2-2b-it",
                             "critic.model.enable_gradient_checkpointing=False",
                             "critic.ppo_micro_batch_size_per_gpu=4", "critic.model.fsdp_config.param_offload=False",
                             "critic.model.fsdp_config.optimizer_offload=False", "trainer.critic_warmup=0"])
    critic = validate(cfg).critic
    assert (critic.prompts_per_mini_batch, critic.responses_per_mini_batch) == (4, 8)  # the actor's, x rollout.n
    assert (critic.micro_batch_size_per_device, critic.forward_micro_batch_size_per_device) == (4, 4)
    assert (critic.ppo_epochs, critic.loss_agg_mode, critic.shuffle) == (1, "token-mean", False)
    defaults = load_config(None, PPO).critic
    assert (defaults.optim.lr, defaults.cliprange_value, defaults.grad_clip) == (1e-5, 0.5, 1.0)
    assert validate(load_config(None, PPO)).critic.micro_batch_size_per_device == 8  # one micro-batch


def test_critic_sizes_appear_in_the_sizes_table():
    table = validate(load_config(None, [*PPO, "critic.ppo_mini_batch_size=2"])).table()
    [row] = [line for line in table.splitlines() if line.startswith("critic responses per mini-batch")]
    assert row.split()[4:8] == ["4", "=", "critic.ppo_mini_batch_size", "2"]
    assert "critic" not in validate(load_config(None, PPO[1:])).table()


def test_critic_mistakes_name_the_key_and_the_fix():
    assert "critic.ppo_mini_batch_size=3: data.train_batch_size=8 must split into whole critic mini-batches" \
        in _problems("critic.ppo_mini_batch_size=3")
    assert "set critic.ppo_micro_batch_size_per_gpu to a divisor of 8" in _problems(
        "critic.ppo_micro_batch_size_per_gpu=3")
    message = _problems("critic.cliprange_value=0", "critic.loss_agg_mode=mean", "critic.ppo_max_token_len_per_gpu=0",
                        "algorithm.lam=1.5", "trainer.critic_warmup=-1", "critic.ppo_epochs=0")
    for expected in ("critic.cliprange_value=0.0: use a clip range > 0", "critic.loss_agg_mode=mean: use one of",
                     "critic.ppo_max_token_len_per_gpu=0: use a token budget", "algorithm.lam=1.5: use a value in [0, 1]",
                     "trainer.critic_warmup=-1", "critic.ppo_epochs=0: must be a whole number >= 1"):
        assert expected in message
    assert "builds the critic exactly when algorithm.adv_estimator=gae" in _problems("critic.enable=False")
    with pytest.raises(ValueError, match="critic.enable=True"):
        validate(load_config(None, [*PPO[1:], "critic.enable=True"]))


def test_critic_keys_are_noted_when_no_critic_is_built():
    notes = inactive_settings(load_config(None, [*PPO[1:], "critic.optim.lr=3e-5", "trainer.critic_warmup=2",
                                                 "algorithm.lam=0.95"]))
    assert "critic.optim.lr=3e-05 has no effect: the critic is built only for algorithm.adv_estimator=gae" in notes
    assert any(n.startswith("trainer.critic_warmup=2 has no effect") for n in notes)
    assert any(n.startswith("algorithm.lam=0.95 has no effect") for n in notes)
    with_critic = inactive_settings(load_config(None, [*PPO, "critic.optim.lr=3e-5", "trainer.critic_warmup=2",
                                                       "algorithm.lam=0.95", "algorithm.gamma=0.99",
                                                       "critic.model.use_remove_padding=True"]))
    assert with_critic == ["critic.model.use_remove_padding=True has no effect: a verl option that thinkrl's "
                           "critic does not implement (or, for rollout_n and model.tokenizer_path, takes from "
                           "the actor)"]
