"""An environment object from an entry's dotted class name, built as verl
builds interactions (``cls(config=...)``): a verl interaction class is
wrapped (`thinkrl.envs.verl_interaction`), any other class must be a thinkrl
`Environment`. Used in the trainer and in environment worker processes."""

from __future__ import annotations

import importlib
from typing import Any

from thinkrl.envs.verl_interaction import build_interaction, is_verl_interaction, verl_base_importable
from thinkrl.errors import UserError


def import_class(class_name: str, *, where: str) -> type:
    """The class at the dotted path `class_name` (verl's base class importable
    for it even without verl)."""
    module_name, _, attr = class_name.rpartition(".")
    try:
        with verl_base_importable():
            return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise UserError(f"{where}: cannot import {class_name} ({type(err).__name__}: {err})") from None


def make_environment(class_name: str, config: dict, *, name: str, where: str, timeout_s: float) -> Any:
    """`class_name` built as verl or thinkrl builds it (in this process);
    `timeout_s` bounds a verl interaction's coroutines."""
    cls = import_class(class_name, where=where)
    try:
        if is_verl_interaction(cls):
            return build_interaction(cls, name=name, config=config, timeout_s=timeout_s)
        env = cls(config=config)
    except Exception as err:
        raise UserError(f"{where}: {class_name}(config=...) failed: {type(err).__name__}: {err}") from None
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(env, m, None))]
    if missing or not hasattr(env, "scores"):
        raise UserError(f"{where}: {class_name} is neither a verl interaction (async "
                         "start_interaction / generate_response) nor a thinkrl Environment (reset, "
                         f"step, close, scores); it lacks {', '.join(missing) or 'scores'}")
    return env
