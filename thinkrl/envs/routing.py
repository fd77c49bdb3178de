"""Which environment each row talks to, and the named environments of a run.

A row's environment, first rule that applies:

1. ``extra_info.agent_name`` (verl's): ``single_turn_agent`` (one turn),
   ``tool_agent`` (the run's tools; with 2. also its interaction), or the
   name of a thinkrl environment;
2. ``extra_info.interaction_kwargs.name`` (verl's): that interaction of the
   interaction file;
3. ``env.by_data_source``: the first pattern (a data_source or a glob) that
   matches the row's data_source;
4. built-in routes: ``textarena/<game>`` rows play that textarena game;
5. otherwise ``tool_agent`` when ``multi_turn.enable`` (the tool loop for
   every row, as before environments), else ``single_turn_agent``.

Named environments come from the interaction file
(``actor_rollout_ref.rollout.multi_turn.interaction_config_path``, verl's
format: an ``interaction:`` list of ``name``, ``class_name``, ``config``).
A class with verl's interaction coroutines runs as a verl interaction; any
other class is a thinkrl `Environment` built as ``cls(config=config)``.
thinkrl's own entry keys: ``workers: N`` serves the environment from N
worker processes (`thinkrl.envs.server`: a crash or hang never reaches the
trainer), ``step_timeout_s`` overrides ``env.step_timeout_s`` for it.

Every row's environment is resolved when the run is built: a misnamed one
stops the run there, naming the closest name.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from thinkrl.envs.classes import make_environment
from thinkrl.errors import UserError
from thinkrl.records import SINGLE_TURN, Sample

TOOL_AGENT = "tool_agent"
BUILTIN_ROUTES = {"textarena/": "textarena"}
"""data_source prefix -> built-in environment (rule 4)."""
BUILTIN_NAMES = ("textarena", "retry_user")
"""Environments thinkrl ships (`thinkrl.envs.setup.BUILTINS`): no file entry may take their names."""
KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


@dataclass(frozen=True)
class EnvEntry:
    """One entry of the interaction file."""

    name: str
    class_name: str
    config: dict = field(default_factory=dict)
    workers: int = 0
    step_timeout_s: float | None = None
    where: str = ""
    """`<file>: interaction[i]`, for messages."""


def read_entries(path: str | Path) -> list[EnvEntry]:
    """The entries of verl's interaction file at `path`; ValueError naming the
    entry and what to fix."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{KEY}={path}: no such file; give verl's interaction file (an "
                         "`interaction:` list of name / class_name / config entries)")
    try:
        items = (yaml.safe_load(path.read_text()) or {}).get("interaction")
    except (yaml.YAMLError, AttributeError) as err:
        raise UserError(f"{path}: not a YAML mapping with an `interaction:` list ({err})") from None
    if not isinstance(items, list) or not items:
        raise UserError(f"{path}: expected a non-empty `interaction:` list of name / class_name / "
                         "config entries")
    entries: list[EnvEntry] = []
    for i, item in enumerate(items):
        where = f"{path}: interaction[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("class_name"), str):
            raise UserError(f"{where}: needs class_name (a dotted import path)")
        simple = item["class_name"].rpartition(".")[2]
        # verl's default name: the class's name without "Interaction", lower case
        default = simple[:-len("Interaction")] if simple.endswith("Interaction") else simple
        name = str(item.get("name") or default.lower())
        workers = item.get("workers", 0)
        if not isinstance(workers, int) or workers < 0:
            raise UserError(f"{where}: workers={workers!r}: give a whole number >= 0 (0: in the trainer)")
        timeout = item.get("step_timeout_s")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise UserError(f"{where}: step_timeout_s={timeout!r}: give seconds > 0")
        if name in (SINGLE_TURN, TOOL_AGENT, *BUILTIN_NAMES):
            raise UserError(f"{where}: the name {name!r} is a built-in environment's; choose another")
        if name in {e.name for e in entries}:
            raise UserError(f"{where}: duplicate interaction name {name!r}; names must differ")
        config = item.get("config") or {}
        if not isinstance(config, dict):
            raise UserError(f"{where}: config must be a mapping")
        entries.append(EnvEntry(name, item["class_name"], dict(config), workers,
                                None if timeout is None else float(timeout), where))
    return entries


