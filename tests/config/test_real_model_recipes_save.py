"""The recipes a user would export save by default: one folder per seed, the
latest checkpoint kept (a newcomer's `thinkrl export` after `--config smol`
found nothing before)."""

from __future__ import annotations

import pytest

from thinkrl.cli import recipe_path
from thinkrl.config import load_config


@pytest.mark.parametrize("recipe, every", [("smol", 4), ("gym", 16)])
def test_a_real_model_recipe_saves_into_a_folder_of_its_seed(recipe, every):
    cfg = load_config(recipe_path(recipe), ["trainer.seed=3"])
    assert cfg.trainer.default_local_dir == f"runs/thinkrl/{recipe}-seed3"
    assert cfg.trainer.save_freq == every and cfg.trainer.max_actor_ckpt_to_keep == 1
    assert cfg.trainer.total_training_steps % every == 0  # the last step is a save too
