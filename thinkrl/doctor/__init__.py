"""`thinkrl doctor`: every check a run can fail before its first step, as a table.

Families, one module each: config, data, model, vision, versions, environment,
disk, memory. Each module lists its checks in `CHECKS`; to add a check, write
`def check_<name>(ctx: DoctorContext) -> CheckResult | list[CheckResult]` in
the right module and append it to that list. To add a family, add a module
with a `CHECKS` list and its name to `FAMILIES`.
"""

from __future__ import annotations

import importlib

from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import Check, CheckResult, has_failure, run_check, run_checks

__all__ = ["FAMILIES", "Check", "CheckResult", "DoctorContext", "NotChecked", "all_checks",
           "diagnose", "has_failure", "run_check", "run_checks"]

FAMILIES = ("config", "data", "model", "vision", "versions", "environment", "disk", "memory")


def all_checks(families: tuple[str, ...] = FAMILIES) -> list[Check]:
    checks: list[Check] = []
    for family in families:
        checks.extend(importlib.import_module(f"thinkrl.doctor.{family}").CHECKS)
    return checks


def diagnose(cfg, *, log=lambda _msg: None, families: tuple[str, ...] = FAMILIES,
             target=None) -> list[CheckResult]:
    """Run every check of `families` on the run `cfg` (judged for `target`, a
    `targets.Target`, when given: not this machine); never raises."""
    ctx = DoctorContext(cfg, log=log, target=target)
    try:  # a built-in model is built here the first time, not inside a timed check
        ctx.model_path
    except NotChecked:
        pass  # model/config reports it
    return run_checks(ctx, all_checks(families))
