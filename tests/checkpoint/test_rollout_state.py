"""A checkpoint's rollout state: its kind is saved beside it, and a run whose
rollout side cannot take it back says which settings to resume with (a
streaming save resumed with mode=off used to raise KeyError: 'generator')."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from thinkrl.checkpoint.rollout_state import ASYNC, OFF, STREAMING, check_resumable, rollout_kind, saved_kind
from thinkrl.config import load_config

SHAPES = {OFF: [torch.zeros(2)], ASYNC: {"generator": torch.zeros(2), "queue": [], "sent_version": 1},
          STREAMING: {"stream": {}, "sent_version": 1, "trainer_version": 2}}
CONFIGS = {OFF: [], ASYNC: ["async_training.mode=fully_async"],
           STREAMING: ["async_training.mode=one_step_off", "async_training.streaming=True"]}


@pytest.mark.parametrize("kind", [OFF, ASYNC, STREAMING])
def test_the_kind_is_the_configs_and_older_checkpoints_are_read_by_their_shape(kind):
    assert rollout_kind(load_config("tiny", CONFIGS[kind])) == kind
    assert saved_kind({"engine_generator": SHAPES[kind]}) == kind
    assert saved_kind({"engine_generator": SHAPES[OFF], "engine_kind": kind}) == kind


@pytest.mark.parametrize("saved", [OFF, ASYNC, STREAMING])
@pytest.mark.parametrize("current", [OFF, ASYNC, STREAMING])
def test_streaming_and_the_other_kinds_do_not_mix(saved, current):
    state = {"engine_generator": SHAPES[saved], "engine_kind": saved}
    cfg = load_config("tiny", CONFIGS[current])
    if saved == current or STREAMING not in (saved, current):
        check_resumable(state, cfg, Path("run/global_step_2"))
        return
    with pytest.raises(ValueError) as err:
        check_resumable(state, cfg, Path("run/global_step_2"))
    message = str(err.value)
    assert message.startswith("run/global_step_2: its rollout state was saved by a run with")
    assert ("resume it with async_training.mode=off" in message) == (saved == OFF)
    assert ("resume it with async_training.streaming=True" in message) == (saved == STREAMING)
    assert f"this run has async_training.mode={cfg.async_training.mode}" in message
