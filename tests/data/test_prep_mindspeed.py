"""`thinkrl prep --mindspeed-config`: MindSpeed-RL's dataset config
(configs/datasets/r1_zero_qwen25_7b.yaml) read as it is, and the flat
`{"problem", "answer"}` records its `map_keys` name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from thinkrl.cli import main
from thinkrl.data.files import read_rows
from thinkrl.data.prep.mindspeed import read_dataset_config

QUESTIONS = [("What is $1+1$?", "2"), ("Solve $2x=6$.", "3")]


@pytest.fixture
def dataset_config(tmp_path, monkeypatch) -> Path:
    from conftest import SHARED_DATA

    seed = SHARED_DATA.parent / "seeds" / "mindspeed_rl" / "datasets" / "r1_zero_qwen25_7b.yaml"
    if not seed.is_file():
        pytest.skip("../shared/seeds/mindspeed_rl is absent")
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "orz.json").write_text(
        json.dumps([{"problem": q, "answer": a} for q, a in QUESTIONS]))
    monkeypatch.chdir(tmp_path)
    return Path(shutil.copy(seed, tmp_path / "r1_zero_qwen25_7b.yaml"))


def test_the_seed_dataset_config_reads_as_the_prep_orz_command(dataset_config):
    dataset = read_dataset_config(dataset_config)
    assert dataset.prep_command() == (
        "thinkrl prep orz --input ./dataset/orz.json --question-field problem --answer-field "
        "answer --split train --template qwen_r1 --output ./dataset/orz")
    assert dataset.prep_command("./dataset/data").endswith("--output ./dataset/data")


def test_prep_writes_the_rows_to_the_output_prefix(dataset_config, capsys):
    assert main(["prep", "--mindspeed-config", str(dataset_config)]) == 0
    out = capsys.readouterr().out
    assert "thinkrl prep orz --input ./dataset/orz.json" in out
    rows = read_rows(Path("dataset/orz/train.parquet"), prompt_key="prompt",
                     reward_fn_key="data_source")
    assert [(r["prompt"], r["reward_model"]["ground_truth"], r["data_source"]) for r in rows] == [
        ([{"role": "user", "content": q}], a, "orz/math") for q, a in QUESTIONS]  # no suffix


@pytest.mark.parametrize("edit, message", [
    (("prompt_type: qwen_r1", "prompt_type: qwen"), "prompt_type=qwen: thinkrl has MindSpeed-RL's qwen_r1"),
    (("workers: 8", "wrokers: 8"), "unknown key 'wrokers'; did you mean workers"),
    (('"query":""', '"query":"extra"'), "map_keys.query='extra'"),
    (("handler_name: R1AlpacaStyleInstructionHandler", "handler_name: PPOHandler"),
     "handler_name=PPOHandler"),
])
def test_what_thinkrl_cannot_follow_is_refused(dataset_config, edit, message):
    text = dataset_config.read_text()
    assert edit[0] in text
    dataset_config.write_text(text.replace(*edit))
    with pytest.raises(ValueError, match=message):
        read_dataset_config(dataset_config)


def test_mindspeed_config_takes_no_source_arguments(dataset_config, capsys):
    assert main(["prep", "orz", "--mindspeed-config", str(dataset_config)]) == 2
    assert "gives the source, input, split and fields itself" in capsys.readouterr().err


def test_orz_flat_records_with_other_field_names(tmp_path):
    source = tmp_path / "train.json"
    source.write_text(json.dumps([{"q": "What is 2+2?", "sol": "4"}]))
    assert main(["prep", "orz", "--input", str(source), "--question-field", "q",
                 "--answer-field", "sol", "--template", "qwen_r1", "--output", str(tmp_path)]) == 0
    rows = read_rows(tmp_path / "train.parquet", prompt_key="prompt", reward_fn_key="data_source")
    assert rows[0]["reward_model"]["ground_truth"] == "4"
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 2+2?"}]
