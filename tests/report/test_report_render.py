"""`thinkrl report` on synthetic run directories (no training in these tests)."""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path

import pytest
import yaml

from thinkrl.cli import main
from thinkrl.report import render_report
from thinkrl.report.data import load_metrics
from thinkrl.report.panels import DPI, WIDTH_IN

VAL = "val-core/gsm8k/reward/mean@4"
ACC = "val-core/gsm8k/acc/mean@4"
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def _train_record(step: int) -> dict:
    record = {"step": step, "critic/score/mean": 0.1 * step, "critic/score/min": 0.0,
              "critic/score/max": 1.0, "critic/rewards/mean": 0.1 * step,
              "response_length/mean": 20.0 + step, "response_length/max": 48.0,
              "response_length/min": 5.0, "response_length/clip_ratio": 0.01 * step,
              "actor/kl_loss": 0.001 * step, "actor/entropy": 0.5, "actor/pg_clipfrac": 0.02,
              "actor/grad_norm": 0.3, "actor/pg_loss": -0.1, "actor/ppo_kl": 0.0,
              "perf/throughput": 5000.0 + step, "perf/time_per_step": 3.0,
              "timing_s/step": 3.0}
    record.update({f"timing_s/{stage}": 0.4 for stage in STAGES})
    return record


def _val_record(step: int) -> dict:
    return {VAL: 0.1 + 0.05 * step, ACC: 0.05 * step, "timing_s/testing": 0.5,
            **{f"val-aux/gsm8k/reward/pass@{k}": min(1.0, 0.1 * k + 0.01 * step)
               for k in (1, 2, 4)}}


def _write_run(run_dir: Path, *, steps: int = 8, val_every: int = 4) -> Path:
    """metrics.jsonl as the trainer writes it: step 0 validation only, then
    one line per step, validation keys on validation steps."""
    run_dir.mkdir(parents=True)
    lines = [{"step": 0, **_val_record(0)}]
    for step in range(1, steps + 1):
        record = _train_record(step)
        if val_every and step % val_every == 0:
            record.update(_val_record(step))
        lines.append(record)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = {"data": {"train_files": "gsm8k/train.parquet", "train_batch_size": 8},
              "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B"},
                                    "actor": {"optim": {"lr": 1e-6}}, "rollout": {"n": 4}},
              "trainer": {"experiment_name": "synthetic"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def _write_generations(run_dir: Path, kind: str, step: int, response: str) -> None:
    folder = run_dir / "generations"
    folder.mkdir(exist_ok=True)
    record = {"step": step, "data_source": "gsm8k",
              "prompt": "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
              "response": response, "ground_truth": "4", "score": 1.0, "response_length": 12,
              "finish_reason": "stop", "prompt_index": 0, "row": 3}
    (folder / f"{kind}_step_{step}.jsonl").write_text(json.dumps(record) + "\n")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])  # IHDR width, height


def test_report_draws_every_panel_and_embeds_it(tmp_path):
    run = _write_run(tmp_path / "run")
    _write_generations(run, "train", 4, "<think>2 plus 2</think> The answer is 4.")
    _write_generations(run, "val", 8, "<think>newest</think> 4")
    report = render_report(run)

    assert [p.name for p in report.panels if p.figure is not None] == [
        "reward", "validation", "response_length", "policy", "timing", "throughput"]
    html = report.html.read_text()
    assert report.html == run / "report" / "report.html"
    for panel, image in zip([p for p in report.panels if p.figure], report.images):
        assert image == run / "report" / f"{panel.name}.png"
        width, height = _png_size(image)
        assert (width, height) == panel.size_px
        assert width == round(WIDTH_IN * DPI) and height >= 200
        assert base64.b64encode(image.read_bytes()).decode() in html
    # Generation text is shown escaped, the newest step first.
    assert "&lt;think&gt;2 plus 2&lt;/think&gt;" in html
    assert "&lt;|im_start|&gt;user" in html
    assert "<think>" not in html and "<|im_start|>" not in html
    assert html.index("Step 8, validation") < html.index("Step 4, training")
    # Header and summary come from config.yaml and the metrics.
    assert "Qwen/Qwen2.5-0.5B" in html and "thinkrl run: synthetic" in html
    assert "gsm8k/acc/mean@4</th><td>0.000 at step 0 → 0.400 at step 8 (+40.0 points)" in html


