"""Seed 000's MindSpeed-RL file rehearsed as its user has it: the trainer
config itself, the data written by `thinkrl prep` from ORZ-format JSON, and
the model folder holding only the real Qwen2.5-7B config.json and tokenizer
files. Its layout is kept: 4 ranks (Ray on CPU), vLLM TP4 (the native engine
when vLLM is not installed, said in the report). Seed 004's launch line (8
ranks, 5 minutes here) is rehearsed by bench/rehearse_seeds.sh."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rehearse_helpers import real_model_folder
from thinkrl.cli import main

CONFIG = "configs/grpo_trainer_qwen25_7b.yaml"


@pytest.fixture
def mindspeed_checkout(tmp_path, monkeypatch) -> Path:
    """configs/ (the seed's files), dataset/orz.json (ORZ's MATH-500 in the
    dataset config's map_keys layout) and data/models/Qwen2.5-7B (the
    trainer file's tokenizer_name_or_path), relative to the working folder."""
    from conftest import SHARED_DATA

    seeds, orz = SHARED_DATA.parent / "seeds" / "mindspeed_rl", SHARED_DATA / "orz" / "math500.json"
    if not seeds.is_dir() or not orz.is_file():
        pytest.skip("../shared/seeds/mindspeed_rl or ../shared/data is absent")
    shutil.copytree(seeds, tmp_path / "configs", ignore=shutil.ignore_patterns("*.md"))
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "orz.json").write_text(json.dumps(
        [{"problem": r["prompt"][0]["value"], "answer": r["final_answer"]}
         for r in json.loads(orz.read_text())]))
    real_model_folder("qwen2.5-7b-instruct-config", tmp_path / "data" / "models" / "Qwen2.5-7B")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_seed_000_before_its_data_is_prepared_fails_at_the_doctor_stage(mindspeed_checkout, capsys):
    code = main(["rehearse", "--config", CONFIG, "--workdir", str(mindspeed_checkout / "rehearsal")])
    out = capsys.readouterr().out
    assert code == 1
    assert "rehearsal failed at: doctor" in out and "data/mindspeed-prefix" in out
    assert "thinkrl prep orz --input ./dataset/orz.json" in out  # the command that fixes it


@pytest.mark.slow
def test_seed_000_mindspeed_file_rehearses_end_to_end(mindspeed_checkout, capsys):
    assert main(["prep", "--mindspeed-config", "configs/datasets/r1_zero_qwen25_7b.yaml",
                 "--output", "./dataset/data"]) == 0
    code = main(["rehearse", "--config", CONFIG, "--workdir", str(mindspeed_checkout / "rehearsal")])
    out = capsys.readouterr().out
    assert code == 0, out[-6000:]
    assert "rehearsal passed" in out
    assert "4 device(s)" in out  # the layout kept: 4 ranks
    assert "Qwen2ForCausalLM" in out and "template=qwen_r1" in out
    assert "a restart continued from global_step_2" in out
    assert "largest micro-batch per device that fits" in out  # the projection
    assert not (mindspeed_checkout / "ckpt").exists()  # the real run's folder (actor_config.save)
