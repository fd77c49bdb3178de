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


def test_an_explicit_value_equal_to_the_default_is_not_overwritten_silently():
    """`actor_rollout_ref.rollout.n=1` given is kept against `rollout.n=4` (a
    refusal naming both), and a command line beats a recipe in either name."""
    with pytest.raises(ValueError, match="but actor_rollout_ref.rollout.n=1 is set too"):
        load_config(None, ["actor_rollout_ref.rollout.n=1", "rollout.n=4"])
    assert load_config(None, ["rollout.n=4"]).actor_rollout_ref.rollout.n == 4
    tiny = load_config("tiny").actor_rollout_ref.rollout.n
    assert load_config("tiny", [f"rollout.n={tiny + 3}"]).actor_rollout_ref.rollout.n == tiny + 3


def test_the_command_line_beats_an_alias_in_the_recipe(tmp_path):
    recipe = tmp_path / "async.yaml"
    recipe.write_text("rollout:\n  n: 6\n  total_epochs: 3\n")
    assert load_config(recipe).actor_rollout_ref.rollout.n == 6
    cfg = load_config(recipe, ["actor_rollout_ref.rollout.n=2", "trainer.total_epochs=5"])
    assert (cfg.actor_rollout_ref.rollout.n, cfg.trainer.total_epochs) == (2, 5)
    recipe.write_text("rollout:\n  n: 6\nactor_rollout_ref:\n  rollout:\n    n: 2\n")
    with pytest.raises(ValueError, match="keep one of them"):
        load_config(recipe)


def test_a_tools_keys_beat_the_users_alias_and_a_section_override_counts_as_its_keys():
    """`thinkrl rehearse` forces trainer.test_freq=-1 over a verl line's
    rollout.test_freq; `actor_rollout_ref.rollout={n: 2}` sets rollout.n."""
    cfg = load_config(None, ["rollout.test_freq=2"], tool_overrides=["trainer.test_freq=-1"])
    assert cfg.trainer.test_freq == -1 and cfg.rollout.test_freq is None  # the loser cleared
    with pytest.raises(ValueError, match="but actor_rollout_ref.rollout.n=2 is set too"):
        load_config(None, ["actor_rollout_ref.rollout={n: 2}", "rollout.n=4"])
    translated = load_config(None, ["rollout.n=4"], recipe_overrides=["actor_rollout_ref.rollout.n=2"])
    assert translated.actor_rollout_ref.rollout.n == 4  # the user's alias beats a translated recipe
