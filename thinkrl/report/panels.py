"""One figure per question a reader asks of a run: is the reward rising, is
validation following, are responses getting longer or cut off, is the
policy moving too far, where does a step's time go, how fast is it.

Each `*_panel(metrics)` returns a `Panel`: a matplotlib Figure, or none and
a note saying which metrics were missing. Figures are built with
`matplotlib.figure.Figure` (no pyplot, no display, Agg when saved).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator, PercentFormatter

from thinkrl.report.data import RunMetrics

DPI = 100
WIDTH_IN = 11.0
ROW_HEIGHT_IN = 3.6
MAX_BARS = 60
PASS_AT_K = re.compile(r"val-aux/(?P<source>.+)/reward/pass@(?P<k>\d+)$")
THROUGHPUT = re.compile(r"throughput|tokens?_per_s(ec|econd)?$|tok(en)?s?/s$")
# The stages of one training step, in the order they run (thinkrl.trainer.train_step).
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
POLICY_PLOTS = (  # subplot title, keys
    ("KL to the reference", ("actor/kl_loss", "actor/reward_kl_penalty")),
    ("entropy (nats/token)", ("actor/entropy",)),
    ("clip fraction", ("actor/pg_clipfrac", "actor/pg_clipfrac_lower")),
    ("grad norm (before clipping)", ("actor/grad_norm",)),
    ("policy-gradient loss", ("actor/pg_loss",)),
    ("PPO KL (π vs π_old)", ("actor/ppo_kl",)),
)

# Why a policy metric can be exactly 0 for a whole run.
ZERO_REASONS = {
    "PPO KL (π vs π_old)": "one optimizer step per batch: π is π_old when the loss is taken",
    "clip fraction": "one optimizer step per batch: the ratio π/π_old is 1, never clipped",
    "KL to the reference": "no KL term (actor.use_kl_loss and algorithm.use_kl_in_reward off), "
                           "or the policy has not moved from the reference",
    "policy-gradient loss": "every group's responses scored alike: all advantages are 0",
    "grad norm (before clipping)": "all advantages 0 and no KL or entropy term: no gradient",
}


@dataclass
class Panel:
    name: str
    """File stem of the PNG."""
    title: str
    note: str
    """What the figure shows, or why there is no figure."""
    figure: Figure | None = None

    @property
    def size_px(self) -> tuple[int, int]:
        width, height = self.figure.get_size_inches()
        return round(width * DPI), round(height * DPI)


def all_panels(m: RunMetrics) -> list[Panel]:
    return [reward_panel(m), breakdown_panel(m), validation_panel(m), length_panel(m), policy_panel(m),
            timing_panel(m), throughput_panel(m)]


def reward_panel(m: RunMetrics) -> Panel:
    title = "Training reward"
    if not m.has("critic/score/mean"):
        return Panel("reward", title, "not shown: critic/score/mean was not logged")
    fig, ax = _figure(1)
    ax = ax[0]
    _line(ax, m, "critic/score/mean", label="mean score")
    _range_lines(ax, m, "critic/score", label="min / max over responses")
    if m.has("critic/rewards/mean") and not _same(m, "critic/rewards/mean", "critic/score/mean"):
        _line(ax, m, "critic/rewards/mean", label="mean reward after KL penalty", style="--")
    _finish(ax, m, ylabel="score")
    return Panel("reward", title, "critic/score: the reward function's score of each training "
                 "response, averaged over the step's batch.", fig)


def breakdown_panel(m: RunMetrics) -> Panel:
    title = "Tasks and environments"
    tasks = [k for k in m.matching("task/") if k.endswith("/acc/mean")]
    envs = [k for k in m.matching("env/") if k.endswith("/turns/mean")]
    if len(tasks) < 2 and not envs:
        return Panel("breakdown", title, "not shown: one data source and no environment")
    fig, axes = _figure(2 if envs else 1)
    for key in tasks:
        _line(axes[0], m, key, label=key[len("task/"):-len("/acc/mean")])
    _finish(axes[0], m, ylabel="training accuracy")
    for key in envs:
        _line(axes[1], m, key, label=key[len("env/"):-len("/turns/mean")])
    if envs:
        _finish(axes[1], m, ylabel="turns per response (num_turns)")
    return Panel("breakdown", title, "task/<data_source>/acc/mean: the share of each data source's "
                 "training responses that are correct; env/<name>/turns/mean: the turns of each "
                 "environment's conversations (errors: env/<name>/errors in metrics.jsonl).", fig)


def validation_panel(m: RunMetrics) -> Panel:
    title = "Validation"
    keys = [k for k in m.matching("val-core/")
            if re.search(r"/reward/mean@\d+$", k) or "/acc/" in k]
    if not keys:
        return Panel("validation", title, "not shown: no val-core/*/reward/mean@* or "
                     "val-core/*/acc/* metrics (no validation ran: trainer.test_freq and "
                     "trainer.val_before_train)")
    curves, skipped = pass_at_k_curves(m)
    fig, axes = _figure(2 if curves else 1)
    drawn: list[str] = []
    for key in keys:
        twin = next((d for d in drawn if _same(m, d, key)), None)
        if twin is not None:  # e.g. gsm8k: reward 1 = correct, so reward and acc coincide
            axes[0].lines[drawn.index(twin)].set_label(
                f"{twin.removeprefix('val-core/')} = {key.rsplit('/', 2)[-2]} (identical)")
            continue
        _line(axes[0], m, key, label=key.removeprefix("val-core/"), marker="o")
        drawn.append(key)
    _finish(axes[0], m, ylabel="mean over validation responses")
    if curves:
        axes[0].set_title("over training", fontsize=10)
        _pass_at_k(axes[1], curves)
    note = ("Validation set, scored at each validation step (step 0: before training). "
            "reward: mean score; acc: fraction correct; pass@k: a prompt counts if any of "
            "k samples is correct.")
    return Panel("validation", title, " ".join([note, *skipped]), fig)


def length_panel(m: RunMetrics) -> Panel:
    title = "Response length"
    if not m.has("response_length/mean"):
        return Panel("response_length", title, "not shown: response_length/mean was not logged")
    clip = m.has("response_length/clip_ratio")
    fig, axes = _figure(2 if clip else 1)
    _line(axes[0], m, "response_length/mean", label="mean")
    _range_lines(axes[0], m, "response_length", label="min / max")
    _finish(axes[0], m, ylabel="tokens per response")
    if clip:
        _line(axes[1], m, "response_length/clip_ratio", label="cut at the length limit",
              color="tab:red")
        _fraction_axis(axes[1], m.columns["response_length/clip_ratio"])
        _finish(axes[1], m, ylabel="share of responses")
    return Panel("response_length", title, "Training responses in tokens. Responses cut at "
                 "data.max_response_length never wrote their answer's end; a rising share "
                 "means the limit is too short.", fig)


def policy_panel(m: RunMetrics) -> Panel:
    title = "Policy update"
    logged = [(name, m.present(keys)) for name, keys in POLICY_PLOTS if m.present(keys)]
    if not logged:
        return Panel("policy", title, "not shown: none of "
                     f"{', '.join(k for _, keys in POLICY_PLOTS for k in keys)} was logged")
    # A flat-zero plot reads as a broken one: hide it and say why it is zero.
    zero = [(name, keys) for name, keys in logged if all(_all_zero(m, k) for k in keys)]
    plots = [plot for plot in logged if plot not in zero] or logged
    hidden = "" if len(plots) == len(logged) else " Always 0 in this run, so not drawn: " + \
        "; ".join(f"{name} ({ZERO_REASONS.get(name, 'no such term in this run')})"
                  for name, _ in zero) + "."
    rows = -(-len(plots) // 3)
    fig = Figure(figsize=(WIDTH_IN, ROW_HEIGHT_IN * 0.85 * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 3, squeeze=False).ravel()
    for ax, (name, keys) in zip(axes, plots):
        for style, key in zip(("-", "--"), keys):
            _line(ax, m, key, label=key.removeprefix("actor/"), style=style)
        if name == "clip fraction":
            _fraction_axis(ax, np.concatenate([m.columns[k] for k in keys]))
        ax.set_title(name, fontsize=10)
        _finish(ax, m, ylabel=None, legend=False)
        if len(keys) > 1:  # small plots: a legend beside each would squeeze the grid
            ax.legend(loc="best", fontsize=7, framealpha=0.8)
    for ax in axes[len(plots):]:
        ax.set_visible(False)
    return Panel("policy", title, "How far each update moves the policy. KL: distance "
                 "to the reference model; clip fraction: tokens whose ratio π/π_old hit "
                 "the clip range." + hidden, fig)


def timing_panel(m: RunMetrics) -> Panel:
    title = "Where a step's time goes"
    stages = [s for s in STAGES if m.has(f"timing_s/{s}")]
    if not stages:
        return Panel("timing", title, "not shown: no timing_s/<stage> metrics were logged")
    testing = m.has("timing_s/testing")
    fig, axes = _figure(2 if testing else 1, ratios=[3, 1] if testing else None)
    train = np.isfinite(m.columns[f"timing_s/{stages[0]}"])
    steps = m.steps[train]
    parts = {s: np.nan_to_num(m.columns[f"timing_s/{s}"][train]) for s in stages}
    if m.has("timing_s/step"):  # time inside the step no stage timer covered
        parts["other"] = np.clip(np.nan_to_num(m.columns["timing_s/step"][train])
                                 - sum(parts.values()), 0, None)
    colors = dict(zip((*STAGES, "other"), _palette(len(STAGES) + 1)))
    total = max(sum(float(seconds.sum()) for seconds in parts.values()), 1e-9)
    x, width, per = _bins(steps, max_bars=MAX_BARS)
    bottom = 0.0
    for name, seconds in parts.items():
        share = 100 * seconds.sum() / total
        label = f"{name}  {seconds.mean():.2f} s ({f'{share:.0f}%' if share >= 1 else '<1%'})"
        height = _bin_means(seconds, per)
        axes[0].bar(x, height, bottom=bottom, width=width, color=colors[name], label=label)
        bottom = bottom + height
    averaged = f", mean of each {per} steps" if per > 1 else ""
    axes[0].set_title(f"training step by stage{averaged} (legend: mean per step, share)",
                      fontsize=10)
    _finish(axes[0], m, ylabel="seconds", legend=False)
    handles, labels = axes[0].get_legend_handles_labels()
    # Top of the legend = top of the stack.
    axes[0].legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0),
                   fontsize=8, frameon=False)
    if testing:
        _line(axes[1], m, "timing_s/testing", label="", marker="o", color="tab:gray")
        axes[1].set_title("validation (timing_s/testing)", fontsize=10)
        axes[1].set_ylim(bottom=0)
        _finish(axes[1], m, ylabel="seconds", legend=False)
        axes[1].xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # a narrow plot
    return Panel("timing", title, "Seconds per training step split by stage "
                 "(timing_s/*); \"other\" is the rest of timing_s/step. Validation runs "
                 "outside the step and is shown apart.", fig)


def throughput_panel(m: RunMetrics) -> Panel:
    title = "Throughput"
    keys = [k for k in m.matching("perf/") if THROUGHPUT.search(k)]
    if not keys:
        return Panel("throughput", title, "not shown: no perf/throughput or tokens/s metrics")
    fig, ax = _figure(1)
    for key in keys:
        _line(ax[0], m, key, label=key)
    _finish(ax[0], m, ylabel="tokens / second")
    ax[0].set_ylim(bottom=0)
    return Panel("throughput", title, "perf/throughput: prompt and response tokens "
                 "processed per second of step time, per device.", fig)


# --- drawing helpers ---------------------------------------------------------------

def _bins(steps: np.ndarray, *, max_bars: int) -> tuple[np.ndarray, float, int]:
    """Bar centres and width when every `per` consecutive steps share one bar,
    so a long run still draws at most `max_bars` bars."""
    per = max(1, -(-len(steps) // max_bars))
    starts = steps[::per]
    return starts + (per - 1) / 2, 0.8 * per, per


def _bin_means(values: np.ndarray, per: int) -> np.ndarray:
    padded = np.full(-(-len(values) // per) * per, np.nan)
    padded[:len(values)] = values
    return np.nanmean(padded.reshape(-1, per), axis=1)


def _figure(columns: int, ratios: list[float] | None = None):
    fig = Figure(figsize=(WIDTH_IN, ROW_HEIGHT_IN), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, columns, squeeze=False, width_ratios=ratios).ravel()
    return fig, axes


def _xy(m: RunMetrics, key: str):
    column = m.columns[key]
    finite = np.isfinite(column)
    return m.steps[finite], column[finite]


def _line(ax, m: RunMetrics, key: str, *, label: str, style: str = "-", marker=None,
          color=None) -> None:
    x, y = _xy(m, key)
    # A lone point draws no line: mark it so one-step runs still show something.
    ax.plot(x, y, style, marker=marker or ("o" if len(x) < 3 else None), ms=4, lw=1.6,
            label=label, color=color)


def _range_lines(ax, m: RunMetrics, prefix: str, *, label: str) -> None:
    """`{prefix}/min` and `/max` as thin lines: a filled band hides the mean
    when rewards are 0/1 (min 0 and max 1 at every step)."""
    for key in (f"{prefix}/min", f"{prefix}/max"):
        if m.has(key):
            _line(ax, m, key, label=label, style=":", color="tab:blue")
            label = None  # one legend entry for the pair


def _fraction_axis(ax, values: np.ndarray) -> None:
    """0 to at least 5%: a clip fraction of 0.4% should look small."""
    top = np.nanmax(values) if np.isfinite(values).any() else 0.0
    ax.set_ylim(0, max(0.05, 1.15 * top))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))


@dataclass(frozen=True)
class PassAtKCurve:
    """pass@k against k for one data source at one validation step."""

    source: str
    step: int
    ks: list[int]
    values: list[float]
    first: bool
    """The source's first validation step (drawn dashed); else its last."""


