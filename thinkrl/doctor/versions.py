"""Version checks: the installed device stack against `versions.yaml`.

Versions are read from package metadata (`importlib.metadata`), never by
importing vllm, ray or torch_npu; CANN's from its toolkit's install file.
torch_npu is imported only to look for the ops a known-bad build lacks.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources

from thinkrl.doctor.context import DoctorContext, torch_npu_module
from thinkrl.doctor.core import CheckResult, fail, ok, warn

PACKAGES = ("torch", "transformers", "ray", "vllm", "torch_npu", "vllm_ascend")
CANN_INFO_GLOBS = (
    "{root}/ascend_toolkit_install.info",
    "{root}/*-linux/ascend_toolkit_install.info",
    "{root}/version.cfg",
)
CANN_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann",
              "~/Ascend/ascend-toolkit/latest", "~/Ascend/cann")
"""CANN <= 8.3 installs under ascend-toolkit/latest, 8.5 under cann/; the
environment script exports ASCEND_TOOLKIT_HOME / ASCEND_HOME_PATH."""
NPU_OPS = ("_npu_rotary_embedding",)
"""torch_npu ops the NPU stack calls and some builds lack (seed 000, bug 4)."""


@dataclass(frozen=True)
class VersionTable:
    tested: list[dict] = field(default_factory=list)
    """Stacks a test of this repository ran."""
    expected: list[dict] = field(default_factory=list)
    """Stacks others run that thinkrl is written for, never run by its tests."""
    known_bad: list[dict] = field(default_factory=list)


def load_table() -> VersionTable:
    import yaml

    text = (resources.files("thinkrl.doctor") / "versions.yaml").read_text()
    raw = yaml.safe_load(text)
    return VersionTable(tested=raw.get("tested", []), expected=raw.get("expected", []),
                        known_bad=raw.get("known_bad", []))


def installed_versions(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """{package: version} of the stack packages installed here (and "cann")."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    cann = cann_version(os.environ if env is None else env)
    if cann:
        found["cann"] = cann
    return found


def cann_version(env: Mapping[str, str]) -> str | None:
    roots = [env[k] for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(k)] + list(CANN_ROOTS)
    for root in roots:
        for pattern in CANN_INFO_GLOBS:
            for path in sorted(glob.glob(pattern.format(root=os.path.expanduser(root)))):
                with open(path, errors="replace") as f:
                    match = re.search(r"(?mi)^\s*(?:\w+_)?version\s*=\s*\[?([0-9][\w.\-]*)", f.read())
                if match:
                    return match.group(1)
    return None


def matches(version: str, spec: str) -> bool:
    """`version` satisfies `spec`: a prefix ("2.7", whole components only: not
    2.70) or comparisons (">=4.51,<4.54")."""
    version = version.split("+")[0].lower()
    clauses = [c.strip().lower() for c in str(spec).split(",") if c.strip()]
    return all(_clause(version, c) for c in clauses)


def _clause(version: str, clause: str) -> bool:
    op = re.match(r"^(>=|<=|==|!=|>|<)", clause)
    if not op:  # a prefix: "2.7" covers 2.7.1, "0.11.0" covers 0.11.0rc1 and 0.11.0.post1
        rest = version[len(clause):] if version.startswith(clause) else None
        return rest is not None and (rest == "" or rest[0] == "." or rest[0].isalpha())
    from packaging.version import InvalidVersion, Version

    try:
        left, right = Version(version), Version(clause[op.end():].strip())
    except InvalidVersion:
        return False
    return {">=": left >= right, "<=": left <= right, "==": left == right, "!=": left != right,
            ">": left > right, "<": left < right}[op.group(1)]


def _entry_fits(entry: dict, installed: dict[str, str]) -> bool:
    """Every package the entry names that is installed has a matching version,
    and the entry names torch (combinations are anchored on torch)."""
    named = [p for p in entry if p in installed]
    return "torch" in named and all(matches(installed[p], entry[p]) for p in named)


def _stack(ctx: DoctorContext) -> dict[str, str]:
    return ctx.remember("versions", lambda: installed_versions(ctx.env))


def check_stack(ctx: DoctorContext) -> CheckResult:
    """The installed stack is covered by tested combinations, or by expected
    ones (said so: no thinkrl test ran them); anything else warns, never fails."""
    installed, table = _stack(ctx), load_table()
    shown = ", ".join(f"{p} {v}" for p, v in installed.items())
    tested = [e for e in table.tested if _entry_fits(e, installed)]
    expected = [e for e in table.expected if _entry_fits(e, installed)]
    covered = {p for e in tested + expected for p in e if p in installed}
    uncovered = [p for p in installed if p not in covered]
    if not uncovered:
        parts = [f"{kind}: {'; '.join(e['name'] for e in entries)}" for kind, entries in (
            ("tested", tested), ("expected, not run by thinkrl's tests", expected)) if entries]
        return ok("versions/stack", f"{shown} ({'; '.join(parts)})")
    entries = table.tested + table.expected
    same_torch = [e for e in entries if "torch" in installed and "torch" in e
                  and matches(installed["torch"], e["torch"])]
    known = "; ".join(f"{e['name']}: " + ", ".join(f"{p} {e[p]}" for p in e if p in PACKAGES + ("cann",))
                      for e in (same_torch or table.tested)[:3])
    return warn("versions/stack", f"{shown}: no listed combination covers "
                f"{', '.join(f'{p} {installed[p]}' for p in uncovered)}",
                f"it may work; listed: {known} (thinkrl/doctor/versions.yaml)")


def check_known_bad(ctx: DoctorContext) -> list[CheckResult]:
    """Builds named in versions.yaml as broken."""
    installed, results = _stack(ctx), []
    for bad in load_table().known_bad:
        package = bad["package"]
        if package not in installed or not matches(installed[package], bad["version"]):
            continue
        others = bad.get("with", {})
        if all(p in installed and matches(installed[p], spec) for p, spec in others.items()):
            context = "".join(f" with {p} {installed[p]}" for p in others)
            results.append(fail("versions/known-bad", f"{package} {installed[package]}{context}: "
                                f"{bad['reason']}", bad["fix"]))
    return results or [ok("versions/known-bad", "no installed build is listed as broken")]


def check_npu_ops(ctx: DoctorContext) -> CheckResult:
    """The torch_npu build has the ops the NPU stack calls (checked on the
    module itself, whatever its version string says)."""
    module = torch_npu_module()
    if module is None:
        return ok("versions/npu-ops", "torch_npu is not installed (not an NPU machine)")
    version = getattr(module, "__version__", "?")
    missing = [op for op in NPU_OPS if not hasattr(module, op)]
    if missing:
        return fail("versions/npu-ops", f"torch_npu {version} has no {', '.join(missing)} (seed 000: "
                    f"AttributeError: module 'torch_npu' has no attribute '{missing[0]}')",
                    "install a torch_npu build that has it, e.g. torch_npu==2.5.1.dev20250320 for "
                    "torch 2.5.1, matching your CANN")
    return ok("versions/npu-ops", f"torch_npu {version} has {', '.join(NPU_OPS)}")


CHECKS = [check_stack, check_known_bad, check_npu_ops]
