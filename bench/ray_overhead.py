"""The ray backend's cost: the same GRPO workload on `local` and on `ray` with 2 ranks.

The workload is bench/grpo_step.py's (8 prompts x 8 samples x 64 tokens, KL
loss on, one optimizer step per step). Each backend builds its own run;
warmup steps are dropped; the table gives the mean seconds of each stage on
both and the difference, then the round trip of an empty call to every rank
(what each stage pays on top of its work) and the start-up time (Ray,
placement, model load and FSDP2 sharding).

    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 python bench/ray_overhead.py
    python bench/ray_overhead.py --ranks 2 --steps 3 trainer.device=cuda   # a GPU node

On a CPU, the ranks split the machine's cores (Ray gives each rank's process
one thread per reserved CPU), so the comparison says what Ray and sharding
cost, not what a second accelerator would gain.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # loopback only, before Ray loads

from grpo_step import PROMPTS, SAMPLES, STAGES, WORKLOAD, summarize  # noqa: E402

from thinkrl.build import build_run  # noqa: E402
from thinkrl.cli import recipe_path  # noqa: E402
from thinkrl.config import load_config  # noqa: E402
from thinkrl.trainer import train_step  # noqa: E402


def measure(overrides: list[str], *, warmup: int, steps: int) -> tuple[dict, float, object]:
    """(summary, start-up seconds, the run): the run is still open (close it)."""
    with tempfile.TemporaryDirectory(prefix="thinkrl-bench-") as run_dir:
        cfg = load_config(recipe_path("tiny"), WORKLOAD + [
            f"trainer.total_training_steps={warmup + steps}", f"trainer.default_local_dir={run_dir}",
            "reward.num_workers=0", *overrides])
        start = time.perf_counter()
        run = build_run(cfg, log=lambda message: print(f"# {message}"))
        built = time.perf_counter() - start
        for step in range(warmup):
            train_step(run, step + 1)
        measured = [train_step(run, warmup + i + 1) for i in range(steps)]
    responses = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    return summarize(measured, responses=responses), built, run


def round_trip_ms(run, calls: int = 20) -> float:
    """Mean milliseconds of an empty call to every rank and back."""
    group = run.roles.actor.group
    group.call_all("bench", "sharding")
    start = time.perf_counter()
    for _ in range(calls):
        group.call_all("bench", "sharding")
    return 1000 * (time.perf_counter() - start) / calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides for both runs")
    args = parser.parse_args(argv)

    local, local_start, run = measure(["trainer.backend=local", *args.overrides],
                                      warmup=args.warmup, steps=args.steps)
    run.close()
    per_rank = PROMPTS * SAMPLES // args.ranks  # the whole batch in one pass, as on one process
    ray_args = ["trainer.backend=ray", f"trainer.n_gpus_per_node={args.ranks}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_rank}", *args.overrides]
    if not any(o.startswith("trainer.device=") for o in args.overrides):
        ray_args.append("trainer.device=cpu")
    sharded, ray_start, run = measure(ray_args, warmup=args.warmup, steps=args.steps)
    trip = round_trip_ms(run)
    run.close()

    print(f"\nworkload: bench/grpo_step.py's, {args.warmup} warmup + {args.steps} measured steps; "
          f"{os.cpu_count()} CPUs")
    print(f"{'stage':<16}{'local s':>9}{f'ray x{args.ranks} s':>12}{'ray - local':>13}")
    for stage in (*STAGES, "other"):
        a, b = local["stages_s"][stage], sharded["stages_s"][stage]
        print(f"{stage:<16}{a:>9.3f}{b:>12.3f}{b - a:>+13.3f}")
    a, b = local["step_s_mean"], sharded["step_s_mean"]
    print(f"{'step':<16}{a:>9.3f}{b:>12.3f}{b - a:>+13.3f}   (ratio {b / a:.2f})")
    print(f"start-up: local {local_start:.1f} s, ray {ray_start:.1f} s")
    print(f"empty call to all {args.ranks} ranks and back: {trip:.2f} ms "
          "(a step makes 3-5 such calls: gen, ref, update_actor, old_log_prob when off-policy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
