"""Do tools help? The calculator recipe trained with its calculator and
without it (the same model, data and steps), on several seeds; greedy
held-out accuracy before training and after the last step.

    python bench/calculator_tools.py [--steps 20] [--seeds 1 2 3] [dotted.key=value ...]

Each run is a fresh `thinkrl train --config calculator` process. Without tools
(multi_turn.enable=False) a call the model writes gets no answer and the
response ends there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ACCURACY = "val-core/thinkrl/calc/acc/mean@1"
ARMS = {"tools": [], "no tools": ["actor_rollout_ref.rollout.multi_turn.enable=False"]}


def run(arm: str, seed: int, *, steps: int, extra: list[str], folder: Path) -> dict[str, float]:
    run_dir = folder / f"{arm.replace(' ', '_')}-{seed}"
    thinkrl = Path(sys.executable).with_name("thinkrl")
    subprocess.run([str(thinkrl), "train", "--config", "calculator", "--skip-doctor",
                    f"trainer.default_local_dir={run_dir}", f"trainer.total_training_steps={steps}",
                    f"trainer.seed={seed}", "trainer.progress_bar=False", "trainer.resume_mode=disable",
                    "trainer.save_freq=-1", "trainer.val_before_train=True", f"trainer.test_freq={steps}",
                    *ARMS[arm], *extra], check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = [r[ACCURACY] for r in rows if ACCURACY in r]
    trained = [r for r in rows if "timing_s/step" in r]
    return {"acc before": accuracy[0], "acc after": accuracy[-1],
            "tool calls/resp": trained[-1].get("multi_turn/tool_calls/mean", float("nan")),
            "train score": trained[-1]["critic/score/mean"],
            "s/step": statistics.median(r["timing_s/step"] for r in trained)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        rows = {(arm, seed): run(arm, seed, steps=args.steps, extra=args.overrides, folder=folder)
                for seed in args.seeds for arm in ARMS}
    columns = list(next(iter(rows.values())))
    print(f"{'arm':<9} {'seed':>4} " + " ".join(f"{c:>16}" for c in columns))
    for (arm, seed), row in rows.items():
        print(f"{arm:<9} {seed:>4} " + " ".join(f"{row[c]:>16.3f}" for c in columns))
    for arm in ARMS:
        after = [rows[arm, s]["acc after"] for s in args.seeds]
        print(f"{arm}: held-out accuracy after {args.steps} steps {min(after):.3f}-{max(after):.3f} "
              f"(mean {statistics.mean(after):.3f}, {len(after)} seeds)")


if __name__ == "__main__":
    main()
