"""What every doctor check shares: the result type, the run's context, the runner.

A check is a plain function `check(ctx: DoctorContext) -> CheckResult | list[CheckResult]`
listed in the `CHECKS` list of its family module (`thinkrl.doctor.config`,
`.data`, ...). The runner calls each one; a check that raises becomes a
`fail` row naming it, so the doctor itself never crashes. A check that needs
something another check found broken (the model's config, the derived batch
sizes) asks the context for it; the context raises `NotChecked` and the row
says `skip` with the reason, instead of repeating the other check's failure.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from thinkrl.config.schema import Config

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of the doctor's table."""

    check: str
    """Family and name, e.g. "disk/checkpoints"."""
    status: Status
    """ok: fine; warn: may cause trouble; fail: the run would fail; skip: not checked (see found)."""
    found: str
    """What the check saw, with the numbers."""
    fix: str = ""
    """What to do about it (empty when there is nothing to do)."""

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def ok(check: str, found: str) -> CheckResult:
    return CheckResult(check, "ok", found)


def warn(check: str, found: str, fix: str) -> CheckResult:
    return CheckResult(check, "warn", found, fix)


def fail(check: str, found: str, fix: str) -> CheckResult:
    return CheckResult(check, "fail", found, fix)


class NotChecked(Exception):
    """Raised by a context property whose input is broken; the runner turns it
    into a `skip` row carrying this message."""


Check = Callable[["DoctorContext"], "CheckResult | list[CheckResult]"]


@dataclass
class DoctorContext:
    """One run's config and what the checks share, each computed once on
    first use (loading the tokenizer serves the model, data and memory checks)."""

    cfg: Config
    log: Callable[[str], None] = field(default=lambda _msg: None)
    """Where progress notes go (building a built-in asset, ...)."""
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    """Environment variables (a mapping, so tests can pass their own)."""
    memo: dict[str, Any] = field(default_factory=dict)
    """What one check computed for others (see `remember`), by name."""

    def remember(self, key: str, compute: Callable[[], Any]) -> Any:
        """`compute()` once per context; a NotChecked it raises is raised again
        on every later call, so every dependent check skips with the reason."""
        if key not in self.memo:
            try:
                self.memo[key] = compute()
            except NotChecked as why:
                self.memo[key] = why
        value = self.memo[key]
        if isinstance(value, NotChecked):
            raise NotChecked(str(value))
        return value

    @functools.cached_property
    def sizes(self):
        """The derived per-device sizes (`config.checks.validate`)."""
        from thinkrl.config import validate

        try:
            return validate(self.cfg)
        except ValueError:
            raise NotChecked("needs valid batch sizes: see config/validate") from None

    @functools.cached_property
    def model_path(self) -> str:
        """actor_rollout_ref.model.path with a `builtin:` name resolved to its folder."""
        from thinkrl import builtin

        try:
            return builtin.resolve_model_path(self.cfg.actor_rollout_ref.model.path, log=self.log)
        except ValueError as err:
            raise NotChecked(f"needs the model: {err}") from None

    @functools.cached_property
    def model_config(self):
        """The model's Hugging Face config (config.json only, no weights)."""
        from thinkrl.doctor.model import load_model_config

        return load_model_config(self)

    @functools.cached_property
    def tokenizer(self):
        """The run's tokenizer, loaded as `thinkrl.build` loads it."""
        from thinkrl.doctor.model import load_run_tokenizer

        return load_run_tokenizer(self)

    @functools.cached_property
    def param_count(self) -> int:
        from thinkrl.doctor.model import estimate_param_count

        return estimate_param_count(self.model_config)

    @functools.cached_property
    def device_kind(self) -> str:
        """"cpu", "cuda" or "npu": trainer.device, with `auto` decided as
        `thinkrl.parallel.device.resolve_device` decides it."""
        from thinkrl.doctor.environment import detect_device_kind

        return detect_device_kind(self)


def run_check(check: Check, ctx: DoctorContext) -> list[CheckResult]:
    """Call one check; exceptions become rows (never propagate)."""
    name = check_name(check)
    try:
        out = check(ctx)
    except NotChecked as why:
        return [CheckResult(name, "skip", str(why))]
    except Exception as err:  # a doctor that crashes helps nobody: report and go on
        return [fail(name, f"the check itself raised {type(err).__name__}: {err}",
                     "this is a bug in thinkrl's doctor; please report it with this row")]
    return [out] if isinstance(out, CheckResult) else list(out)


def check_name(check: Check) -> str:
    """"family/name" from the function `thinkrl.doctor.<family>.check_<name>`."""
    family = check.__module__.rsplit(".", 1)[-1]
    name = check.__name__.removeprefix("check_").replace("_", "-")
    return f"{family}/{name}"


def run_checks(ctx: DoctorContext, checks: list[Check]) -> list[CheckResult]:
    results: list[CheckResult] = []
    for check in checks:
        start = time.perf_counter()
        results.extend(run_check(check, ctx))
        elapsed = time.perf_counter() - start
        if elapsed > 2:
            ctx.log(f"doctor: {check_name(check)} took {elapsed:.1f} s")
    return results


def has_failure(results: list[CheckResult]) -> bool:
    return any(r.status == "fail" for r in results)


def gib(n_bytes: float) -> str:
    """Bytes as a short human string (GiB, or MiB below 1 GiB)."""
    if abs(n_bytes) >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    return f"{n_bytes / 2**20:.0f} MiB"