def pass_at_k_curves(m: RunMetrics) -> tuple[list[PassAtKCurve], list[str]]:
    """Curves for the first and the last validation step of each data source,
    and notes on what was left out.

    Each step draws the k values it logged: the set can change between
    validations (val n changed across a resume), so no step need have them all.
    Keys not of the form val-aux/<source>/reward/pass@<k> are left out.
    """
    by_source: dict[str, list[tuple[int, str]]] = {}
    ignored = []
    for key in m.matching("val-aux/", contains=("/pass@",)):
        match = PASS_AT_K.match(key)
        if match is None:
            ignored.append(key)
            continue
        by_source.setdefault(match["source"], []).append((int(match["k"]), key))
    curves: list[PassAtKCurve] = []
    notes = [f"pass@k: left out {', '.join(ignored)} (not val-aux/<source>/reward/pass@<k>)."
             ] if ignored else []
    for source, ks in sorted(by_source.items()):
        ks.sort()
        table = np.array([m.columns[key] for _, key in ks])  # [K, S]
        # Never empty: `matching` keeps only keys with a finite value.
        validated = np.flatnonzero(np.isfinite(table).any(axis=0))
        for index in dict.fromkeys((validated[0], validated[-1])):  # once if they are one
            logged = np.isfinite(table[:, index])
            curves.append(PassAtKCurve(
                source, int(m.steps[index]), [k for (k, _), ok in zip(ks, logged) if ok],
                [float(v) for v in table[logged, index]], first=index == validated[0]))
    return curves, notes


