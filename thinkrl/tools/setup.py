"""The run's tool loop from its config (``actor_rollout_ref.rollout.multi_turn``)."""

from __future__ import annotations

from importlib import resources

from thinkrl.config import Config
from thinkrl.tools.registry import ToolRunner, load_tools


def run_tools(cfg: Config) -> ToolRunner | None:
    """The tools of a multi-turn run (its tool file's), None when multi_turn is off."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    tools = load_tools(tool_file(mt.tool_config_path)) if mt.tool_config_path else []
    return ToolRunner(tools, concurrency=mt.tool_concurrency, timeout_s=mt.tool_timeout_s)


def chat_kwargs_with_tools(cfg: Config, runner: ToolRunner | None) -> dict:
    """``data.apply_chat_template_kwargs``, plus the tools' schemas (``tools=``,
    which Qwen2.5's template writes into the system prompt) when there are tools."""
    kwargs = dict(cfg.data.apply_chat_template_kwargs)
    if runner is not None and runner.schemas:
        kwargs.setdefault("tools", runner.schemas)
    return kwargs


def with_tool_loop(cfg: Config, engine, *, tokenizer, runner: ToolRunner, eos_token_ids: list[int]):
    """`engine` (a RolloutRole) inside the multi-turn tool loop."""
    from thinkrl.rollout.tool_loop import ToolRollout, TurnLimits
    from thinkrl.rollout.tool_turns import ToolTurnTokens

    mt = cfg.actor_rollout_ref.rollout.multi_turn
    limits = TurnLimits(max_assistant_turns=mt.max_assistant_turns, max_user_turns=mt.max_user_turns,
                        max_parallel_calls=mt.max_parallel_calls,
                        max_tool_response_length=mt.max_tool_response_length,
                        truncate_side=mt.tool_response_truncate_side, format=mt.format)
    turn_tokens = ToolTurnTokens(tokenizer, end_of_turn_ids=eos_token_ids,
                                 chat_kwargs=chat_kwargs_with_tools(cfg, runner))
    return ToolRollout(engine, tokenizer=tokenizer, runner=runner, turn_tokens=turn_tokens,
                       limits=limits, eos_token_ids=eos_token_ids)


def tool_file(path: str) -> str:
    """`builtin:NAME` names a tool file shipped with thinkrl (recipes/tools/NAME.yaml)."""
    if not path.startswith("builtin:"):
        return path
    folder = resources.files("thinkrl") / "recipes" / "tools"
    shipped = folder / f"{path[len('builtin:'):]}.yaml"
    if not shipped.is_file():
        known = sorted(f"builtin:{p.name[:-5]}" for p in folder.iterdir() if p.name.endswith(".yaml"))
        raise ValueError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}: no such "
                         f"built-in tool file; use one of {', '.join(known)} or a path")
    return str(shipped)
