"""The pass@k plot of the validation panel when validations log different k
(val n changed across a resume) or keys of an unexpected shape."""

from __future__ import annotations

import json
from pathlib import Path

from thinkrl.report import render_report
from thinkrl.report.data import load_metrics
from thinkrl.report.panels import pass_at_k_curves, validation_panel

VAL = "val-core/gsm8k/reward/mean@4"


def _write_metrics(run_dir: Path, validations: dict[int, dict[str, float]]) -> Path:
    """One line per step 0..max; validation steps add their keys."""
    run_dir.mkdir(parents=True)
    last = max(validations)
    lines = [{"step": step, **({"critic/score/mean": 0.1 * step} if step else {}),
              **validations.get(step, {})} for step in range(last + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run_dir


def _pass(source: str, ks, base: float) -> dict[str, float]:
    return {f"val-aux/{source}/reward/pass@{k}": base + 0.1 * k for k in ks}


def test_each_validation_draws_the_k_it_logged_when_no_step_has_them_all(tmp_path):
    # n=2 before the resume (pass@1, pass@2), n=4 after it (pass@1, pass@4).
    run = _write_metrics(tmp_path / "run", {
        0: {VAL: 0.1, **_pass("gsm8k", (1, 2), 0.0)},
        2: {VAL: 0.2, **_pass("gsm8k", (1, 2), 0.1)},
        4: {VAL: 0.3, **_pass("gsm8k", (1, 4), 0.2)}})
    curves, notes = pass_at_k_curves(load_metrics(run))

    assert notes == []
    assert [(c.source, c.step, c.ks, c.first) for c in curves] == [
        ("gsm8k", 0, [1, 2], True), ("gsm8k", 4, [1, 4], False)]
    assert curves[1].values == [0.30000000000000004, 0.6000000000000001]
    report = render_report(run)
    panel = next(p for p in report.panels if p.name == "validation")
    assert panel.figure is not None and len(panel.figure.axes) == 2
    ax = panel.figure.axes[1]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1", "2", "4"]
    assert [line.get_label() for line in ax.get_lines()] == ["gsm8k, step 0", "gsm8k, step 4"]


def test_sources_keep_their_own_first_and_last_validation(tmp_path):
    run = _write_metrics(tmp_path / "run", {
        0: {VAL: 0.1, **_pass("gsm8k", (1, 2), 0.0)},
        3: {VAL: 0.2, **_pass("gsm8k", (1, 2), 0.1), **_pass("math", (1,), 0.0)}})
    curves, _ = pass_at_k_curves(load_metrics(run))
    # math validated once: one curve, not a first and a last that are the same.
    assert [(c.source, c.step, c.ks) for c in curves] == [
        ("gsm8k", 0, [1, 2]), ("gsm8k", 3, [1, 2]), ("math", 3, [1])]


def test_pass_keys_of_another_shape_are_left_out_with_a_note(tmp_path):
    run = _write_metrics(tmp_path / "run", {
        0: {VAL: 0.1, "val-aux/gsm8k/acc/pass@2": 0.5, **_pass("gsm8k", (1, 2), 0.0)},
        2: {VAL: 0.2, "val-aux/gsm8k/acc/pass@2": 0.6, **_pass("gsm8k", (1, 2), 0.1)}})
    curves, notes = pass_at_k_curves(load_metrics(run))
    assert {c.source for c in curves} == {"gsm8k"}
    assert notes == ["pass@k: left out val-aux/gsm8k/acc/pass@2 "
                     "(not val-aux/<source>/reward/pass@<k>)."]
    panel = validation_panel(load_metrics(run))
    assert len(panel.figure.axes) == 2 and notes[0] in panel.note


def test_only_unexpected_pass_keys_draw_no_pass_at_k_plot(tmp_path):
    run = _write_metrics(tmp_path / "run", {0: {VAL: 0.1, "val-aux/pass@4": 0.5},
                                            2: {VAL: 0.2, "val-aux/pass@4": 0.6}})
    report = render_report(run)
    panel = next(p for p in report.panels if p.name == "validation")
    assert panel.figure is not None and len(panel.figure.axes) == 1
    assert "left out val-aux/pass@4" in report.html.read_text()
