"""Checkpoint save and load time and size on the tiny recipe (or any model
via `actor_rollout_ref.model.path=...`).

    .venv/bin/python bench/checkpoint_io.py [--repeats 3] [key=value ...]

One GRPO step runs first so the AdamW moments exist; then `save_checkpoint`
and `load_checkpoint` are each timed `--repeats` times (median printed), and
the files of one checkpoint are listed by size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from thinkrl.build import build_run
from thinkrl.checkpoint.state import load_checkpoint, save_checkpoint
from thinkrl.run import Progress
from thinkrl.commands.common import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train_step

SMALL_STEP = ["trainer.logger=[]", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
              "actor_rollout_ref.actor.ppo_mini_batch_size=8",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    quiet = lambda *_: None  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="thinkrl-ckpt-bench-") as tmp:
        cfg = load_config(recipe_path("tiny"), [f"trainer.default_local_dir={tmp}/run",
                                                *SMALL_STEP, *args.overrides])
        run = build_run(cfg, log=quiet)
        try:
            train_step(run, 1)
            saves, loads = [], []
            for i in range(args.repeats):
                start = time.perf_counter()
                folder = save_checkpoint(run, Progress(step=i + 1), log=quiet)
                saves.append(time.perf_counter() - start)
            for _ in range(args.repeats):
                start = time.perf_counter()
                load_checkpoint(run, folder, log=quiet)
                loads.append(time.perf_counter() - start)
            params = sum(p.numel() for p in run.roles.actor.group.rank.actor.model.parameters())
            files = {p.relative_to(folder).as_posix(): p.stat().st_size
                     for p in Path(folder).rglob("*") if p.is_file()}
        finally:
            run.close()
    print(f"model         {run.spec.model_path} ({params / 1e6:.2f}M parameters)")
    print(f"save          {statistics.median(saves):.3f} s (median of {args.repeats})")
    print(f"load          {statistics.median(loads):.3f} s (median of {args.repeats})")
    print(f"size          {sum(files.values()) / 2**20:.1f} MiB")
    for name, size in sorted(files.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {size / 2**20:9.2f} MiB  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
