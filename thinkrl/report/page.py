"""The report page: run settings, a summary, the panels, sample generations.

One self-contained HTML file (the PNGs are embedded as base64, so the page
can be mailed or copied alone). Every text that came from the run, prompts
and responses above all, goes through `html.escape`: they hold
`<|im_start|>` and `<think>` tags that a browser would otherwise swallow.
"""

from __future__ import annotations

import base64
import math
from html import escape
from itertools import groupby

import numpy as np

from thinkrl.report.data import RunMetrics, SavedGeneration, config_value
from thinkrl.report.panels import Panel

# (label, config key) shown in the header.
SETTINGS = (
    ("model", "actor_rollout_ref.model.path"),
    ("train data", "data.train_files"),
    ("validation data", "data.val_files"),
    ("prompts per step", "data.train_batch_size"),
    ("responses per prompt (n)", "actor_rollout_ref.rollout.n"),
    ("mini-batch (prompts)", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("max prompt / response tokens", ("data.max_prompt_length", "data.max_response_length")),
    ("learning rate", "actor_rollout_ref.actor.optim.lr"),
    ("KL loss (use, coef, type)", ("actor_rollout_ref.actor.use_kl_loss",
                                   "actor_rollout_ref.actor.kl_loss_coef",
                                   "actor_rollout_ref.actor.kl_loss_type")),
    ("KL in reward (use, coef)", ("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef")),
    ("temperature", "actor_rollout_ref.rollout.temperature"),
    ("steps (total_training_steps, epochs)", ("trainer.total_training_steps",
                                              "trainer.total_epochs")),
    ("validate every (test_freq)", "trainer.test_freq"),
)
GENERATION_STEPS_SHOWN = 6
GENERATIONS_PER_STEP = 3

CSS = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1140px; margin: 2em auto; padding: 0 1em;
       color: #222; }
h1 { margin-bottom: .2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; } td, th { padding: 2px 10px 2px 0; text-align: left;
       vertical-align: top; } th { font-weight: 600; }
img { max-width: 100%; } .note { color: #666; } .skipped { color: #a40; }
img.thumb { max-width: 160px; margin: 0 .4em .4em 0; border: 1px solid #ddd; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f6f6; padding: .6em;
      margin: .3em 0; font-size: 13px; }
details { margin: .8em 0; } summary { cursor: pointer; }
"""


def render_page(*, title: str, run_dir: str, config: dict | None, metrics: RunMetrics, panels: list[Panel],
                images: dict[str, bytes], generations: list[SavedGeneration],
                notes: list[str]) -> str:
    """The HTML text; `images` maps a drawn panel's name to its PNG bytes."""
    body = [f"<h1>{escape(title)}</h1>", f'<p class="note">{escape(run_dir)}</p>',
            _settings(config), _summary(metrics)]
    if notes:
        body.append("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes)
                    + "</ul>")
    for panel in panels:
        body.append(f"<h2>{escape(panel.title)}</h2>")
        if panel.name in images:
            data = base64.b64encode(images[panel.name]).decode("ascii")
            body.append(f'<p class="note">{escape(panel.note)}</p>'
                        f'<img alt="{escape(panel.title)}" src="data:image/png;base64,{data}">')
        else:
            body.append(f'<p class="skipped">{escape(panel.note)}</p>')
    body.append(_generations(generations))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _settings(config: dict | None) -> str:
    if config is None:
        return '<p class="skipped">No readable config.yaml in the run directory: settings unknown.</p>'
    rows = []
    for label, keys in SETTINGS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        shown = ", ".join(_show(config_value(config, key)) for key in keys)
        rows.append(f"<tr><th>{escape(label)}</th><td>{escape(shown)}</td></tr>")
    return "<h2>Settings</h2><table>" + "".join(rows) + "</table>"


def _summary(m: RunMetrics) -> str:
    rows = [("steps logged", f"{int(m.steps[0])} to {int(m.steps[-1])} ({len(m.steps)} lines)")]
    for key in (k for k in m.matching("val-core/") if "/reward/mean@" in k or "/acc/" in k):
        column = m.columns[key]
        finite = np.flatnonzero(np.isfinite(column))
        first, last = column[finite[0]], column[finite[-1]]
        change = f" ({100 * (last - first):+.1f} points)" if len(finite) > 1 else ""
        rows.append((key.removeprefix("val-core/"),
                     f"{first:.3f} at step {int(m.steps[finite[0]])} → {last:.3f} at step "
                     f"{int(m.steps[finite[-1]])}{change}"))
    if m.has("critic/score/mean"):
        column = m.columns["critic/score/mean"]
        finite = column[np.isfinite(column)]
        rows.append(("training score, first → last step", f"{finite[0]:.3f} → {finite[-1]:.3f}"))
    seconds = sum(float(np.nansum(m.columns[k])) for k in ("timing_s/step", "timing_s/testing")
                  if k in m.columns)
    if seconds:
        rows.append(("time in steps and validation", _duration(seconds)
                     + " (model loading and start-up not counted)"))
    cells = "".join(f"<tr><th>{escape(a)}</th><td>{escape(b)}</td></tr>" for a, b in rows)
    return f"<h2>Summary</h2><table>{cells}</table>"


def _generations(generations: list[SavedGeneration]) -> str:
    if not generations:
        return ('<h2>Sample generations</h2><p class="skipped">none saved (generations/*.jsonl; '
                "trainer.log_train_generations and trainer.log_val_generations)</p>")
    ordered = sorted(generations, key=lambda g: (-g.step, g.kind))
    groups = [(key, list(items)) for key, items in groupby(ordered, key=lambda g: (g.step, g.kind))]
    parts = ["<h2>Sample generations</h2>",
             f'<p class="note">Newest first; {GENERATIONS_PER_STEP} per saved step shown.</p>']
    for (step, kind), items in groups[:GENERATION_STEPS_SHOWN]:
        label = {"train": "training", "val": "validation"}.get(kind, kind or "saved")
        parts.append(f"<h3>Step {step}, {label} ({len(items)} saved)</h3>")
        for g in (saved.generation for saved in items[:GENERATIONS_PER_STEP]):
            parts.append(
                f"<details open><summary>score {_show(g.score)} · {g.response_length} tokens · "
                f"{escape(g.finish_reason)} · {escape(g.data_source)} · expected "
                f"<code>{escape(g.ground_truth)}</code></summary>"
                f"<details><summary>prompt</summary><pre>{escape(g.prompt)}</pre></details>"
                f"{_thumbnails(g.images)}<pre>{escape(g.response)}</pre></details>")
    if len(groups) > GENERATION_STEPS_SHOWN:
        parts.append(f'<p class="note">{len(groups) - GENERATION_STEPS_SHOWN} earlier saved '
                     "steps not shown.</p>")
    return "\n".join(parts)


def _thumbnails(images: tuple[str, ...]) -> str:
    """The prompt's images beside the response (data URIs from the generations file)."""
    if not images:
        return ""
    tags = "".join(f'<img class="thumb" src="{escape(uri)}" alt="prompt image {i + 1}">'
                   for i, uri in enumerate(images))
    return f'<div class="thumbs">{tags}</div>'


def _show(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"
