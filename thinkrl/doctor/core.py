"""What every doctor check shares: the result type and the runner (the
run's context is `thinkrl.doctor.context`).

A check is a plain function `check(ctx: DoctorContext) -> CheckResult | list[CheckResult]`
listed in the `CHECKS` list of its family module (`thinkrl.doctor.config`,
`.data`, ...). The runner calls each one; a check that raises becomes a
`fail` row naming it, so the doctor itself never crashes. A check that needs
something another check found broken (the model's config, the derived batch
sizes) asks the context for it; the context raises `NotChecked` and the row
says `skip` with the reason, instead of repeating the other check's failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

from thinkrl.doctor.context import DoctorContext, NotChecked

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


Check = Callable[["DoctorContext"], "CheckResult | list[CheckResult]"]


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
