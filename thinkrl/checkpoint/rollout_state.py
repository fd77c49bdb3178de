"""Which rollout side saved a checkpoint's generator state, and whether this
run can take it back.

`trainer_state.pt` keeps the rollout side's state under `engine_generator`,
in one of three shapes, with its kind under `engine_kind`:

- `off` (async_training.mode=off): each rank's engine generator (tensors);
- `async` (one_step_off / fully_async): the rollout process's generator and
  the batches it had queued (a dict with `generator`);
- `streaming` (async_training.streaming=True): the streaming process's
  snapshot (a dict with `stream`).

A run takes back a state of its own kind; a synchronous run or a
batch-async one also takes the other's (the generator alone: queued
batches are not trained on). A streaming state and any other kind do not
mix: a ValueError then says which settings to resume with.
"""

from __future__ import annotations

from pathlib import Path

from thinkrl.errors import UserError

OFF, ASYNC, STREAMING = "off", "async", "streaming"
SETTINGS = {OFF: "async_training.mode=off",
            ASYNC: "async_training.mode=one_step_off or fully_async (async_training.streaming=False)",
            STREAMING: "async_training.streaming=True (with mode one_step_off or fully_async)"}


def rollout_kind(cfg) -> str:
    """The kind of state this run's rollout side saves."""
    if cfg.async_training.mode == "off":
        return OFF
    return STREAMING if cfg.async_training.streaming else ASYNC


def saved_kind(trainer_state: dict) -> str:
    """The kind a checkpoint's rollout state was saved by (read from its shape
    for checkpoints saved before `engine_kind` was kept)."""
    if "engine_kind" in trainer_state:
        return trainer_state["engine_kind"]
    state = trainer_state["engine_generator"]
    if isinstance(state, dict):
        return STREAMING if "stream" in state else ASYNC
    return OFF


def check_resumable(trainer_state: dict, cfg, folder: Path) -> None:
    """ValueError when this run's rollout side cannot take the saved state."""
    saved, current = saved_kind(trainer_state), rollout_kind(cfg)
    if saved == current or STREAMING not in (saved, current):
        return
    mode = cfg.async_training.mode
    this = f"async_training.mode={mode}" + (", streaming=True" if current == STREAMING else "")
    raise UserError(f"{folder}: its rollout state was saved by a run with {SETTINGS[saved]}, and this "
                     f"run has {this}: resume it with {SETTINGS[saved]}, or start a new run "
                     "(another trainer.default_local_dir, or trainer.resume_mode=disable)")
