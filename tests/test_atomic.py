"""thinkrl.atomic: a file is replaced whole or not at all."""

import pytest

from thinkrl.atomic import atomic_path, atomic_write_text


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