def test_missing_metrics_skip_their_panels_with_a_note(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "critic/score/mean": 0.2 * s}) + "\n" for s in (1, 2)))
    report = render_report(run, tmp_path / "out")

    drawn = {p.name for p in report.panels if p.figure is not None}
    assert drawn == {"reward"}
    assert [path.name for path in report.images] == ["reward.png"]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["report.html", "reward.png"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "not shown: no val-core/*/reward/mean@*" in html
    assert "not shown: response_length/mean was not logged" in html
    assert "not shown: no timing_s/&lt;stage&gt; metrics" in html
    assert "No readable config.yaml" in html and "none saved" in html


def test_cut_last_line_nan_and_a_single_step_are_tolerated(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    record = _train_record(1) | {"actor/grad_norm": "nan", "actor/pg_loss": "inf"}
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n" + '{"step": 2, "critic/sc')
    report = render_report(run)

    assert any("last line is incomplete" in note for note in report.notes)
    assert "last line is incomplete" in report.html.read_text()
    assert {p.name for p in report.panels if p.figure} >= {"reward", "policy", "timing"}
    metrics = load_metrics(run)
    assert list(metrics.steps) == [1]
    assert math.isnan(metrics.columns["actor/grad_norm"][0])
    assert metrics.columns["actor/pg_loss"][0] == math.inf


def test_repeated_steps_keep_the_later_line_and_bad_middle_lines_are_named(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps({"step": 1, "critic/score/mean": 0.1}), "garbage",
             json.dumps({"step": 2, "critic/score/mean": 0.2}),
             json.dumps({"step": 2, "critic/score/mean": 0.3})]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    metrics = load_metrics(run)
    assert list(metrics.steps) == [1, 2]
    assert list(metrics.columns["critic/score/mean"]) == [0.1, 0.3]
    assert any("skipped unreadable lines 2" in note for note in metrics.notes)
    assert any("logged more than once" in note for note in metrics.notes)


def test_cli_report_writes_the_page(tmp_path, capsys):
    run = _write_run(tmp_path / "run", val_every=0)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    assert f"report: {tmp_path / 'out' / 'report.html'} (6 figures)" in capsys.readouterr().out


@pytest.mark.parametrize("make", ["empty dir", "missing dir", "empty file"])
def test_cli_report_without_metrics_is_a_clear_error(tmp_path, capsys, make):
    run = tmp_path / "run"
    if make != "missing dir":
        run.mkdir()
    if make == "empty file":
        (run / "metrics.jsonl").write_text("")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("thinkrl: error: ") and str(run) in err
    assert {"empty dir": "no metrics.jsonl", "missing dir": "no such directory",
            "empty file": "no complete metrics line"}[make] in err


def test_identical_reward_and_acc_are_one_line_and_flat_zero_plots_are_explained(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 0, VAL: 0.1, ACC: 0.1}]
    for step in (1, 2):
        record = _train_record(step)
        record.update({"actor/pg_clipfrac": 0.0, "actor/ppo_kl": 0.0})  # on-policy: always 0
        lines.append(record)
    lines[-1].update({VAL: 0.4, ACC: 0.4})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    panels = {p.name: p for p in render_report(run).panels}
    labels = [line.get_label() for line in panels["validation"].figure.axes[0].lines]
    assert labels == ["gsm8k/acc/mean@4 = reward (identical)"]
    policy = panels["policy"]
    titles = [ax.get_title() for ax in policy.figure.axes if ax.get_visible()]
    assert "clip fraction" not in titles and "PPO KL (π vs π_old)" not in titles
    assert "entropy (nats/token)" in titles
    assert "Always 0 in this run, so not drawn: clip fraction (one optimizer step" in policy.note
