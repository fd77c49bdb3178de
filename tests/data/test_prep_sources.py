"""`thinkrl.data.prep`: each source's real files into verl rows that the
training reader accepts, the answer extraction, and the errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thinkrl.data import synthetic
from thinkrl.data.files import read_rows
from thinkrl.data.prep import PrepRequest, generic, prepare
from thinkrl.data.prep.competition_math import last_boxed

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


@pytest.fixture(scope="module")
def shared() -> Path:
    from conftest import SHARED_DATA

    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


def _rows(path: Path) -> list[dict]:
    """Through the same checks as training."""
    return read_rows(path, prompt_key="prompt", reward_fn_key="data_source")


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# ---------------------------------------------------------------- real files

def test_gsm8k_folder_gives_both_splits_in_verls_schema(shared, tmp_path):
    written = prepare(PrepRequest(source="gsm8k", inputs=[str(shared / "gsm8k")],
                                  output=tmp_path))
    assert [(w.split, w.rows, w.path) for w in written] == [
        ("train", 7473, tmp_path / "train.parquet"), ("test", 1319, tmp_path / "test.parquet")]
    train = _rows(tmp_path / "train.parquet")
    raw = [json.loads(line) for line in (shared / "gsm8k" / "train.jsonl").open()]
    for row, source in zip(train, raw):
        assert row["reward_model"] == {
            "style": "rule", "ground_truth": source["answer"].split("#### ")[-1].replace(",", "")}
        assert row["prompt"] == [{"role": "user",
                                  "content": f"{source['question']} {GSM8K_INSTRUCTION}"}]
    first = train[0]
    assert first["data_source"] == "openai/gsm8k" and first["ability"] == "math"
    assert first["reward_model"]["ground_truth"] == "72"
    assert first["extra_info"] == {"split": "train", "index": 0, "answer": raw[0]["answer"],
                                   "question": raw[0]["question"]}
    with_comma = next(i for i, r in enumerate(raw) if "#### 1,080" in r["answer"])
    assert train[with_comma]["reward_model"]["ground_truth"] == "1080"
    assert [r["extra_info"]["index"] for r in _rows(tmp_path / "test.parquet")] == list(range(1319))


def test_gsm8k_under_qwen_r1_leaves_the_question_alone(shared, tmp_path):
    prepare(PrepRequest(source="gsm8k", inputs=[str(shared / "gsm8k" / "test.jsonl")],
                        output=tmp_path, template="qwen_r1"))
    rows = _rows(tmp_path / "test.parquet")  # split "test" from the file name
    assert rows[0]["prompt"][0]["content"] == rows[0]["extra_info"]["question"]
    assert all("####" not in r["prompt"][0]["content"] for r in rows)


def test_math500_keeps_its_answers(shared, tmp_path):
    written = prepare(PrepRequest(source="math", inputs=[str(shared / "math500" / "test.jsonl")],
                                  output=tmp_path))
    assert [(w.split, w.rows) for w in written] == [("test", 500)]
    rows = _rows(tmp_path / "test.parquet")
    raw = [json.loads(line) for line in (shared / "math500" / "test.jsonl").open()]
    assert [r["reward_model"]["ground_truth"] for r in rows] == [r["answer"] for r in raw]
    assert rows[0]["reward_model"]["ground_truth"] == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert {r["data_source"] for r in rows} == {"HuggingFaceH4/MATH-500"}
    assert rows[0]["prompt"][0]["content"] == f"{raw[0]['problem']} {MATH_INSTRUCTION}"
    assert rows[0]["extra_info"]["solution"] == raw[0]["solution"]


def test_the_boxed_extractor_agrees_with_every_math500_answer(shared):
    raw = [json.loads(line) for line in (shared / "math500" / "test.jsonl").open()]
    assert [last_boxed(r["solution"]) for r in raw] == [r["answer"] for r in raw]


def test_orz_eval_file(shared, tmp_path):
    prepare(PrepRequest(source="orz", inputs=[str(shared / "orz" / "aime2024.json")],
                        splits=["test"], output=tmp_path, template="qwen_r1"))
    rows = _rows(tmp_path / "test.parquet")
    raw = json.loads((shared / "orz" / "aime2024.json").read_text())
    assert len(rows) == 30
    assert {r["data_source"] for r in rows} == {"orz/aime2024"}
    assert rows[0]["reward_model"]["ground_truth"] == "73"
    assert [r["prompt"][0]["content"] for r in rows] == [r["prompt"][0]["value"] for r in raw]


def test_orz_training_file_converted_from_the_eval_file(shared, tmp_path):
    evals = json.loads((shared / "orz" / "math500.json").read_text())
    dialogues = [[{"from": "human", "value": e["prompt"][0]["value"]},
                  {"from": "assistant", "ground_truth": {"value": e["final_answer"]}}]
                 for e in evals]
    source = tmp_path / "orz_math_57k_collected.json"
    source.write_text(json.dumps(dialogues))
    prepare(PrepRequest(source="orz", inputs=[str(source)], splits=["train"],
                        output=tmp_path / "out"))
    rows = _rows(tmp_path / "out" / "train.parquet")
    assert len(rows) == 500
    assert {r["data_source"] for r in rows} == {"orz/math"}
    assert [r["reward_model"]["ground_truth"] for r in rows] == [e["final_answer"] for e in evals]
    assert rows[3]["prompt"][0]["content"] == f"{evals[3]['prompt'][0]['value']} {MATH_INSTRUCTION}"


# ---------------------------------------------------------------- other inputs

def test_gsm8k_from_a_hugging_face_parquet_folder(tmp_path):
    folder = tmp_path / "gsm8k" / "main"
    folder.mkdir(parents=True)
    records = [{"question": f"Q{i}?", "answer": f"work\n#### {i},000"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(records[:2]), folder / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(records[2:]), folder / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(records[:1]), folder / "test-00000-of-00001.parquet")
    written = prepare(PrepRequest(source="gsm8k", inputs=[str(tmp_path / "gsm8k")],
                                  output=tmp_path / "out"))
    assert [(w.split, w.rows) for w in written] == [("train", 3), ("test", 1)]
    train = _rows(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in train] == ["0000", "1000", "2000"]
    assert [r["extra_info"]["index"] for r in train] == [0, 1, 2]  # shards counted as one split


def test_math_without_answer_takes_the_last_box(tmp_path):
    path = _jsonl(tmp_path / "train.jsonl", [
        {"problem": "P", "solution": "First $\\boxed{1}$, finally $\\boxed{\\frac{1}{2}}$."}])
    prepare(PrepRequest(source="math", inputs=[str(path)], output=tmp_path / "out"))
    row = _rows(tmp_path / "out" / "train.parquet")[0]
    assert row["reward_model"]["ground_truth"] == "\\frac{1}{2}"
    assert row["data_source"] == "DigitalLearningGmbH/MATH-lighteval"  # no unique_id


@pytest.mark.parametrize("text, boxed", [
    ("so $\\boxed{42}$", "42"),
    ("\\boxed{\\frac{a}{b}} and \\boxed{x^{2}}", "x^{2}"),           # the last one, nested
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),                           # escaped braces
    ("\\fbox{7}", "7"),
    ("the answer is $\\boxed 5$.", "5"),
    ("no box here", None),
    ("\\boxed{unclosed", None),
])
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


def test_generic_jsonl_with_nested_fields(tmp_path):
    path = _jsonl(tmp_path / "mine.jsonl", [{"q": {"text": "2+2?"}, "a": 4},
                                             {"q": {"text": "3+3?"}, "a": "6"}])
    prepare(PrepRequest(source="jsonl", inputs=[str(path)], splits=["train"],
                        output=tmp_path / "out", data_source="my/arith", ability="arithmetic",
                        instruction="Answer after ####.",
                        fields=generic.FieldNames(question="q.text", answer="a")))
    rows = _rows(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["4", "6"]
    assert rows[0]["prompt"][0]["content"] == "2+2? Answer after ####."
    assert (rows[0]["data_source"], rows[0]["ability"]) == ("my/arith", "arithmetic")


def test_builtin_under_chat_matches_the_builtin_files(tmp_path):
    from thinkrl.builtin import write_arith_parquet

    write_arith_parquet(tmp_path / "builtin", log=lambda *_: None)
    written = prepare(PrepRequest(source="builtin", output=tmp_path / "prep"))
    assert [w.split for w in written] == ["train", "test"]
    for split in ("train", "test"):
        assert _rows(tmp_path / "prep" / f"{split}.parquet") == \
            _rows(tmp_path / "builtin" / f"{split}.parquet")
    prepare(PrepRequest(source="builtin", output=tmp_path / "r1", template="qwen_r1",
                        splits=["test"]))
    assert not (tmp_path / "r1" / "train.parquet").exists()
    row = _rows(tmp_path / "r1" / "test.parquet")[0]
    assert row["prompt"][0]["content"] == row["extra_info"]["question"]
    assert synthetic.INSTRUCTION not in row["prompt"][0]["content"]


# ---------------------------------------------------------------- bad input

def _error(tmp_path, source: str, records, *, name="train.jsonl", **request) -> str:
    path = tmp_path / name
    if isinstance(records, str):
        path.write_text(records)
    else:
        _jsonl(path, records)
    with pytest.raises(ValueError) as err:
        prepare(PrepRequest(source=source, inputs=[str(path)], output=tmp_path / "out", **request))
    assert not (tmp_path / "out").exists()  # nothing half-written
    return str(err.value)


def test_missing_field_names_file_line_and_field(tmp_path):
    message = _error(tmp_path, "gsm8k", [{"question": "Q", "answer": "#### 1"}, {"question": "Q"}])
    assert message.startswith(f"{tmp_path / 'train.jsonl'}, line 2: the field 'answer' is missing")


def test_empty_field(tmp_path):
    message = _error(tmp_path, "math", [{"problem": "  ", "solution": "\\boxed{1}"}])
    assert "train.jsonl, line 1: the field 'problem' is empty" in message


def test_gsm8k_answer_without_final_line(tmp_path):
    message = _error(tmp_path, "gsm8k", [{"question": "Q", "answer": "it is 5"}])
    assert "line 1: the field 'answer' has no '#### <final answer>' line" in message


def test_math_without_answer_or_box(tmp_path):
    message = _error(tmp_path, "math", [{"problem": "P", "solution": "it is 5"}])
    assert "line 1: no field 'answer'" in message and "\\boxed" in message


def test_broken_json_line(tmp_path):
    message = _error(tmp_path, "gsm8k", '{"question": "Q", "answer": "#### 1"}\n{"question": \n')
    assert "train.jsonl, line 2: not valid JSON" in message


def test_orz_item_of_the_other_layout(tmp_path):
    items = [[{"from": "human", "value": "Q"}, {"from": "assistant", "ground_truth": {"value": "1"}}],
             {"prompt": [{"from": "user", "value": "Q"}], "final_answer": "1"}]
    message = _error(tmp_path, "orz", json.dumps(items), name="train.json")
    assert "train.json, item 1: expected a dialogue" in message
    items = [items[0], [{"from": "human", "value": "Q"}, {"from": "assistant"}]]
    message = _error(tmp_path, "orz", json.dumps(items), name="train.json")
    assert "train.json, item 1, turn 1: the field 'ground_truth.value' is missing" in message


def test_jsonl_needs_a_data_source(tmp_path):
    message = _error(tmp_path, "jsonl", [{"question": "Q", "answer": "1"}])
    assert "needs --data-source" in message


def test_missing_input_lists_the_nearest_files(tmp_path):
    (tmp_path / "train.jsonl").write_text("")
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(ValueError) as err:
        prepare(PrepRequest(source="gsm8k", inputs=[str(tmp_path / "trian.jsonl")],
                            output=tmp_path / "out"))
    assert f"no such file or folder {tmp_path / 'trian.jsonl'}" in str(err.value)
    assert "Nearest existing files" in str(err.value) and "train.jsonl" in str(err.value)


def test_split_must_be_named_when_the_file_name_does_not_say(tmp_path):
    message = _error(tmp_path, "gsm8k", [{"question": "Q", "answer": "#### 1"}], name="gsm.jsonl")
    assert "name it with --split train|test" in message
    message = _error(tmp_path, "gsm8k", [{"question": "Q", "answer": "#### 1"}], name="gsm.jsonl",
                     splits=["dev"])
    assert "--split dev: use one of train, test" in message


def test_folder_without_split_files(tmp_path):
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "gsm.jsonl", [{"question": "Q", "answer": "#### 1"}])
    with pytest.raises(ValueError, match=r"no file in it is named train\|test.*gsm.jsonl"):
        prepare(PrepRequest(source="gsm8k", inputs=[str(tmp_path / "data")], output=tmp_path))


def test_empty_input_file(tmp_path):
    message = _error(tmp_path, "gsm8k", "\n")
    assert "holds no records" in message
