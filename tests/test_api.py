"""thinkrl from Python (a notebook's habit: TRL's `GRPOTrainer(...).train()`)
and `thinkrl config show`: the same config and run as `thinkrl train`."""

from __future__ import annotations

import pytest

import thinkrl
from thinkrl.cli import main
from thinkrl.config.schema import Config


def test_a_dict_recipe_and_dict_overrides_keep_their_types():
    cfg = thinkrl.resolved_config({"trainer": {"total_training_steps": 3}, "data.train_batch_size": 8},
                                  {"trainer.logger": ["console"], "trainer.experiment_name": "nb",
                                   "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
                                   "actor_rollout_ref.rollout.n": 2,
                                   "trainer.val_before_train": False, "trainer.resume_from_path": None},
                                  log=lambda _: None)
    assert (cfg.trainer.total_training_steps, cfg.data.train_batch_size) == (3, 8)
    assert cfg.trainer.logger == ["console"] and cfg.trainer.experiment_name == "nb"
    assert cfg.trainer.val_before_train is False and cfg.trainer.resume_from_path is None
    import numpy as np
    from pathlib import Path

    swept = thinkrl.resolved_config("tiny", {"trainer.seed": np.arange(3)[2],
                                             "trainer.default_local_dir": Path("/tmp/a=b #c")}, log=lambda _: None)
    assert swept.trainer.seed == 2 and swept.trainer.default_local_dir == "/tmp/a=b #c"


def test_a_bad_config_raises_with_the_fix_and_a_config_object_takes_no_overrides():
    with pytest.raises(ValueError, match="ppo_mini_batch_size to a divisor of 3"):
        thinkrl.resolved_config("tiny", ["data.train_batch_size=3"], log=lambda _: None)
    with pytest.raises(ValueError, match="did you mean"):
        thinkrl.resolved_config("tiny", {"trainer.total_training_stepz": 2}, log=lambda _: None)
    with pytest.raises(ValueError, match="not to a Config object"):
        thinkrl.resolved_config(Config(), {"trainer.seed": 2})
    with pytest.raises(ValueError, match="give a dict of dotted keys"):
        thinkrl.resolved_config("tiny", "trainer.seed=2")


def test_a_run_from_python_returns_its_metrics(asset_cache, tiny_model_dir, tmp_path):
    result = thinkrl.train("tiny", {
        "actor_rollout_ref.model.path": str(tiny_model_dir), "trainer.default_local_dir": str(tmp_path / "run"),
        "data.train_batch_size": 4, "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4, "data.max_response_length": 8,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 8,
        "trainer.total_training_steps": 1, "trainer.val_before_train": False, "trainer.test_freq": -1,
        "trainer.progress_bar": False, "trainer.logger": []}, log=lambda _: None)
    assert result.steps == 1 and result.run_dir == tmp_path / "run"
    assert [r["step"] for r in result.metrics] == [1] and "actor/pg_loss" in result.metrics[0]


def test_config_show_prints_the_resolved_config_and_its_problems(capsys):
    assert main(["config", "show", "--config", "tiny", "trainer.seed=7"]) == 0
    out = capsys.readouterr().out
    assert "  seed: 7\n" in out and "train_files: builtin:arith/train" in out
    assert main(["config", "show", "--config", "tiny", "data.train_batch_size=3"]) == 2
    assert "not a multiple of" in capsys.readouterr().err
