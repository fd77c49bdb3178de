"""trainer.logger sinks: console, jsonl (always), tensorboard (real files), wandb (faked)."""

from __future__ import annotations

import importlib.machinery
import json
import math
import sys
import types

import pytest
import torch

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.metrics import MetricsLog


def _scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_jsonl_is_written_whatever_the_list_and_console_prints(tmp_path):
    printed = []
    log = MetricsLog(tmp_path, loggers=["console"], print_fn=printed.append)
    log.log({"critic/score/mean": torch.tensor(0.25), "actor/grad_norm": math.nan}, step=3)
    log.close()
    silent = MetricsLog(tmp_path / "quiet", loggers=[], print_fn=printed.append)
    silent.log({"critic/score/mean": 0.5}, step=1)

    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record == {"step": 3, "actor/grad_norm": "nan", "critic/score/mean": 0.25}
    assert json.loads((tmp_path / "quiet" / "metrics.jsonl").read_text())["step"] == 1
    assert printed == ["step 3  critic/score/mean=0.25  grad_norm=nan"]


def test_tensorboard_writes_event_files_read_back(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    log = MetricsLog(tmp_path, loggers=["tensorboard"], print_fn=lambda _: None)
    log.log({"critic/score/mean": 0.25, "actor/lr": torch.tensor(1e-6)}, step=1)
    log.log({"critic/score/mean": 0.5, "val-core/gsm8k/reward/mean@1": 0.125}, step=2)
    log.close()

    scalars = _scalars(tmp_path / "tensorboard")
    assert scalars["critic/score/mean"] == [(1, 0.25), (2, 0.5)]
    assert scalars["val-core/gsm8k/reward/mean@1"] == [(2, 0.125)]
    assert scalars["actor/lr"][0][1] == pytest.approx(1e-6)


def test_tensorboard_dir_env_var_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "shared_tb"))
    log = MetricsLog(tmp_path / "run", loggers=["tensorboard"], print_fn=lambda _: None)
    log.log({"critic/score/mean": 1.0}, step=7)
    log.close()
    assert _scalars(tmp_path / "shared_tb")["critic/score/mean"] == [(7, 1.0)]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_missing_wandb_is_a_clear_error_before_any_file_moves(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(ValueError) as err:
        MetricsLog(tmp_path, loggers=["console", "wandb"], print_fn=lambda _: None)
    assert ("trainer.logger includes wandb but the wandb package is not installed: "
            "pip install wandb, or remove it from trainer.logger") in str(err.value)
    assert (tmp_path / "metrics.jsonl").exists()  # the earlier run's file is untouched


def test_unknown_logger_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match="unknown logger 'mlflow'; known loggers: "
                                         "console, jsonl, tensorboard, wandb"):
        MetricsLog(tmp_path, loggers=["mlflow"], print_fn=lambda _: None)


def test_config_check_reports_logger_problems_up_front(monkeypatch):
    """An unknown name is a config error; a missing package is the machine's,
    a doctor row (so a cluster line judged from a laptop keeps its other checks)."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = load_config(recipe_path("tiny"), ["trainer.logger=[console,wandb,mlflow]"])
    with pytest.raises(ValueError) as err:
        validate(cfg)
    assert "unknown logger 'mlflow'" in str(err.value)
    assert "package is not installed" not in str(err.value)
    from thinkrl.doctor import DoctorContext
    from thinkrl.doctor.environment import check_loggers
    from thinkrl.doctor.targets import parse_target

    row = check_loggers(DoctorContext(cfg))
    assert row.status == "fail" and "wandb package is not installed" in row.found + row.fix
    assert check_loggers(DoctorContext(cfg, target=parse_target("h100x8"))).status == "warn"
    from thinkrl.loggers import check_loggers as sinks_check

    with pytest.raises(ValueError, match="wandb package is not installed"):  # still before a run's sinks open
        sinks_check(["wandb"])
    single = load_config(recipe_path("tiny"), ["trainer.logger=tensorboard"])
    assert single.trainer.logger == ["tensorboard"]
    validate(single)


class _FakeWandbRun:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def log(self, data: dict, step: int) -> None:
        self.calls.append(("log", data, step))

    def finish(self) -> None:
        self.calls.append(("finish",))


def test_wandb_gets_project_name_config_and_each_step(tmp_path, monkeypatch):
    calls: list = []
    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", loader=None)

    def init(**kwargs):
        calls.append(("init", kwargs))
        return _FakeWandbRun(calls)
    fake.init = init
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = {"trainer": {"project_name": "gsm8k-grpo", "experiment_name": "qwen-0.5b"},
              "data": {"train_batch_size": 8}}

    log = MetricsLog(tmp_path, loggers=["wandb"], print_fn=lambda _: None, config=config)
    log.log({"critic/score/mean": torch.tensor(0.5), "note": "text is not a scalar"}, step=4)
    log.close()

    run_id = (tmp_path / "wandb_run_id.txt").read_text().strip()
    assert calls == [
        ("init", {"project": "gsm8k-grpo", "name": "qwen-0.5b", "config": config,
                  "id": run_id, "resume": None}),
        ("log", {"critic/score/mean": 0.5}, 4),
        ("finish",),
    ]
    # A resumed run continues the same wandb run; a fresh one starts a new run.
    calls.clear()
    MetricsLog(tmp_path, loggers=["wandb"], print_fn=lambda _: None, config=config).begin(resume_step=4)
    assert calls[0][1]["id"] == run_id and calls[0][1]["resume"] == "allow"
    calls.clear()
    MetricsLog(tmp_path, loggers=["wandb"], print_fn=lambda _: None, config=config).begin()
    assert calls[0][1]["id"] != run_id and calls[0][1]["resume"] is None



def test_console_prints_only_validation_steps_while_the_progress_bar_is_on(tmp_path):
    printed = []
    log = MetricsLog(tmp_path, loggers=["console"], print_fn=printed.append,
                     config={"trainer": {"progress_bar": True}})
    log.begin(resume_step=None)
    log.log({"critic/score/mean": 0.5}, step=1)
    log.log({"critic/score/mean": 0.6, "val-core/x/acc/mean@1": 0.7}, step=2)
    log.close()
    assert len(printed) == 1 and "0.7" in printed[0]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2  # jsonl keeps every step
