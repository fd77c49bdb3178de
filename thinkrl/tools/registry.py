"""The run's tools, from verl's tool file, and running a turn's calls.

The file (``multi_turn.tool_config_path``) is verl's::

    tools:
      - class_name: thinkrl.tools.calculator.Calculator   # any importable class
        config: {type: native}                           # passed to the class
        tool_schema: {type: function, function: {name: ..., description: ..., parameters: ...}}

A class is built as ``cls(config=..., tool_schema=...)`` (verl's BaseTool
signature) and answers ``execute(parameters) -> str``. verl's own tool
classes, whose ``create`` / ``execute`` / ``release`` are coroutines and whose
``execute`` returns ``(response, reward, metrics)``, run as they are: a fresh
instance per call, as verl's agent loop does.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from thinkrl.deadline import Finished, run_all
from thinkrl.errors import UserError
from thinkrl.tools.calls import ToolCall

TRUNCATE_SIDES = ("left", "middle", "right")


class SchemaView(dict):
    """A tool schema as a dict that also reads as attributes (``schema.function.name``)
    and dumps like verl's pydantic schema, for verl tool classes that read it so."""

    def __getattr__(self, key: str):
        try:
            value = self[key]
        except KeyError:
            raise AttributeError(key) from None
        return SchemaView(value) if isinstance(value, dict) else value

    def model_dump(self, **_) -> dict:
        return dict(self)


@dataclass(frozen=True)
class Tool:
    """One tool: its OpenAI function schema and a call that returns text."""

    name: str
    schema: dict
    call: Callable[[dict], str]


def load_tools(path: str | Path) -> list[Tool]:
    """The tools of verl's tool file at `path`; ValueError naming the entry and what to fix."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}: no such "
                         "file; give verl's tool file (a `tools:` list of class_name / config / "
                         "tool_schema entries)")
    try:
        entries = (yaml.safe_load(path.read_text()) or {}).get("tools")
    except (yaml.YAMLError, AttributeError) as err:
        raise UserError(f"{path}: not a YAML mapping with a `tools:` list ({err})") from None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{path}: expected a non-empty `tools:` list of class_name / config / "
                         "tool_schema entries")
    tools = [_tool(entry, f"{path}: tools[{i}]") for i, entry in enumerate(entries)]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise UserError(f"{path}: two tools share a name ({', '.join(names)}); names must differ")
    return tools


def _tool(entry: dict, where: str) -> Tool:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise UserError(f"{where}: needs class_name (a dotted import path such as "
                         "thinkrl.tools.calculator.Calculator)")
    config = dict(entry.get("config") or {"type": "native"})
    if config.get("type", "native") != "native":
        raise UserError(f"{where}: config.type={config.get('type')!r}; only native tools run here "
                         "(MCP servers are not supported)")
    module_name, _, class_name = entry["class_name"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as err:
        raise UserError(f"{where}: cannot import {entry['class_name']} ({err})") from None
    schema = entry.get("tool_schema")
    try:
        instance = cls(config=config, tool_schema=SchemaView(schema) if schema else None)
    except Exception as err:
        raise UserError(f"{where}: {entry['class_name']}(config=..., tool_schema=...) failed: "
                         f"{type(err).__name__}: {err}") from None
    schema = dict(schema or getattr(instance, "schema", None) or _schema_of(instance) or {})
    name = (schema.get("function") or {}).get("name")
    if not name:
        raise UserError(f"{where}: no tool_schema with function.name, and {entry['class_name']} "
                         "supplies none")
    if inspect.iscoroutinefunction(getattr(instance, "execute", None)):
        return Tool(name, schema, _verl_style(cls, config, schema))
    if not callable(getattr(instance, "execute", None)):
        raise UserError(f"{where}: {entry['class_name']} has no execute(parameters) method")
    return Tool(name, schema, lambda parameters: str(instance.execute(parameters)))


def _schema_of(instance) -> dict | None:
    get = getattr(instance, "get_openai_tool_schema", None)
    if get is None:
        return None
    schema = get()
    return schema.model_dump(exclude_unset=True, exclude_none=True) if hasattr(schema, "model_dump") else schema


def _verl_style(cls, config: dict, schema: dict) -> Callable[[dict], str]:
    """A call of a verl tool class: create, execute, release on a fresh instance."""
    async def run(parameters: dict) -> str:
        tool = cls(config=config, tool_schema=SchemaView(schema))
        instance_id, _ = await tool.create()
        try:
            response, _reward, _metrics = await tool.execute(instance_id, parameters)
        finally:
            await tool.release(instance_id)
        text = getattr(response, "text", response)
        return "" if text is None else str(text)
    return lambda parameters: asyncio.run(run(parameters))


def truncated(text: str, limit: int, side: str) -> str:
    """verl's cut of a long tool answer (characters): keep the beginning
    ("left"), the end ("right") or both halves ("middle")."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    return text[:limit // 2] + "...(truncated)..." + text[-(limit // 2):]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    text: str
    """What the model reads (an error line for a failed call)."""
    failed: bool
    seconds: float


class ToolRunner:
    """Runs tool calls, each within `timeout_s` (`thinkrl.deadline`), at
    most `concurrency` at once over every thread that calls `run` (the
    environment loop steps the rollouts of a batch concurrently); a call
    that raises, hangs or names no known tool is answered with an error
    line. A hung call's thread is left behind (Python cannot stop it) and no
    longer counts against the bound, so a tool's own deadline (the
    sandbox's wall_s) should be shorter than `timeout_s`. Whether a call
    near the deadline makes it is a matter of timing: a seeded run repeats
    exactly only when no call comes close to it."""

    def __init__(self, tools: list[Tool], *, concurrency: int, timeout_s: float) -> None:
        self.tools = {t.name: t for t in tools}
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self._slots = threading.BoundedSemaphore(concurrency)

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def run(self, calls: list[ToolCall]) -> list[ToolOutcome]:
        """The calls of one turn, side by side, in order of the calls; each
        waits for a slot, and its deadline counts from when it gets one."""
        if len(calls) <= 1:
            return [self._run_one(call) for call in calls]
        with ThreadPoolExecutor(len(calls), thread_name_prefix="tool-turn") as pool:
            return list(pool.map(self._run_one, calls))

    def _run_one(self, call: ToolCall) -> ToolOutcome:
        with self._slots:
            result = run_all([functools.partial(self._answer, call)], concurrency=1,
                             timeout_s=self.timeout_s, name="tool")[0]
        if isinstance(result, Finished) and result.error is not None:  # not an Exception: SystemExit, ...
            return ToolOutcome(f"error: {type(result.error).__name__}: {result.error}", True, result.seconds)
        if isinstance(result, Finished):
            return result.value
        return ToolOutcome(f"error: the tool {call.name!r} did not answer within {self.timeout_s:g} s",
                           True, self.timeout_s)

    def _answer(self, call: ToolCall) -> ToolOutcome:
        start = time.perf_counter()
        if call.error is not None:
            return ToolOutcome(f"error: {call.error}", True, 0.0)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return ToolOutcome(f"error: there is no tool {call.name!r} (tools: {known})", True, 0.0)
        try:
            text = tool.call(call.arguments)
            failed = text.startswith("error:")
        except Exception as err:  # the tool's failure is the model's information
            text, failed = f"error: {type(err).__name__}: {err}", True
        return ToolOutcome(text, failed, time.perf_counter() - start)
