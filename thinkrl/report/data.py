"""A run directory read back: metrics.jsonl as columns, config.yaml, saved generations.

Readers are forgiving, because a report is most wanted for a run that went
wrong: a line cut short by a crash, a NaN, a step logged twice after a
resume. Whatever was skipped is said in `notes`, which the page shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from thinkrl.errors import UserError
from thinkrl.generations import Generation

GENERATION_KINDS = ("train", "val")


@dataclass
class RunMetrics:
    """One row per logged step (sorted); `columns[key]` is [S] floats with NaN
    where the step did not log that key (validation keys, for one)."""

    steps: np.ndarray
    columns: dict[str, np.ndarray]
    notes: list[str] = field(default_factory=list)

    def has(self, key: str) -> bool:
        """The key was logged with at least one finite value."""
        return key in self.columns and bool(np.isfinite(self.columns[key]).any())

    def present(self, keys) -> list[str]:
        return [key for key in keys if self.has(key)]

    def matching(self, prefix: str, *, contains: tuple[str, ...] = ("",)) -> list[str]:
        """Logged keys under `prefix` that contain any of `contains`, sorted."""
        return sorted(k for k in self.columns
                      if k.startswith(prefix) and any(c in k for c in contains) and self.has(k))


@dataclass(frozen=True)
class SavedGeneration:
    kind: str
    """"train" or "val" (from the file name), "" when the name says neither."""
    step: int
    generation: Generation


def load_metrics(run_dir: Path) -> RunMetrics:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UserError(f"{run_dir}: no metrics.jsonl here; give the run directory "
                         "(trainer.default_local_dir of the run), e.g. thinkrl report runs/thinkrl/tiny")
    notes: list[str] = []
    by_step: dict[int, dict[str, float]] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    bad_lines, repeated = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            bad_lines.append(number)
            continue
        if step in by_step:
            repeated.append(step)
        by_step[step] = {k: _number(v) for k, v in record.items() if k != "step"}
    if repeated:
        notes.append(f"steps {_ranges(repeated)} were logged more than once (a resumed run?): "
                     "the later line of each is shown")
    if bad_lines:
        last_cut = bad_lines == [len(lines)]
        notes.append(f"{path.name}: the last line is incomplete (the run stopped while writing "
                     "it) and was skipped" if last_cut else
                     f"{path.name}: skipped unreadable lines {_ranges(bad_lines)}")
    if not by_step:
        raise UserError(f"{path}: holds no complete metrics line yet; run at least one step "
                         "(or validation) first")
    steps = np.array(sorted(by_step))
    keys = sorted({k for values in by_step.values() for k in values})
    columns = {k: np.array([by_step[s].get(k, math.nan) for s in steps], dtype=float)
               for k in keys}
    return RunMetrics(steps=steps, columns=columns, notes=notes)


def load_config(run_dir: Path) -> dict[str, Any] | None:
    """config.yaml as a nested dict, or None when absent or unreadable."""
    path = run_dir / "config.yaml"
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def config_value(config: dict[str, Any] | None, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def load_generations(run_dir: Path, notes: list[str]) -> list[SavedGeneration]:
    """Every `generations/*.jsonl` record; unreadable lines are noted and skipped."""
    found: list[SavedGeneration] = []
    for path in sorted((run_dir / "generations").glob("*.jsonl")):
        kind = next((k for k in GENERATION_KINDS if path.name.startswith(f"{k}_")), "")
        bad = 0
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                found.append(SavedGeneration(kind=kind, step=int(record["step"]),
                                             generation=_lenient_generation(record)))
            except (ValueError, KeyError, TypeError):
                bad += 1
        if bad:
            notes.append(f"generations/{path.name}: skipped {bad} unreadable line(s)")
    return found


def _lenient_generation(record: dict) -> Generation:
    """A saved line as a Generation, missing fields filled in (older or
    hand-edited files still render)."""
    accuracy = record.get("accuracy")
    return Generation(
        data_source=str(record.get("data_source", "")), prompt=str(record.get("prompt", "")),
        response=str(record.get("response", "")),
        ground_truth=str(record.get("ground_truth", "")), score=_number(record.get("score")),
        response_length=int(record.get("response_length") or 0),
        finish_reason=str(record.get("finish_reason", "")),
        prompt_index=int(record.get("prompt_index") or 0), row=int(record.get("row") or 0),
        accuracy=None if accuracy is None else _number(accuracy),
        images=tuple(str(i) for i in record.get("images") or () if str(i).startswith(
            "data:image/")))  # only our own thumbnails go into the page


def _number(value: Any) -> float:
    """A logged value as a float: numbers as they are, "nan"/"inf" strings
    (how metrics.jsonl writes non-finite values) as floats, anything else NaN."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _ranges(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:10]))
    return shown + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")
