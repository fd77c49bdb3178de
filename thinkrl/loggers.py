"""Metric sinks named in `trainer.logger`: console, jsonl, tensorboard, wandb.

`MetricsLog` (thinkrl.metrics) writes metrics.jsonl itself, always, and fans
each step out to the sinks built here. A backend package is imported only
when its name is asked for; a missing one is reported when the run starts,
not after the first step.

Every sink has `log(metrics, step)` and `close()`; `metrics` maps a metric
name to a plain number (tensors were turned into Python numbers upstream).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Callable, Protocol

from thinkrl.errors import UserError

KNOWN_LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
# logger name -> (module that must import, what to install)
_BACKENDS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def logger_problems(names: list[str]) -> list[str]:
    """What is wrong with a `trainer.logger` list, one sentence per problem
    (empty when every name is known and its package is installed)."""
    return unknown_loggers(names) + missing_logger_packages(names)


def unknown_loggers(names: list[str]) -> list[str]:
    """Names no sink answers to: a config error wherever the run goes."""
    return [f"unknown logger {name!r}; known loggers: {', '.join(KNOWN_LOGGERS)}"
            for name in names if name not in KNOWN_LOGGERS]


def missing_logger_packages(names: list[str]) -> list[str]:
    """Known loggers whose package this machine lacks (the machine's problem,
    not the config's: `thinkrl doctor --target` judges a cluster from here)."""
    problems = []
    for name in names:
        module, package = _BACKENDS.get(name, (None, None))
        if module and importlib.util.find_spec(module) is None:
            problems.append(f"trainer.logger includes {name} but the {package} package is not "
                            f"installed: pip install {package}, or remove it from trainer.logger")
    return problems


def check_loggers(names: list[str]) -> None:
    """ValueError listing every problem of `trainer.logger` (see logger_problems)."""
    problems = logger_problems(names)
    if problems:
        raise UserError("trainer.logger: " + "; ".join(problems))


def open_sinks(names: list[str], *, run_dir: Path, config: dict[str, Any] | None,
               print_fn: Callable[[str], None], resume_step: int | None = None) -> list[Sink]:
    """The sinks for `trainer.logger` = `names` (jsonl is MetricsLog's own, so
    it adds none here). `resume_step`: the run continues after that step, so
    wandb continues the same run."""
    check_loggers(names)
    sinks: list[Sink] = []
    for name in dict.fromkeys(names):  # a name given twice opens one sink
        if name == "console":
            # With the progress bar on, the bar shows each step's reward: a
            # line per step too would push it up the screen every step.
            bar = bool(((config or {}).get("trainer") or {}).get("progress_bar", False))
            sinks.append(ConsoleSink(print_fn, validation_only=bar))
        elif name == "tensorboard":
            sinks.append(TensorBoardSink(_tensorboard_dir(run_dir)))
        elif name == "wandb":
            sinks.append(WandbSink(config, run_dir=run_dir, resumed=resume_step is not None))
    return sinks


class ConsoleSink:
    """One compact line per step: the headline metrics and any validation;
    with `validation_only` (trainer.progress_bar on) only the steps that
    validated get a line."""

    def __init__(self, print_fn: Callable[[str], None], *, validation_only: bool = False) -> None:
        self.print = print_fn
        self.validation_only = validation_only

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.validation_only and not any(k.startswith("val-") for k in metrics):
            return
        self.print(format_console({"step": step, **metrics}))

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Scalars into TensorBoard event files (`tensorboard --logdir DIR`)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # present but broken, e.g. a version clash
            raise UserError(f"trainer.logger includes tensorboard but it cannot be imported "
                             f"({err}): pip install tensorboard, or remove it from "
                             "trainer.logger") from err
        self.log_dir = log_dir
        # A resumed run logs its redone steps again; TensorBoard itself drops
        # the stopped run's events from there on (it purges orphaned data when
        # a step goes back), so the writer needs nothing special.
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if _is_number(value):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a crashed run still shows every finished step

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases: project and run name from `trainer.project_name` and
    `trainer.experiment_name`, the run config as the wandb config.
    `WANDB_MODE=offline` (or `disabled`) is read by wandb itself. The run id
    is kept in the run directory, so a resumed run continues the same wandb
    run (`resume="allow"`); a fresh run in the same directory starts a new one."""

    ID_FILE = "wandb_run_id.txt"

    def __init__(self, config: dict[str, Any] | None, *, run_dir: Path, resumed: bool) -> None:
        import uuid

        import wandb

        trainer = (config or {}).get("trainer", {})
        id_file = run_dir / self.ID_FILE
        if resumed and id_file.is_file():
            run_id, resume = id_file.read_text().strip(), "allow"
        else:
            run_id, resume = uuid.uuid4().hex[:12], None
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=trainer.get("project_name"),
                              name=trainer.get("experiment_name"), config=config,
                              id=run_id, resume=resume)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({k: v for k, v in metrics.items() if _is_number(v)}, step=step)

    def close(self) -> None:
        self.run.finish()


def _tensorboard_dir(run_dir: Path) -> Path:
    # verl's convention: TENSORBOARD_DIR, when set, collects every run's events.
    override = os.environ.get("TENSORBOARD_DIR")
    return Path(override) if override else run_dir / "tensorboard"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


CONSOLE_KEYS = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "distillation/reverse_kl", "actor/entropy",
                "actor/pg_clipfrac", "actor/grad_norm", "response_length/mean", "timing_s/step")


def format_console(record: dict) -> str:
    parts = [f"step {record['step']}"]
    for key in CONSOLE_KEYS:
        if key in record and _is_number(record[key]):
            parts.append(f"{key.split('/', 1)[1] if key.startswith('actor/') else key}="
                         f"{record[key]:.4g}")
    tasks = [k for k in record if k.startswith("task/") and k.endswith("/acc/mean")]
    if len(tasks) > 1:  # a mixture: each task's training accuracy
        parts += [f"{k[len('task/'):-len('/mean')]}={record[k]:.3f}" for k in sorted(tasks)]
    parts += [f"{k}={record[k]:.4g}" for k in sorted(record)
              if k.startswith("env/") and k.count("/") == 2 and k.endswith("/errors") and record[k]]
    parts += [f"{k}={v:.3f}" for k, v in record.items()
              if k.startswith("val-core/") and _is_number(v)]
    return "  ".join(parts)
