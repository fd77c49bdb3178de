"""`thinkrl report`: a run directory drawn as one HTML page with PNG panels.

    data.py    metrics.jsonl -> columns, config.yaml, generations/*.jsonl
    panels.py  one matplotlib figure per question (reward, validation, ...)
    page.py    the HTML: settings, summary, panels, sample generations
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

from thinkrl.errors import UserError
from thinkrl.report.data import config_value, load_config, load_generations, load_metrics
from thinkrl.report.page import render_page
from thinkrl.report.panels import DPI, Panel, all_panels

__all__ = ["Report", "render_report"]


@dataclass
class Report:
    html: Path
    images: list[Path]
    """The PNG of each drawn panel, in page order."""
    panels: list[Panel]
    """Every panel, drawn or skipped (its `note` says why)."""
    notes: list[str]


def render_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Report:
    """Write `<out_dir>/report.html` and one PNG per drawn panel into
    `out_dir` (default `<run_dir>/report`). Raises ValueError when `run_dir`
    holds no metrics.jsonl."""
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise UserError(f"{run_dir}: no such directory; give a run directory "
                         "(trainer.default_local_dir of the run)")
    metrics = load_metrics(run_dir)
    config = load_config(run_dir)
    notes = list(metrics.notes)
    generations = load_generations(run_dir, notes)
    out = Path(out_dir).expanduser() if out_dir else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)

    panels = all_panels(metrics)
    images: dict[str, bytes] = {}
    paths = []
    for panel in panels:
        if panel.figure is None:
            continue
        buffer = io.BytesIO()
        panel.figure.savefig(buffer, format="png", dpi=DPI)
        images[panel.name] = buffer.getvalue()
        paths.append(out / f"{panel.name}.png")
        paths[-1].write_bytes(images[panel.name])
    name = config_value(config, "trainer.experiment_name") or run_dir.resolve().name
    html = render_page(title=f"thinkrl run: {name}", run_dir=str(run_dir.resolve()),
                       config=config, metrics=metrics, panels=panels,
                       images=images, generations=generations, notes=notes)
    page = out / "report.html"
    page.write_text(html, encoding="utf-8")
    return Report(html=page, images=paths, panels=panels, notes=notes)
