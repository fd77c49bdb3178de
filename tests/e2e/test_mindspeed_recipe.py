"""Seed 000's MindSpeed-RL recipe run by thinkrl as its user has it: the
grpo_trainer_qwen25_7b.yaml file itself, data written by `thinkrl prep` from
ORZ-format JSON, the model path at the tiny model, one CPU device, 1 step.
And `thinkrl doctor` on that file names the data-prefix problem with the
prep command (seed 000's second failure)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from thinkrl.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A MindSpeed-RL checkout's layout: configs/ (the seed's files) and, as the
    dataset config's input, dataset/orz.json in its `map_keys` layout made from
    ORZ's MATH-500 eval JSON. Relative paths resolve here, as in MindSpeed-RL."""
    from conftest import SHARED_DATA

    seeds, orz = SHARED_DATA.parent / "seeds" / "mindspeed_rl", SHARED_DATA / "orz" / "math500.json"
    if not seeds.is_dir() or not orz.is_file():
        pytest.skip("../shared/seeds/mindspeed_rl or ../shared/data is absent")
    shutil.copytree(seeds, tmp_path / "configs", ignore=shutil.ignore_patterns("*.md"))
    records = json.loads(orz.read_text())[:8]
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "orz.json").write_text(json.dumps(
        [{"problem": r["prompt"][0]["value"], "answer": r["final_answer"]} for r in records]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_doctor_names_the_data_prefix_problem_with_the_prep_command(workdir, tiny_model_dir,
                                                                    asset_cache, capsys):
    code = main(["doctor", "--json", "--config", "configs/grpo_trainer_qwen25_7b.yaml",
                 f"actor_rollout_ref.model.path={tiny_model_dir}"])
    assert code == 1
    rows = {r["check"]: r for r in json.loads(capsys.readouterr().out)}
    prefix = rows["data/mindspeed-prefix"]
    assert prefix["status"] == "fail"
    assert "data_path=./dataset/data is a prefix of Megatron indexed files" in prefix["found"]
    assert "data.train_files=./dataset/data/train.parquet, which does not exist" in prefix["found"]
    # the dataset config writes ./dataset/orz_packed_*: the mismatch that stopped seed 000
    assert "writes ./dataset/orz_packed_*, a prefix data_path ./dataset/data does not name" in \
        prefix["found"]
    assert ("thinkrl prep orz --input ./dataset/orz.json --question-field problem --answer-field "
            "answer --split train --template qwen_r1 --output ./dataset/data") in prefix["fix"]


def test_the_grpo_trainer_file_runs_one_step_on_cpu(workdir, tiny_model_dir, asset_cache, capsys):
    # the command the doctor gives, through the dataset config itself
    assert main(["prep", "--mindspeed-config", "configs/datasets/r1_zero_qwen25_7b.yaml",
                 "--output", "./dataset/data"]) == 0
    assert "train: 8 rows -> dataset/data/train.parquet" in capsys.readouterr().out
    code = main(["train", "--config", "configs/grpo_trainer_qwen25_7b.yaml",
                 f"actor_rollout_ref.model.path={tiny_model_dir}",
                 # one CPU device with the native engine (multi-device runs need the Ray backend)
                 "trainer.device=cpu", "trainer.n_gpus_per_node=1",
                 "actor_rollout_ref.rollout.name=native",
                 # the tiny model's small BPE vocabulary spells the qwen_r1 prompt in ~1000
                 # tokens (Qwen2.5's: ~160), past its 512 positions and the file's 256-token
                 # prompts: room for them, and a short response keeps the step short
                 "data.max_prompt_length=1100", "data.max_response_length=32",
                 "+actor_rollout_ref.model.override_config.max_position_embeddings=1200",
                 "trainer.total_training_steps=1", f"trainer.default_local_dir={workdir / 'run'}",
                 "trainer.progress_bar=False", "reward.num_workers=1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "megatron_training.global_batch_size = 4" in out  # the translation table, at start
    records = [json.loads(line) for line in (workdir / "run" / "metrics.jsonl").read_text()
               .splitlines()]
    assert [r["step"] for r in records] == [1]  # no validation: MindSpeed-RL has none
    step = records[0]
    assert "reward/base_acc/mean" in step  # the base_acc verifier scored (0 or 1 per response)
    assert 0.0 <= step["reward/base_acc/mean"] <= 1.0
    assert step["reward/errors"] == 0
    saved = yaml_load(workdir / "run" / "config.yaml")
    arr = saved["actor_rollout_ref"]
    assert (arr["rollout"]["n"], arr["rollout"]["min_p"], arr["rollout"]["top_k"]) == (2, 0.01, 50)
    assert (saved["data"]["train_batch_size"], saved["data"]["template"]) == (4, "qwen_r1")
    assert arr["actor"]["kl_loss_coef"] == 0.05 and saved["reward"]["verifiers"] == ["base_acc"]


def yaml_load(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())