def _pass_at_k(ax, curves: list[PassAtKCurve]) -> None:
    """pass@k against k at the first and the last validation, per data source."""
    for curve in curves:
        ax.plot(curve.ks, curve.values, "--" if curve.first else "-", marker="o", ms=4,
                label=f"{curve.source}, step {curve.step}")
    ks = sorted({k for curve in curves for k in curve.ks})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, labels=[str(k) for k in ks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("pass@k")
    ax.set_title("pass@k, first and last validation", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)


def _finish(ax, m: RunMetrics, *, ylabel: str | None, legend: bool = True) -> None:
    ax.set_xlabel("training step")
    ax.set_xlim(m.steps[0] - 0.6, m.steps[-1] + 0.6)  # the same steps in every panel
    if ylabel:
        ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if legend and ax.get_legend_handles_labels()[0]:
        # Beside the plot, never over the data.
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _all_zero(m: RunMetrics, key: str) -> bool:
    values = m.columns[key]
    values = values[np.isfinite(values)]
    return values.size > 0 and bool((values == 0).all())


def _same(m: RunMetrics, a: str, b: str) -> bool:
    return bool(np.allclose(m.columns[a], m.columns[b], equal_nan=True))


def _palette(count: int) -> list:
    from matplotlib import colormaps

    return [colormaps["tab10"](i % 10) for i in range(count)]
