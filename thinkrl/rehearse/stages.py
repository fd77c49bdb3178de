"""The stages of a rehearsal, in the order a cluster run meets them.

Each stage is a method of `Rehearsal` that returns what it found (a line) or
raises: `StageFailed` (found, fix) for what the run would fail on, a
`StageWarning` for what would go on but needs a look, any `ValueError` of
thinkrl's own checks (a user's mistake: its message and fix), anything else
(an unexpected failure: its traceback goes to `<workdir>/rehearsal.log`).
A failed stage that later stages need stops the rehearsal there; the rest
are listed as not run.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

from thinkrl.config.schema import Config
from thinkrl.doctor.core import CheckResult
from thinkrl.errors import UserError, problem_and_fix
from thinkrl.metrics import read_metrics
from thinkrl.rehearse.errors import StageFailed, StageWarning
from thinkrl.rehearse.plan import (DataSample, Layout, RunArgs, data_overrides, layout_overrides,
                                   local_loggers, model_overrides, rehearsal_layout,
                                   response_overrides, run_overrides, sample_rows, shrunk_batch)

STEPS = 2
"""Steps of the first run; the resume stage continues it to STEPS + 1."""
GOLD_ROWS = 16
"""Rows whose gold answers the reward stage scores."""
EVAL_ROWS = 8
"""Validation rows the eval stage generates for."""
TRAIN_ROWS = 256
"""Train rows sampled (spread over the train files)."""
DEVICE_BOUND = ("config/devices", "versions/", "environment/", "disk/", "memory/")
"""Doctor checks about the cluster's devices, software and disks: not judged here."""
CLUSTER_FAMILIES = ("config", "versions", "environment", "disk")
"""The doctor's families asked about the real config for the cluster's list
(its memory at full size is the projection's)."""
LEFT_TO_THE_CLUSTER = ("RAY_ADDRESS", "TENSORBOARD_DIR")
"""Variables that would send a rehearsal to the cluster's Ray or its event folder."""

Status = Literal["passed", "warned", "failed", "not run"]


@dataclass(frozen=True)
class StageResult:
    stage: str
    status: Status
    seconds: float
    found: str
    fix: str = ""


