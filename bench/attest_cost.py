"""What the weight-sync attestation costs: the tiny recipe on vLLM's CPU build,
seconds per step of hashing (both sides: the trainer's sent tensors and the
engine's served ones, read back through its kernels) against the whole step.

    .venv-vllm/bin/python bench/attest_cost.py [--steps 8] [--dtype auto|bfloat16]

Prints, per step and as medians: timing_s/weight_attest, timing_s/update_weights
(the sync it is part of) and timing_s/step, and the attestation's share of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--dtype", default="auto", help="actor_rollout_ref.rollout.dtype")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from thinkrl.config import load_config
    from thinkrl.trainer import train

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cfg = load_config("tiny", [
            "actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.dtype={args.dtype}",
            f"trainer.total_training_steps={args.steps}", f"trainer.default_local_dir={run_dir}",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.progress_bar=False", "trainer.logger=[console]"])
        train(cfg, log=lambda *_: None)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rows = [r for r in rows if "timing_s/weight_attest" in r]
    print(f"{'step':>4} {'attest s':>9} {'sync s':>8} {'step s':>7} {'share':>7}")
    for r in rows:
        print(f"{r['step']:>4} {r['timing_s/weight_attest']:9.4f} {r['timing_s/update_weights']:8.4f} "
              f"{r['timing_s/step']:7.3f} {r['timing_s/weight_attest'] / r['timing_s/step']:7.2%}")
    attest = statistics.median(r["timing_s/weight_attest"] for r in rows)
    step = statistics.median(r["timing_s/step"] for r in rows)
    print(f"median: attest {attest:.4f} s of a {step:.3f} s step = {attest / step:.2%}")


if __name__ == "__main__":
    main()
