"""Checks of ``actor_rollout_ref.rollout.multi_turn.*``. Called by
``thinkrl.config.checks.validate``; the tool file itself is read (and
checked) when the run is built."""

from __future__ import annotations

from thinkrl.config.keys import ARR, shown
from thinkrl.config.schema import Config
from thinkrl.tools.calls import FORMATS
from thinkrl.tools.registry import TRUNCATE_SIDES

KEY = f"{ARR}.rollout.multi_turn"


def multi_turn_problems(cfg: Config) -> list[str]:
    """One line per problem: key=value, what to do."""
    mt, problems = cfg.actor_rollout_ref.rollout.multi_turn, []

    def bad(key: str, value, fix: str) -> None:
        problems.append(f"  - {KEY}.{key}={shown(value)}: {fix}")

    if mt.format not in FORMATS:
        bad("format", mt.format, f"use one of: {', '.join(FORMATS)}")
    if mt.tool_response_truncate_side not in TRUNCATE_SIDES:
        bad("tool_response_truncate_side", mt.tool_response_truncate_side,
            f"use one of: {', '.join(TRUNCATE_SIDES)}")
    for key in ("max_assistant_turns", "max_user_turns"):
        value = getattr(mt, key)
        if value is not None and value < 1:
            bad(key, value, "must be a whole number >= 1, or null for no limit")
    for key in ("max_parallel_calls", "max_tool_response_length", "tool_concurrency"):
        if getattr(mt, key) < 1:
            bad(key, getattr(mt, key), "must be a whole number >= 1")
    if mt.tool_timeout_s <= 0:
        bad("tool_timeout_s", mt.tool_timeout_s, "must be > 0 (seconds a tool call may take)")
    if mt.interaction_config_path is not None:
        bad("interaction_config_path", mt.interaction_config_path,
            "simulated-user interactions are not supported: leave it null")
    # The rollout process neither runs the loop nor keeps response_attention
    # and turns in its queue records (async_rollout/sampler.py, server.py).
    if mt.enable and cfg.async_training.mode != "off":
        problems.append(f"  - async_training.mode={cfg.async_training.mode}: the rollout process "
                        f"does not run the tool loop yet: set async_training.mode=off, or "
                        f"{KEY}.enable=False")
    return problems
