"""The run's tools from its config (``actor_rollout_ref.rollout.multi_turn``); the
loop that runs them is `thinkrl.envs` (the tool loop is one environment)."""

from __future__ import annotations

from importlib import resources

from thinkrl.config import Config
from thinkrl.errors import UserError
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


def tool_file(path: str) -> str:
    """`builtin:NAME` names a tool file shipped with thinkrl (recipes/tools/NAME.yaml)."""
    if not path.startswith("builtin:"):
        return path
    folder = resources.files("thinkrl") / "recipes" / "tools"
    shipped = folder / f"{path[len('builtin:'):]}.yaml"
    if not shipped.is_file():
        known = sorted(f"builtin:{p.name[:-5]}" for p in folder.iterdir() if p.name.endswith(".yaml"))
        raise UserError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}: no such "
                         f"built-in tool file; use one of {', '.join(known)} or a path")
    return str(shipped)
