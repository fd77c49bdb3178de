"""Time `thinkrl doctor` on the default tiny recipe (the issue's budget: < 5 s).

    python bench/doctor_speed.py              # 3 runs
    python bench/doctor_speed.py --runs 5

Measures the whole command (wall time, and CPU time, which a busy machine
does not inflate) in a fresh interpreter (imports included: what a
user waits for), then the checks alone in this process (imports done). The
built-in tiny model must already be cached (a previous `thinkrl train` or
`thinkrl doctor` builds it into $THINKRL_CACHE, default ~/.cache/thinkrl);
if it is not, this script builds it first and does not time that.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from thinkrl import builtin
    builtin.resolve_model_path("builtin:tiny-qwen2")  # cached: instant; else built, untimed
    builtin.resolve_data_files(["builtin:arith/train"])

    command = [sys.executable, "-m", "thinkrl", "doctor"]
    walls, cpus, code = [], [], None
    for _ in range(args.runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        code = done.returncode
        if code != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
    from thinkrl.commands.common import recipe_path
    from thinkrl.config import load_config
    from thinkrl.doctor import diagnose

    cfg = load_config(recipe_path("tiny"), [])
    start = time.perf_counter()
    diagnose(cfg)  # the first call pays for torch, transformers, math-verify imports
    first = time.perf_counter() - start
    start = time.perf_counter()
    results = diagnose(cfg)
    in_process = time.perf_counter() - start
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {load:.1f}")
    print(f"`thinkrl doctor` (tiny recipe, fresh process): median {statistics.median(walls):.2f} s, "
          f"min {min(walls):.2f} s over {args.runs} runs; CPU time (user + sys) median "
          f"{statistics.median(cpus):.2f} s (the wall time on an idle machine); exit code {code}")
    print(f"in this process: first call {first:.2f} s (with imports), "
          f"second call {in_process:.2f} s (the checks alone); {len(results)} rows, "
          f"{sum(r.status == 'fail' for r in results)} fail")


if __name__ == "__main__":
    main()
