"""`thinkrl eval` end to end on the tiny model, and how it finds a model."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thinkrl.cli import main
from thinkrl.checkpoint.sharded import ACTOR_DIR
from thinkrl.checkpoint.store import MARKER
from thinkrl.commands.eval import model_folder, output_dir
from thinkrl.data import synthetic
from thinkrl.data.prep.builtin_arith import to_example
from thinkrl.data.prep.examples import to_verl_rows

ROWS = 3


@pytest.fixture
def small_parquet(tmp_path) -> Path:
    problems = synthetic.generate_problems(ROWS, seed=5)
    rows = to_verl_rows([to_example(p) for p in problems], split="test",
                        instruction=synthetic.INSTRUCTION)
    path = tmp_path / "small.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_eval_writes_table_metrics_and_every_generation(tiny_model_dir, small_parquet,
                                                        tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["eval", "--model", str(tiny_model_dir), "--data", str(small_parquet),
                 "--n", "2", "--temperature", "1.0", "--max-new-tokens", "8",
                 "--batch-size", "2", "--out", str(out), "trainer.device=cpu"])
    printed = capsys.readouterr().out
    assert code == 0
    for column in ("data source", "prompts", "samples", "mean@2", "acc", "pass@1", "pass@2",
                   "mean len", "clip"):
        assert column in printed
    assert "thinkrl/arith" in printed and str(out / "eval.json") in printed

    report = json.loads((out / "eval.json").read_text())
    assert report["settings"]["n"] == 2 and report["settings"]["max_new_tokens"] == 8
    assert report["settings"]["do_sample"] is True
    assert report["prompts"] == ROWS and report["samples"] == 2 * ROWS
    metrics = report["metrics"]
    for key in ("val-core/thinkrl/arith/reward/mean@2", "val-core/thinkrl/arith/acc/mean@2",
                "val-aux/thinkrl/arith/reward/pass@1", "val-aux/thinkrl/arith/reward/pass@2",
                "val-aux/thinkrl/arith/response_length/clip_ratio", "timing_s/testing"):
        assert key in metrics, key
    assert 1 <= metrics["val-aux/thinkrl/arith/response_length/mean"] <= 8

    lines = [json.loads(x) for x in (out / "generations.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * ROWS
    assert [x["prompt_index"] for x in lines] == [0, 0, 1, 1, 2, 2]
    assert all(x["finish_reason"] in ("stop", "length") for x in lines)
    # the file agrees with the metrics
    mean = sum(x["score"] for x in lines) / len(lines)
    assert metrics["val-core/thinkrl/arith/reward/mean@2"] == pytest.approx(mean)


def test_missing_model_and_greedy_n_are_user_errors(small_parquet, tmp_path, capsys):
    assert main(["eval", "--model", str(tmp_path / "nope"), "--data", str(small_parquet)]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["eval", "--n", "4", "--data", str(small_parquet)]) == 2
    assert "--temperature" in capsys.readouterr().err


def test_missing_data_is_a_user_error(tiny_model_dir, tmp_path, capsys):
    assert main(["eval", "--model", str(tiny_model_dir), "--data",
                 str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err


def _fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def _fake_checkpoint(run: Path, step: int, *, complete: bool = True) -> Path:
    folder = run / f"global_step_{step}"
    actor = _fake_model(folder / ACTOR_DIR)
    if complete:
        (folder / MARKER).write_text(json.dumps({"format": 1, "step": step}))
    return actor


def test_model_folder_finds_checkpoint_weights(tmp_path):
    run = tmp_path / "run"
    assert model_folder(str(_fake_model(tmp_path / "plain")), log=print) == \
        str((tmp_path / "plain").resolve())
    step2 = _fake_checkpoint(run, 2)
    assert model_folder(str(run / "global_step_2"), log=print) == str(step2.resolve())
    step10 = _fake_checkpoint(run, 10)
    _fake_checkpoint(run, 12, complete=False)  # a save that never finished
    assert model_folder(str(run), log=lambda *_: None) == str(step10.resolve())
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="config.json.*no complete checkpoint"):
        model_folder(str(tmp_path / "empty"), log=print)


def test_default_output_folder_names_the_checkpoint():
    out = output_dir(None, "/x/runs/thinkrl/tiny/global_step_20/huggingface")
    assert out.parent == (Path("runs") / "eval").resolve()
    assert out.name.startswith("tiny-global_step_20-huggingface-")


def test_default_response_length_fits_the_models_positions(tiny_model_dir, small_parquet,
                                                            tmp_path, capsys):
    # The README's example gives no --max-new-tokens: verl's default 512 exceeds the
    # tiny model's positions, so the length is fitted to them, with a note.
    limit = json.loads((tiny_model_dir / "config.json").read_text())["max_position_embeddings"]
    assert limit <= 512  # a prompt + 512 response tokens cannot fit
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(small_parquet),
                 "--out", str(out), "trainer.device=cpu"]) == 0
    printed = capsys.readouterr().out
    max_new = json.loads((out / "eval.json").read_text())["settings"]["max_new_tokens"]
    assert f"responses are limited to {max_new} tokens" in printed and 0 < max_new < limit
    # Asked for explicitly, a length that does not fit is still an error.
    assert main(["eval", "--model", str(tiny_model_dir), "--data", str(small_parquet),
                 "--max-new-tokens", str(limit), "--out", str(tmp_path / "o2")]) == 2
    assert "lower --max-new-tokens" in capsys.readouterr().err
