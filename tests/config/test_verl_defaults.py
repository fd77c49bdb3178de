"""thinkrl's defaults that differ from verl's are listed once, match the
schema, and are said at start for a verl line that leaves them unset."""

from __future__ import annotations

from thinkrl.commands.common import load_run_config
from thinkrl.config import load_config
from thinkrl.config.verl_defaults import DIFFERENCES, differences_note


def _value(cfg, key):
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def test_the_listed_defaults_are_the_schema_s():
    cfg = load_config()
    for key, (_, ours, _) in DIFFERENCES.items():
        assert _value(cfg, key) == ours, key


def test_a_verl_line_hears_the_differences_it_leaves_in_force():
    said = []
    load_run_config(None, ["trainer.n_gpus_per_node=2", "data.train_batch_size=8"], log=said.append)
    note = next(line for line in said if line.startswith("thinkrl's defaults that differ"))
    assert "algorithm.adv_estimator=grpo (verl: gae;" in note and "trainer.device=auto (verl: cuda;" in note
    assert "n_gpus_per_node" not in note and "partial_rollout" not in note  # set; not an async line
    assert "partial_rollout=unset (verl: True; off in batch mode, on with streaming" in differences_note(
        ["async_training.mode=fully_async"])
    said.clear()
    load_run_config("tiny", [], log=said.append)  # a recipe says its own values
    assert not any(line.startswith("thinkrl's defaults") for line in said)
