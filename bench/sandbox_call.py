"""Per-call cost of the Python tool's sandbox: seconds for one call of a
small program, in the jail (namespaces, seccomp, Landlock, tmpfs scratch) and
with `unsafe_without_kernel_isolation` (hook, limits and Landlock only).

    .venv/bin/python bench/sandbox_call.py [--calls 40] [--packages]

Prints one JSON line per mode: median and 90th percentile over the calls
(after one warm-up call), and the layers stated at start.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from thinkrl.tools.sandbox import SandboxLimits, run_python, sandbox_layers

PROGRAMS = {"print": "print(6 * 7)", "import_math_json": "import math, json\nprint(json.dumps(math.pi))"}
PACKAGE_PROGRAMS = {"print": "print(6 * 7)", "import_numpy": "import numpy\nprint(numpy.ones(3).sum())",
                    "import_sympy": "import sympy\nprint(sympy.Rational(1, 3) * 3)"}


def measure(limits: SandboxLimits, code: str, calls: int) -> list[float]:
    run_python(code, limits)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        result = run_python(code, limits)
        seconds.append(time.perf_counter() - start)
        assert result.error is None, result.text()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--packages", action="store_true", help="also with numpy and sympy mounted")
    args = parser.parse_args()
    for unsafe in (False, True):
        layers = sandbox_layers(unsafe)
        limits = SandboxLimits(unsafe_without_kernel_isolation=unsafe)
        for name, code in PROGRAMS.items():
            seconds = sorted(measure(limits, code, args.calls))
            print(json.dumps({"mode": "unsafe (no jail)" if unsafe else "jail", "program": name,
                              "calls": args.calls, "median_ms": round(1000 * statistics.median(seconds), 1),
                              "p90_ms": round(1000 * seconds[int(0.9 * len(seconds)) - 1], 1),
                              "layers": layers[:80]}), flush=True)
    if args.packages:
        limits = SandboxLimits(packages=("numpy", "sympy"))
        for name, code in PACKAGE_PROGRAMS.items():
            seconds = sorted(measure(limits, code, args.calls))
            print(json.dumps({"mode": "jail + numpy, sympy mounted", "program": name, "calls": args.calls,
                              "median_ms": round(1000 * statistics.median(seconds), 1),
                              "p90_ms": round(1000 * seconds[int(0.9 * len(seconds)) - 1], 1)}), flush=True)


if __name__ == "__main__":
    main()