@dataclass
class Rehearsal:
    """One rehearsal of the run `args`, working in `workdir` only."""

    args: RunArgs
    workdir: Path
    log: Callable[[str], None] = print
    results: list[StageResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the rehearsal changed of the layout or skipped, and why."""
    not_rehearsed: list[CheckResult] = field(default_factory=list)
    """The doctor's rows for the cluster (CheckResult), judged there, not here."""
    real: Config | None = None
    layout: Layout | None = None
    base: list[str] = field(default_factory=list)
    """The overrides every rehearsal run adds to the real arguments."""
    sample: DataSample | None = None
    prompt_tokens: list[int] = field(default_factory=list)
    step_metrics: list[dict] = field(default_factory=list)

    # --- running ---------------------------------------------------------------
    STAGES = ("config", "doctor", "model", "data", "reward", "train", "resume", "export", "eval")
    NEEDED_BY_LATER = ("config", "doctor", "model", "data", "train", "resume", "export")
    """A failure of these stops the rehearsal (the reward stage's does not:
    training then shows how the run fails with that reward)."""

    def run(self) -> list[StageResult]:
        self.workdir = self.workdir.expanduser().resolve()  # Ray workers run elsewhere
        self.refuse_real_run_dir()
        self.workdir.mkdir(parents=True, exist_ok=True)
        with without_variables(LEFT_TO_THE_CLUSTER):
            self._run_stages()
        return self.results

    def _run_stages(self) -> None:
        for i, name in enumerate(self.STAGES):
            result = self._timed(name, getattr(self, f"stage_{name}"))
            self.results.append(result)
            self.log(f"rehearse: {name}: {result.status} ({result.seconds:.1f} s) {result.found}")
            if result.status == "failed" and name in self.NEEDED_BY_LATER:
                self.results += [StageResult(later, "not run", 0.0, f"after the {name} stage failed")
                                 for later in self.STAGES[i + 1:]]
                break

    def refuse_real_run_dir(self) -> None:
        """ValueError when the work folder is the real run's folder or inside it."""
        try:
            real = Path(self.args.load().trainer.default_local_dir).expanduser().resolve()
        except ValueError:
            return  # the config stage reports it
        work = self.workdir
        if work == real or real in work.parents:
            raise UserError(f"--workdir {self.workdir} is inside the run's own folder {real} "
                             "(trainer.default_local_dir): a rehearsal never writes there; give "
                             "another folder")

    def _timed(self, name: str, stage: Callable[[], str]) -> StageResult:
        start = time.perf_counter()
        try:
            found, status, fix = stage(), "passed", ""
        except StageWarning as err:
            (found, fix), status = problem_and_fix(err), "warned"
        except Exception as err:  # noqa: BLE001 - every failure is a finding
            from thinkrl.exits import is_user_error

            self.write_log(f"stage {name}:\n{traceback.format_exc()}")
            status = "failed"
            if is_user_error(err):  # thinkrl's own checks: the user's mistake, with its fix
                found, fix = problem_and_fix(err)
            else:
                found = f"{type(err).__name__}: {err}"
                fix = f"the traceback is in {self.workdir / 'rehearsal.log'}"
        return StageResult(name, status, time.perf_counter() - start, found, fix)

    def write_log(self, text: str) -> None:
        with open(self.workdir / "rehearsal.log", "a") as f:
            f.write(text.rstrip("\n") + "\n")

    def load(self, extra: list[str] = ()) -> Config:
        """The real arguments + the rehearsal's overrides + `extra`."""
        return self.args.load([*self.base, *extra])

    @property
    def run_dir(self) -> Path:
        return self.workdir / "run"

    # --- the stages --------------------------------------------------------------
    def stage_config(self) -> str:
        from thinkrl.config.checks import validate

        self.real = self.args.load(log=self.write_log)
        sizes = validate(self.real)
        self.layout = rehearsal_layout(self.real, vision=names_a_vision_tower(self.real))
        loggers, logger_note = local_loggers(self.real)
        self.base = [*layout_overrides(self.layout), *loggers]
        responses, response_note = response_overrides(self.args, self.real, self.base)
        self.base += responses
        self.notes += [*self.layout.notes, *filter(None, (logger_note, response_note))]
        if self.real.actor_rollout_ref.rollout.multi_turn.enable:
            self.notes.append("rollout.multi_turn: the tools load (the doctor's data/tools row), "
                              "but a random model writes no tool call, so no tool ran")
        return (f"{sizes.world_size} device(s), {sizes.prompts_per_step} prompts x "
                f"{sizes.responses_per_prompt} per step, {sizes.mini_batches_per_step} mini-batch(es)"
                f", micro-batch {sizes.micro_batch_size_per_device} per device")

    def stage_doctor(self) -> str:
        """The doctor's checks on the run as rehearsed here (this machine's
        CPU and engine), the real layout's own parallel checks, and, listed
        apart, the checks only the cluster can answer."""
        from thinkrl.commands.doctor import mindspeed_results
        from thinkrl.doctor import diagnose
        from thinkrl.doctor.report import listing
        from thinkrl.rehearse.checks import real_layout_rows

        here = self.load()
        rows = [*mindspeed_results(self.args.config, here), *diagnose(here, log=self.write_log)]
        judged = [r for r in rows if not r.check.startswith(DEVICE_BOUND)] + real_layout_rows(self.real)
        self.not_rehearsed = [r for r in diagnose(self.real, families=CLUSTER_FAMILIES)
                              if r.check.startswith(DEVICE_BOUND)]
        failed = [r for r in judged if r.status == "fail"]
        if failed:
            raise StageFailed(f"{len(failed)} check(s) fail:\n{listing(failed)}",
                              "each row says its fix (`thinkrl doctor` with the same arguments "
                              "shows them all)")
        warned = [r for r in judged if r.status == "warn"]
        if warned:
            raise StageWarning(f"{len(judged) - len(warned)} of {len(judged)} checks ok; "
                               f"{len(warned)} warn:\n{listing(warned)}", "see each row")
        return f"{len(judged)} checks ok ({len(self.not_rehearsed)} about the cluster: see below)"

    def stage_model(self) -> str:
        from thinkrl.builtin import resolve_model_path
        from thinkrl.rehearse.shrink import ShrinkSpec, build_shrunk_model

        model = self.real.actor_rollout_ref.model
        real_path = resolve_model_path(model.path, log=self.write_log)
        # vLLM's CPU attention takes head_dim 32 and up; the native engine any (16 halves the work)
        spec = ShrinkSpec(head_dim=32 if self.layout.engine == "vllm" else 16)
        shrunk = build_shrunk_model(real_path, self.workdir / "model", spec=spec,
                                    tensor_parallel=self.layout.tensor_parallel,
                                    trust_remote_code=model.trust_remote_code)
        keys, notes = model_overrides(self.real, shrunk.path)
        self.base += keys
        self.notes += notes
        return (f"{shrunk.architecture}, {shrunk.parameters / 1e6:.1f}M parameters, random weights "
                f"({shrunk.summary}); vocabulary, special tokens, rotary and template kept")

    def stage_data(self) -> str:
        from thinkrl.builtin import resolve_data_files
        from thinkrl.data.files import resolve_files
        from thinkrl.rehearse.checks import check_image_paths, loaded_prompts

        data = self.real.data
        files = {key: resolve_files(resolve_data_files(getattr(data, key), log=self.write_log),
                                    key=f"data.{key}") for key in ("train_files", "val_files")}
        missing = check_image_paths(files["train_files"] + files["val_files"], image_key=data.image_key)
        if missing:
            raise StageFailed(missing, f"make every image path of data.{data.image_key} readable "
                                       "from where the run starts (or store the images' bytes)")
        seed = self.real.trainer.seed
        train = sample_rows(files["train_files"], self.workdir / "data" / "train", rows=TRAIN_ROWS,
                            seed=seed)
        val = sample_rows(files["val_files"], self.workdir / "data" / "val", rows=EVAL_ROWS, seed=seed)
        self.sample = DataSample(train.files + val.files, {**train.origin, **val.origin})
        self.base += data_overrides(train.files, val.files)
        sizes, note = shrunk_batch(self.args, self.real, self.base)
        self.base += sizes
        self.notes += [note] if note else []
        cfg = self.load()
        prompts = loaded_prompts(cfg, key="train_files")
        self.prompt_tokens = [len(p.ids) for p in prompts]
        loaded_prompts(cfg, key="val_files")
        rows = sum(len(rows) for _, rows in train.origin.values())
        return (f"{rows} train rows sampled over {len(files['train_files'])} file(s), rendered with "
                f"data.template={data.template} and the real tokenizer: prompts "
                f"{min(self.prompt_tokens)}-{max(self.prompt_tokens)} tokens "
                f"(mean {sum(self.prompt_tokens) / len(self.prompt_tokens):.0f})")

    def stage_reward(self) -> str:
        from thinkrl.rehearse.checks import gold_finding

        return gold_finding(self.load(), self.sample, rows=GOLD_ROWS)

    def stage_train(self) -> str:
        from thinkrl.errors import RunStopped
        from thinkrl.rehearse.checks import kept_reward_warnings, response_reward_failure
        from thinkrl.trainer import train

        cfg = self.load(run_overrides(self.run_dir, steps=STEPS, save_freq=STEPS, resume_mode="disable"))
        with kept_reward_warnings() as reasons:
            try:
                train(cfg, log=self.write_log)
            except RunStopped as err:  # a guard stopped it: the reward breaker, NaN weights, ...
                raise StageFailed(f"the run stopped itself: {err}", "see the message") from None
        self.step_metrics = read_metrics(self.run_dir)
        failure = response_reward_failure(self.step_metrics, reasons.messages, self.sample,
                                          [Path(f) for f in cfg.data.train_files])
        if failure is not None:
            raise StageFailed(*failure)
        seconds = [m.get("timing_s/step", 0.0) for m in self.step_metrics]
        return (f"{len(self.step_metrics)} steps ({', '.join(f'{s:.1f}' for s in seconds)} s), "
                f"checkpoint global_step_{STEPS} written")

    def stage_resume(self) -> str:
        from thinkrl.rehearse.checks import resume_from_checkpoint

        trainer = self.real.trainer
        extra = run_overrides(self.run_dir, steps=STEPS + 1, save_freq=STEPS + 1,
                              resume_mode=trainer.resume_mode)
        if trainer.resume_mode == "resume_path":  # the cluster's path: the rehearsal's own checkpoint
            extra.append(f"trainer.resume_from_path={self.run_dir / f'global_step_{STEPS}'}")
        found = resume_from_checkpoint(self.load(extra), expect=STEPS, log=self.write_log)
        self.step_metrics = read_metrics(self.run_dir)
        if trainer.save_freq <= 0:
            raise StageWarning(found + f"; but the real run saves no checkpoint (trainer.save_freq="
                               f"{trainer.save_freq}): a crash on the cluster loses every step",
                               "set trainer.save_freq=N (steps between checkpoints)")
        return found

    def stage_export(self) -> str:
        from thinkrl.checkpoint.export import export_checkpoint
        from thinkrl.rehearse.checks import check_exported

        adapter = self.real.actor_rollout_ref.model.lora_rank > 0  # merged: a model eval can load
        out = export_checkpoint(self.run_dir, self.workdir / "export", merge=adapter,
                                log=self.write_log)
        return check_exported(out, like=self.workdir / "model")

    def stage_eval(self) -> str:
        from thinkrl.commands.eval import run_eval

        cfg = self.load([f"actor_rollout_ref.model.path={self.workdir / 'export'}",
                         "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                         "actor_rollout_ref.rollout.val_kwargs.n=1",
                         "actor_rollout_ref.rollout.val_kwargs.do_sample=False"])
        result, _ = run_eval(cfg, log=self.write_log)
        accuracy = ", ".join(f"{k} {v:.2f}" for k, v in sorted(result.metrics().items()) if "/acc/" in k)
        return (f"the exported model answered {len(result.generations) // result.n} sampled "
                f"validation prompts ({accuracy or 'no accuracy metric'}; random weights score ~0)")


@contextlib.contextmanager
def without_variables(names: tuple[str, ...]):
    """Within the block these environment variables are unset (restored after)."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def names_a_vision_tower(cfg: Config) -> bool:
    """The model's config.json names a vision tower (False when it does not
    load: the doctor's model rows say why)."""
    from thinkrl.doctor import DoctorContext, NotChecked

    try:
        return getattr(DoctorContext(cfg).model_config, "vision_config", None) is not None
    except NotChecked:
        return False
