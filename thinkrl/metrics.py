"""Metric names (verl's, where a verl user would look), timing, and sinks.

Every step appends one JSON object with `step` to `<run dir>/metrics.jsonl`;
the other sinks named in `trainer.logger` (console, tensorboard, wandb) live
in thinkrl.loggers.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from thinkrl.atomic import atomic_write_text
from thinkrl.loggers import check_loggers, open_sinks
from thinkrl.records import FINISH_LENGTH, Rollouts


class StageTimer:
    """`with timer("gen"): ...` records `timing_s/gen`; `sync` waits for the
    accelerator at both ends of a stage (asynchronous kernels otherwise bill
    their time to whichever stage next waits for them)."""

    def __init__(self, sync=lambda: None, on_stage: Callable[[str], None] | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.sync = sync
        self.on_stage = on_stage  # told the innermost stage running, as it changes (a progress line)
        self._open: list[str] = []

    @contextmanager
    def __call__(self, stage: str):
        self.sync()
        self._open.append(stage)
        self._tell()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.sync()
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
            self._open.pop()
            self._tell()

    def _tell(self) -> None:
        if self.on_stage is not None and self._open:
            self.on_stage(self._open[-1])

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{stage}": value for stage, value in self.seconds.items()}


def _stats(prefix: str, values: Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def rollout_metrics(rollouts: Rollouts, *, scores: Tensor, rewards: Tensor,
                    advantages: Tensor) -> dict[str, float]:
    """critic/score (the scorer's), critic/rewards (per response, after any KL
    penalty; rewards is [N, R]), critic/advantages, response and prompt
    lengths (verl's names)."""
    mask = rollouts.response_mask.bool()
    lengths = rollouts.response_lengths.float()
    metrics = {}
    metrics.update(_stats("critic/score", scores))
    metrics.update(_stats("critic/rewards", rewards.sum(-1)))
    metrics.update(_stats("critic/advantages", advantages[mask]))
    metrics.update(_stats("response_length", lengths))
    metrics["response_length/clip_ratio"] = sum(
        r == FINISH_LENGTH for r in rollouts.finish_reasons) / len(rollouts)
    metrics.update(_stats("prompt_length", rollouts.prompt_mask.sum(-1)))
    # Groups whose responses all scored the same carry no GRPO signal.
    groups = rollouts.group_ids.unique()
    flat = sum(bool(scores[rollouts.group_ids == g].std(unbiased=False) == 0) for g in groups)
    metrics["critic/zero_adv_group_ratio"] = flat / len(groups)
    if rollouts.turns is not None:
        metrics.update(turn_metrics(rollouts))
    return metrics


def turn_metrics(rollouts: Rollouts) -> dict[str, float]:
    """Conversations: num_turns (verl's: the prompt's turn, the model's and the
    environment's), the share of response tokens an environment wrote (masked
    out of the loss), timing_s/env (the wall time the batch waited on
    environments); with tools, calls and failed calls per response and
    timing_s/tool_calls (every call's seconds summed: they overlap)."""
    turns = rollouts.turns
    env_tokens = (rollouts.trajectory_mask.sum() - rollouts.response_mask.sum()).item()
    metrics = {**_stats("num_turns", turns.assistant_turns + turns.env_turns + 1),
               **_stats("multi_turn/assistant_turns", turns.assistant_turns),
               "multi_turn/env_token_ratio": env_tokens / max(1.0, rollouts.trajectory_mask.sum().item()),
               "timing_s/env": float(turns.env_wall.sum())}
    if any("tool_calls" in m for m in turns.metrics):
        calls = torch.tensor([m.get("tool_calls", 0.0) for m in turns.metrics])
        errors = sum(m.get("tool_errors", 0.0) for m in turns.metrics)
        metrics.update({**_stats("multi_turn/tool_calls", calls), "multi_turn/tool_errors": float(errors),
                        "multi_turn/tool_token_ratio": metrics["multi_turn/env_token_ratio"],
                        "multi_turn/tool_error_ratio": float(errors / max(1.0, float(calls.sum()))),
                        "timing_s/tool_calls": sum(m.get("tool_seconds", 0.0) for m in turns.metrics)})
    return metrics


def breakdown_metrics(rollouts: Rollouts, *, scores: Tensor,
                      parts: list[dict[str, float]]) -> dict[str, float]:
    """Per data source (``task/<ds>/...``) and, for conversations, per
    environment (``env/<name>/...``): share of the batch, reward, accuracy,
    response length; for environments also turns, failures (all kinds and
    per kind), the environment's own counts, and
    timing_s/env_per_response/<name> (its calls' seconds per response)."""
    from thinkrl.rewards.scoring import is_correct

    correct = torch.tensor([float(is_correct(float(s), p)) for s, p in
                            zip(scores.tolist(), parts or [None] * len(scores))])
    lengths = rollouts.response_lengths.float()
    metrics: dict[str, float] = {}

    def group(prefix: str, rows: list[int]) -> Tensor:
        index = torch.tensor(rows, dtype=torch.long)
        metrics[f"{prefix}/share"] = len(rows) / len(rollouts)
        metrics[f"{prefix}/reward/mean"] = float(scores[index].mean())
        metrics[f"{prefix}/acc/mean"] = float(correct[index].mean())
        metrics[f"{prefix}/response_length/mean"] = float(lengths[index].mean())
        return index

    for source in sorted({s.data_source for s in rollouts.samples}):
        group(f"task/{source}", [i for i, s in enumerate(rollouts.samples) if s.data_source == source])
    turns = rollouts.turns
    if turns is None:
        return metrics
    for name in sorted(set(turns.environments)):
        rows = [i for i, e in enumerate(turns.environments) if e == name]
        index, prefix = group(f"env/{name}", rows), f"env/{name}"
        metrics[f"{prefix}/turns/mean"] = float((turns.assistant_turns + turns.env_turns + 1)[index].float().mean())
        metrics[f"timing_s/env_per_response/{name}"] = float(turns.env_seconds[index].mean())
        failures = [turns.failures[i] for i in rows if turns.failures[i] is not None]
        metrics[f"{prefix}/errors"] = float(len(failures))
        for kind in sorted(set(failures)):
            metrics[f"{prefix}/errors/{kind}"] = float(failures.count(kind))
        for key in sorted({k for i in rows for k in turns.metrics[i]}):
            # a count an environment reports repeats for a seed; a time does not
            where = f"timing_s/env/{name}/{key}" if key.endswith("_seconds") else f"{prefix}/{key}/mean"
            metrics[where] = sum(turns.metrics[i].get(key, 0.0) for i in rows) / len(rows)
    return metrics


def throughput_metrics(rollouts: Rollouts, *, step_seconds: float, world_size: int) -> dict:
    tokens = int(rollouts.prompt_mask.sum() + rollouts.trajectory_mask.sum())
    return {"perf/total_num_tokens": tokens,
            "perf/time_per_step": step_seconds,
            "perf/throughput": tokens / max(step_seconds, 1e-9) / world_size}


class MetricsLog:
    """Appends per-step metrics to metrics.jsonl (always) and passes them to
    the sinks named in `loggers`; `config` (the run config as a dict) becomes
    the wandb run's config. Call `close()` when the run ends."""

    def __init__(self, run_dir: Path, *, loggers: list[str], print_fn=print,
                 config: dict | None = None) -> None:
        # A bad logger name or a missing package stops the run here, before
        # `begin` touches any file.
        check_loggers(loggers)
        self.loggers, self.config = loggers, config
        self.sinks: list | None = None
        """Opened by `begin` (they need to know whether the run resumes)."""
        self.run_dir, self.path = run_dir, run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.print = print_fn
        self.kept: list[dict] = []
        """Records of the run this one continues (steps <= the resumed step)."""

    def begin(self, *, resume_step: int | None = None) -> None:
        """Prepare metrics.jsonl: continue it after `resume_step` (a checkpoint
        of this run directory was loaded), or keep an earlier run's file aside;
        then open the sinks. `log` calls it first if nobody did."""
        if resume_step is not None:
            # Steps after k were logged by the run that stopped and are done
            # again now, so drop them.
            self.kept = _records_up_to(self.path, resume_step)
        elif self.path.exists() and self.path.stat().st_size > 0:
            # A new run in an old run's folder: keep the old metrics, never mix them.
            kept = _free_name(self.run_dir, "metrics.previous-{}.jsonl")
            self.path.rename(kept)
            self.print(f"{self.run_dir} held metrics of an earlier run: kept them as {kept.name}")
        self.sinks = open_sinks(self.loggers, run_dir=self.run_dir, config=self.config,
                                print_fn=self.print, resume_step=resume_step)

    def log(self, metrics: dict[str, float], *, step: int) -> None:
        if self.sinks is None:
            self.begin()
        values = {k: v.item() if isinstance(v, torch.Tensor) else v
                  for k, v in sorted(metrics.items())}
        record = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for sink in self.sinks:
            sink.log(values, step)

    def close(self) -> None:
        for sink in self.sinks or []:
            sink.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of a run's metrics.jsonl, in order; [] when there is none yet."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _records_up_to(path: Path, step: int) -> list[dict]:
    """Rewrite metrics.jsonl (atomically) with only its records of steps <=
    `step`, and return them. A torn last line (a crash mid-write) is dropped."""
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", step + 1) <= step:
                records.append(record)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return records


def _free_name(folder: Path, pattern: str) -> Path:
    index = 1
    while (folder / pattern.format(index)).exists():
        index += 1
    return folder / pattern.format(index)


def _plain(value):
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep it visible
    return value
