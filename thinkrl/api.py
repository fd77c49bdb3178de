"""thinkrl from Python (a notebook, a script): the same run as `thinkrl train`.

    import thinkrl
    result = thinkrl.train("smol", {"trainer.total_training_steps": 4})
    result.metrics[-1]["critic/score/mean"], result.last_val
    cfg = thinkrl.resolved_config("smol", ["trainer.seed=2"])   # what it would run, checked

`recipe` is what `--config` takes (a built-in recipe's name, a YAML file),
a recipe as a dict (nested, or with dotted keys), or None (the tiny recipe;
with overrides only, verl's defaults, as on the command line). `overrides`
are verl's dotted keys, as a dict of values or a list of "key=value". The
doctor's checks run first, as in `thinkrl train`; a failing one raises
ValueError with its fix (`doctor=False` starts anyway). Errors raise; nothing
calls sys.exit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from thinkrl.config.schema import Config
from thinkrl.errors import UserError


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    steps: int
    """The last step trained (a resumed run counts the steps before it too)."""
    first_val: dict[str, float]
    """Validation before the first step (empty if none ran)."""
    last_val: dict[str, float]
    """The last validation."""
    metrics: list[dict[str, Any]]
    """Every record of the run's metrics.jsonl, one per step (and validation), in order."""


def resolved_config(recipe: str | Path | Mapping[str, Any] | Config | None = None,
                    overrides: Mapping[str, Any] | Sequence[str] = (), *,
                    log: Callable[[str], None] = print) -> Config:
    """The resolved, validated config a run would use (ValueError naming the key and the fix)."""
    from thinkrl.commands.common import load_run_config
    from thinkrl.config import load_config
    from thinkrl.config.checks import validate

    if isinstance(recipe, Config):
        if overrides:
            raise UserError("overrides apply to a recipe, not to a Config object: change its fields, "
                             "or pass the recipe's name, file or dict with the overrides")
        cfg = recipe
    elif isinstance(recipe, Mapping):
        cfg = load_config(recipe, _as_overrides(overrides))
    else:
        cfg = load_run_config(None if recipe is None else str(recipe), _as_overrides(overrides), log=log)
    validate(cfg)
    return cfg


def train(recipe: str | Path | Mapping[str, Any] | Config | None = None,
          overrides: Mapping[str, Any] | Sequence[str] = (), *, doctor: bool = True,
          log: Callable[[str], None] = print) -> RunResult:
    """Trains as `thinkrl train` does and returns the run's result and metrics."""
    from thinkrl.commands.train import preflight
    from thinkrl.metrics import read_metrics
    from thinkrl.trainer import train as train_config

    cfg = resolved_config(recipe, overrides, log=log)
    if doctor:
        preflight(cfg, log=log)
    result = train_config(cfg, log=log)
    run_dir = Path(result.run_dir)
    return RunResult(run_dir=run_dir, steps=result.steps, first_val=result.first_val,
                     last_val=result.last_val, metrics=read_metrics(run_dir))


def _as_overrides(overrides: Mapping[str, Any] | Sequence[str]) -> list[str]:
    """A dict of dotted keys and values as the command line's "key=value" (values as JSON, which
    the override parser reads as YAML: lists, numbers, booleans, null and strings keep their type)."""
    if isinstance(overrides, str):
        raise UserError(f"overrides={overrides!r}: give a dict of dotted keys, or a list of 'key=value'")
    if isinstance(overrides, Mapping):
        return [f"{key}={json.dumps(_plain(value))}" for key, value in overrides.items()]
    return list(overrides)


def _plain(value: Any) -> Any:
    """A notebook's values as JSON takes them: a Path as its text, a numpy
    scalar as its Python number, lists and dicts through."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
