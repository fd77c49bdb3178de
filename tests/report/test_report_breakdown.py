"""The report's tasks-and-environments panel, and the console line of a
mixture: each task's training accuracy, each environment's turns and
failures; a run with one data source and no environment shows neither."""

from __future__ import annotations

import json
from pathlib import Path

from thinkrl.loggers import format_console
from thinkrl.report.data import load_metrics
from thinkrl.report.panels import breakdown_panel


def _run(run_dir: Path, records: list[dict]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def test_a_mixture_with_an_environment_draws_tasks_and_turns(tmp_path):
    records = [{"step": s, "task/reasoning_gym/a/acc/mean": 0.1 * s, "task/textarena/g/acc/mean": 0.2,
                "env/textarena/turns/mean": 3.0 + s, "env/textarena/errors": 0.0} for s in (1, 2, 3)]
    panel = breakdown_panel(load_metrics(_run(tmp_path / "mix", records)))
    assert panel.figure is not None and len(panel.figure.axes) == 2
    assert sorted(line.get_label() for line in panel.figure.axes[0].lines) == ["reasoning_gym/a", "textarena/g"]
    line = format_console({**records[1], "env/textarena/errors": 2.0, "env/textarena/errors/timeout": 2.0})
    assert "reasoning_gym/a/acc=0.200" in line and "textarena/g/acc=0.200" in line
    assert "env/textarena/errors=2" in line and "errors/timeout" not in line


def test_one_task_and_no_environment_show_no_breakdown(tmp_path):
    records = [{"step": s, "task/openai/gsm8k/acc/mean": 0.1 * s} for s in (1, 2)]
    assert breakdown_panel(load_metrics(_run(tmp_path / "one", records))).figure is None
    assert "acc=" not in format_console(records[0])
