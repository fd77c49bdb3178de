"""thinkrl.atomic: a file is replaced whole or not at all; a folder is built
once, by one process at a time."""

import multiprocessing
import os
import time
from pathlib import Path

import pytest

from thinkrl.atomic import atomic_path, atomic_write_text, build_once


class _Interrupted(Exception):
    pass


@pytest.mark.parametrize("durable", [False, True])
def test_write_replaces_the_file_and_leaves_no_temporary(tmp_path, durable):
    target = tmp_path / "sub" / "state.txt"
    assert atomic_write_text(target, "one\n", durable=durable) == target  # makes the folder
    atomic_write_text(target, "two\n", durable=durable)
    assert target.read_text() == "two\n"
    assert [p.name for p in target.parent.iterdir()] == ["state.txt"]


@pytest.mark.parametrize("durable", [False, True])
def test_failure_mid_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, durable):
    target = tmp_path / "rows.jsonl"
    target.write_text("old\n")
    with pytest.raises(_Interrupted):
        with atomic_path(target, durable=durable) as tmp:
            assert tmp.parent == target.parent and tmp != target
            with tmp.open("w") as f:
                f.write("half a ne")
            raise _Interrupted
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_failure_before_anything_is_written_creates_no_file(tmp_path):
    target = tmp_path / "eval.json"
    with pytest.raises(_Interrupted):
        with atomic_path(target):
            raise _Interrupted
    assert list(tmp_path.iterdir()) == []


def _make_slowly(tmp: Path) -> None:
    """A build that takes a while and counts itself (in the folder's parent)."""
    tmp.mkdir()
    with open(tmp.parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    (tmp / "part.txt").write_text("half")
    (tmp / "done.txt").write_text("whole")


def _ask(folder: str) -> str:
    return str(sorted(p.name for p in build_once(Path(folder), _make_slowly, done="done.txt",
                                                  log=lambda *_: None).iterdir()))


def test_two_processes_asking_at_once_get_one_build(tmp_path):
    folder = tmp_path / "cache" / "model"
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        got = pool.map_async(_ask, [str(folder)] * 2).get(timeout=60)
    assert got == ["['done.txt', 'part.txt']"] * 2
    assert len((tmp_path / "cache" / "builds.log").read_text().split()) == 1
    assert sorted(p.name for p in folder.parent.iterdir()) == [".model.lock", "builds.log", "model"]


def test_a_half_built_folder_is_replaced_and_a_failed_build_leaves_nothing(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "part.txt").write_text("from a build that stopped")
    build_once(folder, _make_slowly, done="done.txt", log=lambda *_: None)
    assert (folder / "done.txt").read_text() == "whole"

    def broken(tmp: Path) -> None:
        tmp.mkdir()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "other", broken, done="done.txt")
    assert not (tmp_path / "other").exists() and not list(tmp_path.glob(".other.tmp-*"))


def test_a_builtin_tiny_model_is_built_once_into_its_folder(tmp_path, monkeypatch):
    """`builtin:tiny-qwen2` through build_once (a few pretraining steps here):
    the folder is complete, its log lines name it, no temporary is left."""
    import functools

    from thinkrl import builtin
    from thinkrl.models import tiny, tiny_calc, tiny_longtail  # noqa: F401  (built on the real spec first)

    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tiny, "TinyModelSpec", functools.partial(
        tiny.TinyModelSpec, hidden_size=64, intermediate_size=128, num_layers=2, pretrain_problems=200,
        pretrain_steps=3, batch_size=8))
    lines: list[str] = []
    folder = Path(builtin.resolve_model_path("builtin:tiny-qwen2", log=lines.append))
    assert (folder / "config.json").is_file() and ".tmp" not in " ".join(lines)
    assert any(str(folder) in line for line in lines)
    assert sorted(p.name for p in folder.parent.iterdir()) == sorted([folder.name, f".{folder.name}.lock"])
    assert builtin.resolve_model_path("builtin:tiny-qwen2", log=lines.append) == str(folder)
