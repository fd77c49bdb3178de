"""Command-line and YAML values converted to a config field's annotated type.

`coerce` is the one entry point: it returns the converted value or raises a
ValueError naming the key, the value given, the type expected and an example.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

import yaml

from thinkrl.errors import UserError

INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")
NULLS = frozenset({"null", "Null", "NULL", "None", "~"})
BOOL_TEXT = {"true": True, "false": False, "1": True, "0": False}


def coerce(value: Any, raw: str | None, tp: Any, *, key: str, example: Any, source: str) -> Any:
    """Convert ``value`` (``raw``: its command-line text) to ``tp`` or raise a ValueError."""
    converted = convert(value, raw, tp)
    if converted is INVALID:
        shown = raw if raw is not None else render(value)
        raise UserError(
            f"{source}: {key} expects {type_text(tp)}, got {shown!r}; e.g. {key}={render_example(tp, example)}"
        )
    return converted


INVALID = object()


def convert(value: Any, raw: str | None, tp: Any) -> Any:
    """``value`` as type ``tp``, or ``INVALID``."""
    if is_union(tp):
        args = typing.get_args(tp)
        if type(None) in args and is_null(value, raw):
            return None
        options = [a for a in args if a is not type(None)]
        if set(options) == {str, list[str]}:
            as_list = isinstance(value, list) and not (raw is not None and is_quoted(raw))
            return convert(value, raw, list[str] if as_list else str)
        (option,) = options
        return convert(value, raw, option)
    origin = typing.get_origin(tp)
    if tp is bool:
        if raw is not None:
            text = raw.strip()[1:-1] if is_quoted(raw) else raw
            return BOOL_TEXT.get(text.strip().lower(), INVALID)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        return BOOL_TEXT.get(value.strip().lower(), INVALID) if isinstance(value, str) else INVALID
    if tp is int:
        number = parse_number(value)
        return int(number) if number is not None and float(number).is_integer() else INVALID
    if tp is float:
        number = parse_number(value)
        return float(number) if number is not None else INVALID
    if tp is str:
        if raw is not None:
            return value if is_quoted(raw) and isinstance(value, str) else raw
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            return str(value)
        return INVALID
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = value if isinstance(value, list) else [value] if item_tp is str else None
        if items is None:
            return INVALID
        out = [convert(item, None, item_tp) for item in items]
        return INVALID if any(o is INVALID for o in out) else out
    if tp is dict or origin is dict:
        return copy.deepcopy(dict(value)) if isinstance(value, Mapping) else INVALID
    raise AssertionError(f"config type {tp!r} has no converter")


def parse_number(value: Any) -> int | float | None:
    if isinstance(value, str):
        for parse in (int, float):  # PyYAML reads "1e-6" (no dot) as a string
            try:
                return parse(value.strip())
            except ValueError:
                pass
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def type_text(tp: Any) -> str:
    if is_union(tp):
        return " or ".join(type_text(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin is list:
        return f"a list of {type_text(typing.get_args(tp)[0]).split(' ', 1)[1]}s"
    if tp is dict or origin is dict:
        return "a mapping"
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}[tp]


def render_example(tp: Any, example: Any) -> str:
    if example is None or has_interpolation(example):
        first = ([a for a in typing.get_args(tp) if a is not type(None)] or [tp])[0]
        fallback = {"key": 1} if is_dict_type(first) else ["a"]
        example = {bool: True, int: 4, float: 0.5, str: "value"}.get(first, fallback)
    return render(example)


def render(value: Any) -> str:
    """``value`` as it would be written on the command line."""
    if isinstance(value, list):
        return "[" + ",".join(map(render, value)) + "]"
    if isinstance(value, dict):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return "null" if value is None else str(value)


def is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def is_dict_type(tp: Any) -> bool:
    return tp is dict or typing.get_origin(tp) is dict


def is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def is_null(value: Any, raw: str | None) -> bool:
    if raw is not None and is_quoted(raw):
        return False
    return value is None or (isinstance(value, str) and value.strip() in NULLS)


def is_quoted(raw: str) -> bool:
    raw = raw.strip()
    return len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\""


def has_interpolation(value: Any) -> bool:
    if isinstance(value, (list, dict)):
        return any(map(has_interpolation, value.values() if isinstance(value, dict) else value))
    return isinstance(value, str) and "${" in value
