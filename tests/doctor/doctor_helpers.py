"""Helpers for the doctor's tests (imported by name: tests/doctor is on sys.path)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from thinkrl.commands.common import recipe_path
from thinkrl.config import load_config
from thinkrl.doctor import DoctorContext


def tiny_config(*overrides: str):
    """The tiny recipe (built-in data) plus overrides."""
    return load_config(recipe_path("tiny"), list(overrides))


def context(*overrides: str, env: dict | None = None, **known) -> DoctorContext:
    """A context for the tiny recipe; `known` presets what the context would
    otherwise compute (model_config=..., tokenizer=..., device_kind=...)."""
    ctx = DoctorContext(tiny_config(*overrides), env={} if env is None else env)
    ctx.__dict__.update(known)  # cached_property values: the check reads these
    return ctx


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def row(question: str = "What is 2 + 3?", *, source: str = "openai/gsm8k", answer: str = "5") -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"index": 0}}
