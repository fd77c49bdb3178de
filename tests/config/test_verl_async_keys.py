"""verl's fully-async launch lines: the top-level rollout.* keys and
async_training.use_rollout_log_probs read as thinkrl's own keys."""

from __future__ import annotations

import pytest

from thinkrl.config import load_config

VERL_LINE = ["data.train_batch_size=32", "async_training.mode=fully_async",
             "async_training.trigger_parameter_sync_step=4", "rollout.nnodes=1", "rollout.n_gpus_per_node=1",
             "rollout.n=8", "rollout.total_rollout_steps=400", "rollout.total_epochs=10", "rollout.test_freq=2",
             "async_training.use_rollout_log_probs=True"]


def test_verls_fully_async_keys_set_thinkrls():
    cfg = load_config(None, VERL_LINE)
    arr = cfg.actor_rollout_ref
    assert (arr.rollout.nnodes, arr.rollout.n_gpus_per_node, arr.rollout.n) == (1, 1, 8)
    assert cfg.trainer.total_training_steps == 400 // 32  # verl counts prompts
    assert cfg.trainer.total_epochs == 10
    assert cfg.trainer.test_freq == 2 * 4  # every 2 weight syncs of 4 steps
    assert arr.actor.use_rollout_log_probs


def test_a_key_given_both_ways_differently_is_refused_with_both_names():
    with pytest.raises(ValueError, match=r"rollout.n gives actor_rollout_ref.rollout.n=3, but "
                                         r"actor_rollout_ref.rollout.n=5 is set too"):
        load_config(None, ["rollout.n=3", "actor_rollout_ref.rollout.n=5"])
    assert load_config(None, ["rollout.n=5", "actor_rollout_ref.rollout.n=5"]).actor_rollout_ref.rollout.n == 5
    with pytest.raises(ValueError, match="counts prompts; set data.train_batch_size"):
        load_config(None, ["data.train_batch_size=0", "rollout.total_rollout_steps=100"])


def test_several_rollout_devices_are_refused_as_thinkrls_own_key_is():
    from thinkrl.config.checks import validate

    with pytest.raises(ValueError, match="one rollout process"):
        validate(load_config("tiny", ["async_training.mode=fully_async", "rollout.n_gpus_per_node=4"]))
