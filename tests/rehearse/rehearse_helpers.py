"""Real model folders for the rehearsal tests: the real config.json of
Qwen2.5-7B-Instruct (or Qwen2.5-VL-7B-Instruct) and the real Qwen2.5
tokenizer files, no weights, as a user has them before the cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import QWEN_TOKENIZER, SHARED_DATA

MODELS = SHARED_DATA / "models"


def real_model_folder(name: str, out: Path) -> Path:
    """`out` holding the real config files of `name` (a folder of
    ../shared/data/models) and the Qwen2.5 tokenizer; skips without them."""
    source = MODELS / name
    if not (source / "config.json").is_file() or not (QWEN_TOKENIZER / "vocab.json").is_file():
        pytest.skip("../shared/data (real model configs, the Qwen2.5 tokenizer) is absent")
    out.mkdir(parents=True, exist_ok=True)
    for path in [*source.iterdir(), QWEN_TOKENIZER / "vocab.json", QWEN_TOKENIZER / "merges.txt"]:
        shutil.copy(path, out / path.name)
        (out / path.name).chmod(0o644)
    return out
