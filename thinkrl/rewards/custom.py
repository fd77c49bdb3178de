"""A user's reward function, loaded from a Python file by path
(`custom_reward_function.path` and `.name`, as in verl).

The function has verl's signature and is called by keyword:

    compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
        -> float | {"score": float, ...}

Every check (file, name, callable, signature) runs when the run is built, so
a typo stops the run at start, not at step 1. Reward workers load the file
again by path, so it needs no package and no `__init__.py`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from thinkrl.errors import UserError, nearest_files

RewardFunction = Callable[..., "float | dict[str, float]"]

_SIGNATURE = "(data_source, solution_str, ground_truth, extra_info=None, **kwargs)"


def load_reward_function(path: str | Path, name: str = "compute_score") -> RewardFunction:
    """The function `name` defined in the Python file at `path`.

    Raises ValueError when the file is missing (listing the nearest files),
    does not import, lacks `name` (listing the functions it defines), or
    `name` is not a function taking verl's arguments.
    """
    file = check_reward_file(path)
    key = "custom_reward_function.path"
    module_name = "thinkrl_user_reward_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserError(f"{key}={path}: not a Python file Python can import; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise UserError(f"{key}={path}: importing it failed with {type(err).__name__}: {err}. "
                         "Fix the file (run `python <file>` to see the traceback).") from err
    if not hasattr(module, name):
        defined = sorted(n for n, obj in vars(module).items()
                         if inspect.isfunction(obj) and obj.__module__ == module_name)
        raise UserError(
            f"custom_reward_function.name={name}: {file} defines no {name!r}; functions it "
            f"defines: {', '.join(defined) or 'none'}. Set custom_reward_function.name to one of them.")
    function = getattr(module, name)
    check_signature(function, where=f"{file}:{name}")
    return function


def check_reward_file(path: str | Path) -> Path:
    """The file at `path`, or ValueError listing the nearest files (no import:
    user code runs in a worker first, under a deadline)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError(f"custom_reward_function.path={path}: no such file.{nearest_files(file)}")
    return file


def check_signature(function: object, *, where: str) -> None:
    """ValueError unless `function` can be called as verl calls a reward function."""
    if not callable(function):
        raise UserError(f"{where} is a {type(function).__name__}, not a function; "
                         f"define def {where.rsplit(':', 1)[-1]}{_SIGNATURE}")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # a builtin without introspectable arguments: trust it
    try:
        signature.bind(data_source="", solution_str="", ground_truth="", extra_info=None)
    except TypeError as err:
        raise UserError(f"{where}{signature} cannot be called with verl's reward arguments "
                         f"({err}); define it as {_SIGNATURE}") from None

