"""Synchronous against asynchronous training on this machine: the tiny recipe
(or any overrides) in each mode, its speed, where each side waits, how stale
its samples are, and the held-out accuracy it reaches after the same steps.

    python bench/async_modes.py [--steps 12] [--seeds 1] [--modes sync one_step_off fully_async streaming]
                                [--workload tiny|longtail] [--validate] [dotted.key=value overrides]

Modes:
- sync: async_training.mode=off (generation and update take turns, 2 threads each);
- one_step_off: the next batch generated with the previous weights while the
  update runs (partial rollout off);
- fully_async: staleness_threshold=1, trigger_parameter_sync_step=1, partial rollout on;
- streaming: fully_async's settings with async_training.streaming=True (the
  rollout process decodes with continuous batching; a batch is the first
  groups to finish).
Workloads: tiny (the tiny recipe as it is) or longtail (the built-in long-tail
task and its model, `thinkrl.data.longtail`: most responses short, one prompt
in seven needing 10-16 steps; responses up to 192 tokens).
Each run is a fresh `thinkrl train` process (its own threads); the first step
(start-up, an empty queue) is left out of the speed columns. With --validate,
greedy held-out accuracy is measured once, after the last step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ACCURACY = "val-core/thinkrl/arith/acc/mean@1"
MODES = {
    "sync": ["async_training.mode=off"],
    "one_step_off": ["async_training.mode=one_step_off", "async_training.partial_rollout=False"],
    "fully_async": ["async_training.mode=fully_async", "async_training.staleness_threshold=1",
                    "async_training.trigger_parameter_sync_step=1", "async_training.partial_rollout=True",
                    "async_training.partial_chunk_tokens=16"],
}
MODES["streaming"] = [*MODES["fully_async"], "async_training.streaming=True"]
WORKLOADS = {
    "tiny": [],
    "longtail": ["actor_rollout_ref.model.path=builtin:tiny-qwen2-longtail",
                 "data.train_files=builtin:longtail/train", "data.val_files=builtin:longtail/test",
                 "data.max_prompt_length=256", "data.max_response_length=192"],
}


def run(mode: str, seed: int, *, steps: int, validate: bool, extra: list[str], folder: Path) -> list[dict]:
    run_dir = folder / f"{mode}-{seed}"
    cmd = [sys.executable, "-m", "thinkrl.cli", "train", "--config", "tiny", "--skip-doctor",
           f"trainer.default_local_dir={run_dir}", f"trainer.total_training_steps={steps}",
           f"trainer.seed={seed}", "trainer.progress_bar=False", "trainer.resume_mode=disable",
           "trainer.save_freq=-1", "trainer.val_before_train=False",
           f"trainer.test_freq={steps if validate else -1}", *MODES[mode], *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    responses = config["data"]["train_batch_size"] * config["actor_rollout_ref"]["rollout"]["n"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{**r, "responses": responses} for r in records]


def summary(records: list[dict]) -> dict[str, float]:
    steps = [r for r in records if "timing_s/step" in r][1:]  # the first step: start-up
    seconds = statistics.median(r["timing_s/step"] for r in steps)
    row = {"s/step": seconds, "samples/s": steps[0]["responses"] / seconds,
           "trainer wait s": statistics.median(r["timing_s/gen"] for r in steps),
           "rollout idle": statistics.median(r.get("fully_async/rollouter/idle_ratio", float("nan"))
                                             for r in steps),
           "staleness": statistics.mean(r.get("fully_async/staleness/mean", 0.0) for r in steps),
           "partial": statistics.mean(r.get("fully_async/partial/partial_ratio", 0.0) for r in steps),
           "resp len": statistics.mean(r["response_length/mean"] for r in steps),
           # forwards to generate a batch: the longest response when it is decoded alone
           "decode steps": statistics.mean(r.get("fully_async/rollouter/decode_steps",
                                                 r["response_length/max"]) for r in steps)}
    accuracy = [r[ACCURACY] for r in records if ACCURACY in r]
    row["val acc"] = accuracy[-1] if accuracy else float("nan")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--workload", default="tiny", choices=list(WORKLOADS))
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("--json", action="store_true", help="also one JSON line per mode and seed")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        rows = {(m, s): summary(run(m, s, steps=args.steps, validate=args.validate,
                                     extra=WORKLOADS[args.workload] + args.overrides, folder=folder))
                for s in args.seeds for m in args.modes}
    columns = list(next(iter(rows.values())))
    print(f"{'mode':<13} {'seed':>4} " + " ".join(f"{c:>14}" for c in columns))
    for (mode, seed), row in rows.items():
        print(f"{mode:<13} {seed:>4} " + " ".join(f"{row[c]:>14.3f}" for c in columns))
        if args.json:
            print(json.dumps({"mode": mode, "seed": seed, "workload": args.workload,
                              **{k: None if v != v else v for k, v in row.items()}}))  # NaN: none
    for mode in args.modes:
        speed = [rows[mode, s]["samples/s"] / rows["sync", s]["samples/s"] for s in args.seeds
                 if ("sync", s) in rows]
        if speed and mode != "sync":
            print(f"{mode}: samples/s vs sync, per seed: {', '.join(f'{x:.2f}x' for x in speed)}")


if __name__ == "__main__":
    main()
