"""Tool calls as a model writes them, in the "hermes" format of Qwen2.5's chat
template: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

A call that cannot be read (bad JSON, no name) is kept with its error, so
the model is told what was wrong instead of getting no answer (verl drops
such calls silently, and the model never learns its call was malformed).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from thinkrl.errors import UserError

FORMATS = ("hermes",)
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None
    """Why the call could not be read; None for a well-formed call."""


def parse_tool_calls(text: str, *, format: str = "hermes") -> list[ToolCall]:
    """The calls in one assistant turn's text, in the order written."""
    if format != "hermes":
        raise UserError(f"multi_turn.format={format!r}: use one of {', '.join(FORMATS)}")
    return [_read(body) for body in _HERMES.findall(text)]


def _read(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall("", error=f"the tool call is not valid JSON ({err.msg} at character {err.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='a tool call must be a JSON object with a "name" and "arguments"')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error='"arguments" must be a JSON object')
    if not isinstance(arguments, dict):
        return ToolCall(obj["name"], error='"arguments" must be a JSON object')
    return ToolCall(obj["name"], arguments)


def hermes_call(name: str, arguments: dict) -> str:
    """The text of one call, as the model should write it (pretraining data, tests)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
