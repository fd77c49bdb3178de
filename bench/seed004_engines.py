"""Seconds per step of seed 004's launch line on a tiny Qwen2.5-VL, 2 Ray
ranks on the CPU: the native engine against vLLM at TP 2 (and TP 1).

The seed's line as written, then only what points it at this machine: the
GSM8K rows of ../shared/data/gsm8k (prepared by `thinkrl prep gsm8k`), a
tiny Qwen2.5-VL built from a config (hidden 128: vLLM's CPU attention needs
head size >= 32; the real Qwen2.5 tokenizer), `trainer.device=cpu`,
`n_gpus_per_node=2`, 8 prompts x 4 responses of at most 32 tokens.
Each engine runs `--steps` steps; the first step (engine start-up, first
compilations) is left out of the median. vLLM's Qwen2-VL needs torchvision,
so run it where torchvision imports (docs/benchmarks.md):

    python bench/seed004_engines.py [--steps 4] [--engines native,vllm-tp2,vllm-tp1]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import tempfile
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
STAGES = ("gen", "old_log_prob", "ref", "update_actor", "update_weights")


def seed_004_line() -> list[str]:
    text = next(iter(sorted((SHARED / "seeds").glob("004_*.txt")))).read_text()
    line = text.split("python3 -m verl.trainer.main_ppo", 1)[1].split("$@", 1)[0]
    return shlex.split(re.sub(r"\\\s*\n", " ", line).replace("$ENGINE", "vllm"))


def engine_overrides(engine: str) -> list[str]:
    if engine == "native":
        return ["actor_rollout_ref.rollout.name=native"]
    tp = engine.removeprefix("vllm-tp")
    return ["actor_rollout_ref.rollout.name=vllm", f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            "actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.rollout.enforce_eager=True"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--engines", default="native,vllm-tp2,vllm-tp1")
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    from thinkrl.config import load_config
    from thinkrl.data.prep import PrepRequest, prepare
    from thinkrl.models.tiny_vl import TinyVLSpec, build_tiny_vl
    from thinkrl.trainer import train

    work = Path(tempfile.mkdtemp(prefix="seed004-engines-"))
    model = build_tiny_vl(work / "tiny-vl", tokenizer_dir=SHARED / "data/tokenizers/qwen2.5",
                          spec=TinyVLSpec(hidden_size=128))
    raw = work / "gsm8k-raw"
    raw.mkdir()
    for split, rows in (("train", 64), ("test", 8)):
        lines = (SHARED / "data/gsm8k" / f"{split}.jsonl").read_text().splitlines()[:rows]
        (raw / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    data = {w.split: w.path for w in prepare(PrepRequest(source="gsm8k", output=work / "gsm8k",
                                                         inputs=[str(raw)]))}
    sizes = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data['train']}",
             f"data.val_files={data['test']}", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
             "trainer.nnodes=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
             "data.max_response_length=32", "data.max_prompt_length=512",
             f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=False",
             "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.progress_bar=False",
             "trainer.logger=[]", "reward.num_workers=0"]
    rows = []
    for engine in args.engines.split(","):
        run = work / f"run-{engine}"
        start = time.perf_counter()
        train(load_config(None, seed_004_line() + sizes + engine_overrides(engine)
                          + [f"trainer.default_local_dir={run}"]), log=lambda *_: None)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steady = records[1:] or records
        rows.append((engine, wall, statistics.median(r["timing_s/step"] for r in steady),
                     {s: statistics.median(r.get(f"timing_s/{s}", 0.0) for r in steady) for s in STAGES},
                     statistics.mean(r["response_length/mean"] for r in records)))
    print(f"seed 004's line, tiny Qwen2.5-VL (hidden 128), 2 Ray ranks on the CPU, "
          f"8 prompts x 4 responses, {args.steps} steps (median of steps 2..{args.steps})")
    print(f"{'engine':<10}{'run s':>8}{'s/step':>8}" + "".join(f"{s:>16}" for s in STAGES)
          + f"{'mean resp len':>15}")
    for engine, wall, step, stages, length in rows:
        print(f"{engine:<10}{wall:>8.1f}{step:>8.2f}" + "".join(f"{stages[s]:>16.2f}" for s in STAGES)
              + f"{length:>15.1f}")


if __name__ == "__main__":
    main()
