"""The `tiny` fixture of the fault tests (helpers: fault_helpers.py)."""

from __future__ import annotations

import pytest
from fault_helpers import overrides


@pytest.fixture
def tiny(asset_cache, tiny_model_dir, tmp_path):
    """(run_dir, argv builder) for a tiny run in tmp_path/run."""
    run_dir = tmp_path / "run"
    return run_dir, lambda *extra: ["train", *overrides(tiny_model_dir, run_dir, *extra)]
