"""Config keys as dotted strings: reading a value by its key, and showing it
as a command line would (shared by the checks, the sizes and the notes)."""

from __future__ import annotations

import functools
from typing import Any

ARR = "actor_rollout_ref"


@functools.lru_cache(maxsize=256)
def key_path(key: str) -> tuple[str, ...]:
    return tuple(key.split("."))


def value_at(obj: Any, key: str) -> Any:
    for part in key_path(key):
        obj = getattr(obj, part)
    return obj


def shown(value: Any) -> str:
    return "null" if value is None else str(value)
