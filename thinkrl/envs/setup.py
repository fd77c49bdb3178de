"""A run's environments from its config: the router (which row talks to
which environment) and the loop around the rollout engine."""

from __future__ import annotations

import math
from typing import Iterable

from thinkrl.config import Config
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import SINGLE_TURN, TOOL_AGENT, EnvRouter, build_entry, read_entries
from thinkrl.envs.textarena import TextArenaEnv
from thinkrl.envs.tool_env import ToolEnvironment, ToolLimits
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.envs.users import RetryUser
from thinkrl.records import Sample
from thinkrl.tools.registry import ToolRunner

BUILTINS = {"textarena": TextArenaEnv, "retry_user": RetryUser}
"""Environments a row reaches without an interaction file (by `routing.BUILTIN_ROUTES`,
its agent_name or env.by_data_source)."""


def run_router(cfg: Config, tools: ToolRunner | None) -> EnvRouter:
    """The run's environments: the interaction file's entries (built now: a
    broken one stops the run here), the tools, the built-ins."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    entries = read_entries(mt.interaction_config_path) if mt.interaction_config_path else []
    named = {}
    try:
        for entry in entries:
            named[entry.name] = build_entry(entry, default_timeout_s=cfg.env.step_timeout_s,
                                            concurrency=cfg.env.concurrency)
    except BaseException:
        EnvRouter(named=named, by_data_source={}, default=SINGLE_TURN, wrap_tools=None, builtins={}).close()
        raise
    limits = ToolLimits(max_parallel_calls=mt.max_parallel_calls,
                        max_tool_response_length=mt.max_tool_response_length,
                        truncate_side=mt.tool_response_truncate_side, format=mt.format)
    # A turn's calls run one after another, each waiting for one of tool_concurrency slots that
    # the batch's env.concurrency steps share: a step's deadline covers that queue.
    queue = math.ceil(cfg.env.concurrency / mt.tool_concurrency) * mt.max_parallel_calls
    deadline = max(cfg.env.step_timeout_s, mt.tool_timeout_s * queue + 5.0)
    wrap = None if tools is None else (lambda inner: ToolEnvironment(tools, limits, inner=inner,
                                                                     deadline_s=deadline))
    return EnvRouter(named=named, by_data_source=cfg.env.by_data_source,
                     default=TOOL_AGENT if tools is not None else SINGLE_TURN,
                     wrap_tools=wrap, builtins=dict(BUILTINS))


def check_rows(router: EnvRouter, samples: Iterable[Sample], *, key: str, log=print) -> dict[str, int]:
    """Resolve every row's environment (ValueError for an unknown one) and say
    what is not used: rows naming an interaction when no interaction file is given."""
    samples = list(samples)
    counts = router.check(samples, key=key)
    orphans = sum(1 for s in samples if isinstance((s.extra_info or {}).get("interaction_kwargs"), dict)
                  and s.extra_info["interaction_kwargs"].get("name") and not router.named)
    if orphans:
        log(f"note: {key}: {orphans} row(s) name an interaction (extra_info.interaction_kwargs.name) "
            "but actor_rollout_ref.rollout.multi_turn.interaction_config_path is not set: they run "
            "without it, as verl's single_turn_agent would")
    return counts


def needs_loop(counts: dict[str, int]) -> bool:
    """Some row talks to an environment (the loop wraps the engine)."""
    return any(name != SINGLE_TURN for name in counts)


def with_env_loop(cfg: Config, engine, *, tokenizer, router: EnvRouter, eos_token_ids: list[int],
                  chat_kwargs: dict) -> EnvRollout:
    """`engine` (a RolloutRole) inside the environment loop."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    limits = LoopLimits(max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
                        step_timeout_s=cfg.env.step_timeout_s, concurrency=cfg.env.concurrency)
    turn_tokens = TurnTokens(tokenizer, end_of_turn_ids=eos_token_ids, chat_kwargs=chat_kwargs)
    return EnvRollout(engine, tokenizer=tokenizer, router=router, turn_tokens=turn_tokens,
                      limits=limits, eos_token_ids=eos_token_ids)