def build_entry(entry: EnvEntry, *, default_timeout_s: float, concurrency: int) -> Any:
    """The environment of one entry: a verl interaction, a thinkrl environment,
    or either served by worker processes (`workers` > 0); `concurrency` is
    the loop's (calls that may queue on its workers)."""
    if entry.workers > 0:
        from thinkrl.envs.server import ServedEnvironment

        return ServedEnvironment(entry, default_timeout_s=default_timeout_s, concurrency=concurrency)
    return make_environment(entry.class_name, entry.config, name=entry.name, where=entry.where,
                            timeout_s=entry.step_timeout_s or default_timeout_s)


class EnvRouter:
    """Row -> environment name -> environment object, for one run."""

    single_turn = SINGLE_TURN

    def __init__(self, *, named: dict[str, Any], by_data_source: dict[str, str], default: str,
                 wrap_tools: Callable[[Any], Any] | None, builtins: dict[str, Callable[[], Any]]) -> None:
        self.named = named
        """name -> environment (file entries), built at start."""
        self.by_data_source = dict(by_data_source)
        self.default = default
        self.wrap_tools = wrap_tools
        """inner -> the tool environment around it; None: the run has no tools."""
        self.builtins = builtins
        self._envs: dict[str, Any] = {}

    def name_for(self, sample: Sample) -> str:
        info = sample.extra_info or {}
        agent = info.get("agent_name")
        interaction = (info.get("interaction_kwargs") or {}).get("name") if isinstance(
            info.get("interaction_kwargs"), dict) else None
        if agent == SINGLE_TURN:
            return SINGLE_TURN
        if agent and agent != TOOL_AGENT:
            return str(agent)
        if interaction and (interaction in self.named or interaction in self.builtins):
            return str(interaction)
        if interaction and self.named:
            return str(interaction)  # unknown: `check` names the closest
        for pattern, name in self.by_data_source.items():
            if fnmatch.fnmatchcase(sample.data_source, pattern):
                return name
        for prefix, name in BUILTIN_ROUTES.items():
            if sample.data_source.startswith(prefix):
                return name
        if agent == TOOL_AGENT and self.wrap_tools is not None:
            return TOOL_AGENT
        return self.default

    def known(self) -> list[str]:
        names = [SINGLE_TURN, *self.named, *self.builtins]
        return names + ([TOOL_AGENT] if self.wrap_tools is not None else [])

    def check(self, samples: Iterable[Sample], *, key: str) -> dict[str, int]:
        """Rows per environment; ValueError naming a row whose environment is
        unknown and the closest known name."""
        counts: dict[str, int] = {}
        for sample in samples:
            name = self.name_for(sample)
            if name not in self.known():
                close = difflib.get_close_matches(name, self.known(), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(self.known())}"
                raise UserError(
                    f"{key}: row {sample.index} (data_source {sample.data_source}) asks for the "
                    f"environment {name!r}, which this run does not have; {hint} Environments come "
                    f"from {KEY} (verl's interaction file), the built-ins ({', '.join(self.builtins)}) "
                    f"and {TOOL_AGENT} with actor_rollout_ref.rollout.multi_turn.enable=True")
            counts[name] = counts.get(name, 0) + 1
        for name in counts:
            self.env(name)  # build now: a broken environment stops the run at start
        for sample in samples:  # an environment that cannot serve a row says so now
            env = self.env(self.name_for(sample))
            check = getattr(env, "check", None)
            if check is not None:
                try:
                    check(sample)
                except ValueError as err:
                    raise UserError(f"{key}: row {sample.index} (data_source {sample.data_source}): "
                                     f"{err}") from None
        return counts

    def owns_reward(self, sample: Sample) -> bool:
        """The row's environment scores it (its reward function is not called)."""
        env = self.env(self.name_for(sample))
        return env is not None and bool(env.scores)

    def env(self, name: str) -> Any:
        """The environment object of `name`; None for single-turn rows."""
        if name == SINGLE_TURN:
            return None
        if name not in self._envs:
            if name == TOOL_AGENT:
                self._envs[name] = self.wrap_tools(None)
            elif name in self.named:
                env = self.named[name]
                wraps = self.wrap_tools is not None and bool(getattr(env, "tool_turns", False))
                self._envs[name] = self.wrap_tools(env) if wraps else env
            else:
                self._envs[name] = self.builtins[name]()
        return self._envs[name]

    def close(self) -> None:
        """Stop what the environments hold (worker processes, event loops); idempotent."""
        envs = {id(e): e for e in [*self.named.values(), *self._envs.values()]}
        self.named, self._envs = {}, {}
        for env in envs.values():
            for obj in (env, getattr(env, "inner", None)):
                shutdown = getattr(obj, "shutdown", None)
                if shutdown is not None:
                    shutdown()
