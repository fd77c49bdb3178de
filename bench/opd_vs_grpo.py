"""On-policy distillation against GRPO from the same student on the same data.

    python bench/opd_vs_grpo.py --seeds 1 2 3 [--out /tmp/opd_vs_grpo] [--test-freq 2] [--steps 12]

Runs `thinkrl train --config opd` (pure OPD from the built-in GRPO-made
teacher) and `thinkrl train --config smol` (GRPO, the recipe that made the
teacher) from SmolLM2-135M-Instruct for each seed, one after another, with
validation every --test-freq steps, then prints one row per run: held-out
greedy accuracy at each validation, the first step at or above 90 % of the
teacher's held-out accuracy (read from the teacher's PROVENANCE.json), the
training seconds to get there (the steps' own time, validation excluded)
and the whole run's wall time. A run already in --out is read, not rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ACCURACY = "val-core/thinkrl/arith/acc/mean@1"
ARMS = {"opd": "opd", "grpo": "smol"}


def run(arm: str, seed: int, out: Path, *, test_freq: int, steps: int) -> float:
    """Train one arm (in a fresh process); its wall seconds (0 when it was there)."""
    run_dir = out / f"{arm}-seed{seed}"
    if (run_dir / "done").exists():
        return float((run_dir / "done").read_text())
    thinkrl = Path(sys.executable).with_name("thinkrl")
    command = [str(thinkrl), "train", "--config", ARMS[arm], f"trainer.seed={seed}",
               f"trainer.test_freq={test_freq}", f"trainer.total_training_steps={steps}",
               "trainer.save_freq=-1", "trainer.progress_bar=False", f"trainer.default_local_dir={run_dir}"]
    start = time.perf_counter()
    with open(out / f"{arm}-seed{seed}.log", "w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    (run_dir / "done").write_text(f"{wall:.1f}")
    return wall


def teacher_accuracy() -> float:
    """The built-in teacher's held-out accuracy after its GRPO (its provenance)."""
    from thinkrl.builtin import cache_dir
    from thinkrl.models.smollm2 import GGUF_SHA256
    from thinkrl.models.sums_teacher import teacher_folder

    provenance = json.loads((teacher_folder(cache_dir(), GGUF_SHA256[:12]) / "PROVENANCE.json").read_text())
    return provenance["held_out_after"][ACCURACY]


def row(arm: str, seed: int, out: Path, wall: float, target: float) -> str:
    records = [json.loads(line) for line in (out / f"{arm}-seed{seed}" / "metrics.jsonl").read_text().splitlines()]
    accuracy = {r["step"]: r[ACCURACY] for r in records if ACCURACY in r}
    seconds, reached = 0.0, None
    for r in records:
        seconds += r.get("timing_s/step", 0.0)
        if reached is None and r["step"] > 0 and accuracy.get(r["step"], -1) >= target:
            reached = (r["step"], seconds)
    shown = " | ".join(f"{accuracy[s]:.3f}" for s in sorted(accuracy))
    when = f"{reached[0]} | {reached[1]:.0f} s" if reached else "not reached | -"
    return f"| {arm} | {seed} | {shown} | {when} | {wall:.0f} s |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("/tmp/opd_vs_grpo"))
    parser.add_argument("--test-freq", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    walls = {(arm, seed): run(arm, seed, args.out, test_freq=args.test_freq, steps=args.steps)
             for seed in args.seeds for arm in ARMS}
    teacher = teacher_accuracy()
    target = 0.9 * teacher
    print(f"teacher (builtin:smollm2-135m-sums-teacher) held-out accuracy {teacher:.3f}; "
          f"90 % of it: {target:.3f}")
    steps = list(range(0, args.steps + 1, args.test_freq))
    print(f"| arm | seed | {' | '.join(f'step {s}' for s in steps)} | first step >= 90 % | training s to it "
          "| wall |")
    print("|---|---|" + "---|" * (len(steps) + 3))
    for (arm, seed), wall in walls.items():
        print(row(arm, seed, args.out, wall, target))


if __name__ == "__main__":
    main()
