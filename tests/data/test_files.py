"""Finding and reading verl-schema parquet files, and the built-in data set:
every problem is reported with the file, the row and the column."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thinkrl import builtin
from thinkrl.data.files import read_rows, resolve_files

KW = dict(prompt_key="prompt", reward_fn_key="data_source")


def row(question="1 + 1?", truth="2", **override) -> dict:
    base = {"data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": "train", "index": 0}}
    base.update(override)
    return base


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def folder(tmp_path):
    write(tmp_path / "train.parquet", [row()])
    write(tmp_path / "test.parquet", [row()])
    (tmp_path / "notes.txt").write_text("not data")
    return tmp_path


# ---------------------------------------------------------------- resolve_files

def test_resolve_a_file_a_dir_a_glob_and_a_list(folder):
    train, test = folder / "train.parquet", folder / "test.parquet"
    assert resolve_files(str(train), key="data.train_files") == [train]
    assert resolve_files(str(folder), key="k") == [test, train]  # sorted, .txt skipped
    assert resolve_files(str(folder / "t*.parquet"), key="k") == [test, train]
    assert resolve_files([str(train), str(test)], key="k") == [train, test]  # list order kept
    assert resolve_files([str(folder / "tr*")], key="k") == [train]


def test_resolve_expands_the_home_folder(folder, monkeypatch):
    monkeypatch.setenv("HOME", str(folder))
    assert resolve_files("~/train.parquet", key="k") == [folder / "train.parquet"]


def test_a_missing_file_names_the_path_and_the_nearest_files(folder):
    with pytest.raises(ValueError) as err:
        resolve_files(str(folder / "trian.parquet"), key="data.train_files")
    message = str(err.value)
    assert message.startswith("data.train_files: no such file")
    assert str(folder / "trian.parquet") in message
    suggestions = message.split("Nearest existing files in")[1]
    assert "train.parquet" in suggestions
    # closest first: "trian" is nearer "train" than "test"
    assert "test.parquet" not in suggestions or \
        suggestions.index("train.parquet") < suggestions.index("test.parquet")


def test_a_missing_folder_suggests_from_the_deepest_existing_one(folder):
    with pytest.raises(ValueError, match=r"Nearest existing files in .*train\.parquet"):
        resolve_files(str(folder / "gsm8k" / "v2" / "train.parquet"), key="k")


def test_an_empty_dir_and_an_empty_list(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no .parquet file"):
        resolve_files(str(tmp_path / "empty"), key="data.val_files")
    with pytest.raises(ValueError, match="data.val_files is empty"):
        resolve_files([], key="data.val_files")
    with pytest.raises(ValueError, match="The folder .* is empty"):
        resolve_files(str(tmp_path / "empty" / "x.parquet"), key="k")


def test_a_glob_matching_nothing(folder):
    with pytest.raises(ValueError, match=r"the pattern '.*val\*\.parquet' matches no file"):
        resolve_files(str(folder / "val*.parquet"), key="k")


# ---------------------------------------------------------------- read_rows

def test_read_rows_returns_every_row(tmp_path):
    path = write(tmp_path / "a.parquet", [row("q0", "0"), row("q1", "1")])
    rows = read_rows(path, **KW)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["0", "1"]
    assert rows[1]["prompt"] == [{"role": "user", "content": "q1"}]


def test_missing_column_names_the_file_and_the_columns(tmp_path):
    path = write(tmp_path / "a.parquet", [{"question": "1+1?", "data_source": "openai/gsm8k"}])
    with pytest.raises(ValueError) as err:
        read_rows(path, **KW)
    message = str(err.value)
    assert str(path) in message
    assert "['prompt', 'reward_model']" in message  # what is missing
    assert "['question', 'data_source']" in message  # what is there


def test_a_custom_prompt_key_is_the_one_checked(tmp_path):
    path = write(tmp_path / "a.parquet", [row()])
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['messages'\]"):
        read_rows(path, prompt_key="messages", reward_fn_key="data_source")


def test_empty_file(tmp_path):
    schema = pa.Table.from_pylist([row()]).schema
    path = tmp_path / "empty.parquet"
    pq.write_table(schema.empty_table(), path)
    with pytest.raises(ValueError, match=f"{path} has no rows"):
        read_rows(path, **KW)


@pytest.mark.parametrize("bad, column", [
    (dict(prompt=[]), "'prompt'"),
    (dict(prompt=[{"role": None, "content": "hi"}]), "'prompt'"),
    (dict(prompt=[{"role": "user", "content": None}]), "'prompt'"),
    (dict(data_source=None), "'data_source'"),
    (dict(reward_model={"style": "rule", "ground_truth": None}), "'reward_model'"),
])
def test_a_bad_row_names_file_row_and_column(tmp_path, bad, column):
    path = write(tmp_path / "a.parquet", [row(), row(), row(**bad)])
    with pytest.raises(ValueError) as err:
        read_rows(path, **KW)
    assert str(err.value).startswith(f"{path}, row 2, column {column}")


def test_a_prompt_that_is_a_string(tmp_path):
    path = write(tmp_path / "a.parquet", [row(prompt="What is 1 + 1?")])
    with pytest.raises(ValueError, match=r"row 0, column 'prompt': expected a list of chat messages"):
        read_rows(path, **KW)


def test_non_parquet_suffix(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"question": "1+1?"}\n')
    with pytest.raises(ValueError, match="reads parquet files") as err:
        read_rows(path, **KW)
    assert str(path) in str(err.value)


def test_a_corrupted_file(tmp_path):
    path = tmp_path / "train.parquet"
    path.write_bytes(os.urandom(2048))
    with pytest.raises(ValueError, match="is not a readable parquet file") as err:
        read_rows(path, **KW)
    assert str(path) in str(err.value)
    # a truncated real file too
    good = write(tmp_path / "good.parquet", [row()] * 50)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ValueError, match="cut.parquet is not a readable parquet file"):
        read_rows(cut, **KW)


# ---------------------------------------------------------------- builtin data

def test_builtin_data_is_written_once_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path))
    logs = []
    train = builtin.resolve_data_files("builtin:arith/train", log=logs.append)
    assert len(logs) == 1 and "wrote the built-in arithmetic set" in logs[0]
    assert train.startswith(str(tmp_path)) and os.path.exists(train)
    mtime = os.stat(train).st_mtime_ns

    both = builtin.resolve_data_files(["builtin:arith/train", "builtin:arith/test"], log=logs.append)
    assert both == [train, train.replace("train.parquet", "test.parquet")]
    assert len(logs) == 1 and os.stat(train).st_mtime_ns == mtime  # cached: not rewritten
    assert not [p for p in os.listdir(os.path.dirname(train)) if p.startswith(".")]  # no temp files

    rows = {split: read_rows(resolve_files(p, key="k")[0], **KW) for split, p in zip(("train", "test"), both)}
    assert len(rows["train"]) == builtin.ARITH_TRAIN_SIZE and len(rows["test"]) == 200
    assert {r["data_source"] for r in rows["train"]} == {"thinkrl/arith"}
    train_q = {r["extra_info"]["question"] for r in rows["train"]}
    assert not train_q & {r["extra_info"]["question"] for r in rows["test"]}


def test_builtin_passes_paths_through_and_rejects_unknown_names(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKRL_CACHE", str(tmp_path))
    assert builtin.resolve_data_files("/data/gsm8k/train.parquet") == "/data/gsm8k/train.parquet"
    with pytest.raises(ValueError, match="unknown built-in data set 'builtin:gsm8k/train'"):
        builtin.resolve_data_files("builtin:gsm8k/train")
    with pytest.raises(ValueError, match="unknown built-in data set"):
        builtin.resolve_data_files(["builtin:arith/test", "builtin:arith/val"])
    with pytest.raises(ValueError, match="unknown built-in model"):
        builtin.resolve_model_path("builtin:tiny-llama")


def test_rows_with_media_are_refused_not_trained_as_text(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from thinkrl.data.files import read_rows

    row = {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "<image> 1+1?"}],
           "reward_model": {"style": "rule", "ground_truth": "2"}, "images": [b"\x89PNG"]}
    path = tmp_path / "vl.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    with pytest.raises(ValueError, match=r"row 0, column 'images' holds media.*videos are not"):
        read_rows(path, prompt_key="prompt", reward_fn_key="data_source", media_keys=("images",))
    assert read_rows(path, prompt_key="prompt", reward_fn_key="data_source")  # not asked: read
