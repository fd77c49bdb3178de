"""Held-out accuracy of the tiny recipe after the same number of steps, per algorithm.

    .venv/bin/python bench/algorithms.py [--steps 40] [--recipes tiny rloo reinforce_plus_plus dapo ppo]
                                         [key=value ...]

Each recipe (`thinkrl/recipes/<name>.yaml`; `tiny` is GRPO) trains `--steps`
steps from the same built-in tiny model with the same seed, validates before
the first step and after the last (greedy decoding on the built-in arithmetic
test set), and the script prints one markdown row per recipe: accuracy and
mean reward before and after, the last step's training score and the wall time.
One seed each: differences of a few points are noise.

DAPO's dynamic sampling generates more prompts per step than the others (see
its `train/num_gen_batches` column), so at equal steps it has seen more data.
PPO (`ppo`, adv_estimator=gae) also trains its critic each step, which costs
about one more forward and backward pass over the step's responses.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from thinkrl.commands.common import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

DEFAULT_RECIPES = ["tiny", "rloo", "reinforce_plus_plus", "dapo", "ppo"]
ACC = "val-core/thinkrl/arith/acc/mean@1"
REWARD = "val-core/thinkrl/arith/reward/mean@1"


def run_recipe(name: str, *, steps: int, overrides: list[str], folder: Path) -> dict:
    cfg = load_config(recipe_path(name), [
        f"trainer.default_local_dir={folder / name}", f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1", "trainer.val_before_train=True", "trainer.save_freq=-1",
        "trainer.logger=[]", "trainer.progress_bar=False", *overrides])
    start = time.perf_counter()
    result = train(cfg, log=lambda *_: None)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    gen_batches = [r["train/num_gen_batches"] for r in records if "train/num_gen_batches" in r]
    return {"recipe": name, "estimator": cfg.algorithm.adv_estimator,
            "acc_before": result.first_val[ACC], "acc_after": result.last_val[ACC],
            "reward_before": result.first_val[REWARD], "reward_after": result.last_val[REWARD],
            "train_score_last": last["critic/score/mean"],
            "gen_batches": sum(gen_batches) / len(gen_batches) if gen_batches else 1.0,
            "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--recipes", nargs="+", default=DEFAULT_RECIPES)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    print(f"| recipe | adv_estimator | val acc before | val acc after {args.steps} steps | val reward after "
          "| train score, last step | generation batches per step | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="thinkrl-algo-bench-") as tmp:
        for name in args.recipes:
            r = run_recipe(name, steps=args.steps, overrides=args.overrides, folder=Path(tmp))
            print(f"| {r['recipe']} | {r['estimator']} | {r['acc_before']:.3f} | {r['acc_after']:.3f} "
                  f"| {r['reward_after']:.3f} | {r['train_score_last']:.3f} | {r['gen_batches']:.2f} "
                  f"| {r['seconds']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
