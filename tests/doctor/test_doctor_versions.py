"""Version checks against versions.yaml (seed 000, bug 4: a torch_npu build without an op)."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest
from doctor_helpers import context

from thinkrl.doctor import versions
from thinkrl.doctor.versions import (cann_version, check_known_bad, check_npu_ops, check_stack, load_table,
                                     matches)


def _fake_metadata(monkeypatch, installed: dict[str, str]) -> None:
    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]
    monkeypatch.setattr(importlib.metadata, "version", version)


def test_version_specs():
    assert matches("2.7.1+cpu", "2.7") and matches("2.7.1", "2.7.1") and not matches("2.7.10", "2.7.1")
    assert matches("4.53.2", "<4.54") and not matches("4.54.0", ">=4.51,<4.54")
    assert matches("8.3.RC1", "8.3") and matches("2.5.1rc1", "2.5.1rc1") and matches("0.11.0rc1", "0.11.0")
    assert not matches("2.70.0", "2.7") and not matches("2.5.1", "2.5.1rc1")


def test_table_entries_are_well_formed():
    table = load_table()
    names = set(versions.PACKAGES) | {"cann", "name", "source"}
    for entries in (table.tested, table.expected):
        assert entries and all("torch" in e and set(e) <= names for e in entries)
    assert all({"package", "version", "reason", "fix"} <= set(b) for b in table.known_bad)


def test_this_machines_stack_is_tested(monkeypatch):
    _fake_metadata(monkeypatch, {"torch": "2.13.0+cpu", "transformers": "5.24.0"})
    row = check_stack(context())
    assert row.status == "ok" and "(tested: thinkrl CI" in row.found


def test_an_unknown_combination_warns_and_does_not_fail(monkeypatch):
    _fake_metadata(monkeypatch, {"torch": "2.7.1", "transformers": "4.57.0", "vllm": "0.6.3"})
    row = check_stack(context())
    assert row.status == "warn" and "vllm 0.6.3" in row.found and "transformers 4.57.0" in row.found
    assert "vllm 0.10.0" in row.fix  # what was tested with this torch


def test_the_seed_ascend_stack_is_tested(monkeypatch, tmp_path):
    _fake_metadata(monkeypatch, {"torch": "2.7.1", "torch_npu": "2.7.1", "vllm": "0.11.0",
                                 "vllm_ascend": "0.11.0rc1"})
    info = tmp_path / "aarch64-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir()
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.3.RC1\narch=aarch64\n")
    ctx = context(env={"ASCEND_TOOLKIT_HOME": str(tmp_path)})
    assert cann_version(ctx.env) == "8.3.RC1"
    row = check_stack(ctx)
    assert row.status == "ok" and "cann 8.3.RC1" in row.found and "seed 004" in row.found
    assert "expected, not run by thinkrl's tests" in row.found  # no NPU ran it here


def test_a_known_bad_torch_npu_build_is_named(monkeypatch):
    _fake_metadata(monkeypatch, {"torch": "2.5.1", "torch_npu": "2.5.1rc1"})
    [row] = check_known_bad(context())
    assert row.status == "fail" and "torch_npu 2.5.1rc1" in row.found and "_npu_rotary_embedding" in row.found
    assert "2.5.1.dev20250320" in row.fix


def test_a_known_bad_pair_needs_both_packages(monkeypatch):
    _fake_metadata(monkeypatch, {"torch": "2.7.0", "transformers": "4.55.0"})
    assert check_known_bad(context())[0].status == "ok"
    _fake_metadata(monkeypatch, {"torch": "2.7.0", "transformers": "4.55.0", "vllm": "0.9.2"})
    assert check_known_bad(context())[0].status == "fail"


@pytest.mark.parametrize("has_op", [False, True])
def test_torch_npu_without_the_rotary_op_fails_whatever_its_version(monkeypatch, has_op):
    fake = types.ModuleType("torch_npu")
    fake.__version__ = "2.5.1"
    if has_op:
        fake._npu_rotary_embedding = lambda *args: None
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    row = check_npu_ops(context())
    assert row.status == ("ok" if has_op else "fail")
    if not has_op:
        assert "_npu_rotary_embedding" in row.found and "torch_npu==" in row.fix


def test_no_torch_npu_is_fine():
    assert "torch_npu" not in sys.modules
    assert check_npu_ops(context()).status == "ok"


def test_a_stack_covered_by_tested_and_expected_entries_together_says_which(monkeypatch):
    # torch 2.7.1 + transformers 5.24 + ray: tested here; vllm 0.10.0 with torch 2.7.1: expected
    _fake_metadata(monkeypatch, {"torch": "2.7.1", "transformers": "5.24.0", "ray": "2.60.0",
                                 "vllm": "0.10.0"})
    row = check_stack(context())
    assert row.status == "ok", row.found
    assert "tested: thinkrl ray backend on torch 2.7.1" in row.found
    assert "expected, not run by thinkrl's tests: verl + vLLM 0.10.0" in row.found
