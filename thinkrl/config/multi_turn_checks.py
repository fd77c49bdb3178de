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
    # The rollout process neither runs the loop nor keeps response_attention
    # and turns in its queue records (async_rollout/sampler.py, server.py);
    # rows routed to an environment by data source are caught when the run is built.
    if (mt.enable or mt.interaction_config_path) and cfg.async_training.mode != "off":
        problems.append(f"  - async_training.mode={cfg.async_training.mode}: the rollout process "
                        f"does not run tools or environments yet: set async_training.mode=off, or "
                        f"{KEY}.enable=False and no interaction_config_path")
    return problems + env_problems(cfg)


def env_problems(cfg: Config) -> list[str]:
    """``env.*`` and ``data.mixture``, one line per problem."""
    env, problems = cfg.env, []
    if env.step_timeout_s <= 0:
        problems.append(f"  - env.step_timeout_s={shown(env.step_timeout_s)}: must be > 0 (seconds "
                        "one environment call may take)")
    if env.concurrency < 1:
        problems.append(f"  - env.concurrency={shown(env.concurrency)}: must be a whole number >= 1")
    for pattern, name in env.by_data_source.items():
        if not isinstance(name, str) or not name:
            problems.append(f"  - env.by_data_source.{pattern}={shown(name)}: give an environment name")
    weights = cfg.data.mixture
    for source, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            problems.append(f"  - data.mixture.{source}={shown(weight)}: give a weight >= 0")
    if weights and not any(isinstance(w, (int, float)) and w > 0 for w in weights.values()):
        problems.append("  - data.mixture: every weight is 0; give at least one data source a weight > 0")
    return problems
