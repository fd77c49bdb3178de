"""Seconds per GRPO step of a vision-language model: image prompts vs text prompts.

Both workloads use the same model and sizes: 4 prompts x 4 samples, exactly
32 response tokens (`rollout.ignore_eos=True`), KL loss on, one optimizer
step per training step. The image prompts are the synthetic arithmetic set
of `thinkrl.data.image_arith` (one 112 x 56 image each: 8 vision tokens on
the tiny model's processor); the text prompts are the same questions with the
expression written out instead of drawn. The model defaults to a tiny
Qwen2.5-VL built from a config (random weights; needs the Qwen2.5 tokenizer
in ../shared/data/tokenizers/qwen2.5, or --tokenizer):

    python bench/vl_step.py                     # tiny Qwen2.5-VL, CPU
    python bench/vl_step.py --model /path/to/Qwen2.5-VL-3B-Instruct trainer.device=cuda

Prints one line per workload (mean s/step over the measured steps, the
generation and update stages, prompt tokens) and the image/text ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from thinkrl.build import build_run
from thinkrl.config import load_config
from thinkrl.data.image_arith import examples
from thinkrl.data.prep.examples import Example, to_verl_rows, write_rows
from thinkrl.data.synthetic import INSTRUCTION
from thinkrl.trainer import train_step

PROMPTS, SAMPLES, RESPONSE_TOKENS = 4, 4, 32
SHARED_TOKENIZER = Path(__file__).resolve().parents[2] / "shared/data/tokenizers/qwen2.5"
WORKLOAD = [
    f"data.train_batch_size={PROMPTS}", f"actor_rollout_ref.rollout.n={SAMPLES}",
    f"data.max_response_length={RESPONSE_TOKENS}", "data.max_prompt_length=256",
    "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.name=native",
    "actor_rollout_ref.actor.use_kl_loss=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS * SAMPLES}",
    "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.val_before_train=False",
    "trainer.progress_bar=False", "trainer.logger=[]", "trainer.seed=1",
]


def write_sets(folder: Path, count: int) -> dict[str, Path]:
    """image.parquet (the drawn expressions) and text.parquet (the same, written)."""
    drawn = examples(count, seed=0)
    written = [Example(question=f"What is the value of {e.original['expression']}?",
                       ground_truth=e.ground_truth, data_source=e.data_source, ability="math")
               for e in drawn]
    paths = {}
    for name, rows in (("image", drawn), ("text", written)):
        paths[name] = folder / f"{name}.parquet"
        write_rows(to_verl_rows(rows, split="train", instruction=INSTRUCTION), paths[name])
    return paths


def time_steps(model: str, data: Path, run_dir: Path, overrides: list[str], *,
               steps: int, warmup: int) -> dict:
    cfg = load_config(None, WORKLOAD + [f"actor_rollout_ref.model.path={model}",
                                        f"data.train_files={data}", f"data.val_files={data}",
                                        f"trainer.default_local_dir={run_dir}", *overrides])
    run = build_run(cfg, log=lambda *_: None)
    try:
        measured = [train_step(run, step + 1) for step in range(warmup + steps)][warmup:]
    finally:
        run.close()
    mean = lambda key: sum(m[key] for m in measured) / len(measured)  # noqa: E731
    return {"step_s": mean("timing_s/step"), "gen_s": mean("timing_s/gen"),
            "update_s": mean("timing_s/update_actor"),
            "prompt_tokens": mean("prompt_length/mean")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a VL model folder (default: a tiny Qwen2.5-VL)")
    parser.add_argument("--tokenizer", default=str(SHARED_TOKENIZER),
                        help="tokenizer folder for the tiny model")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = args.model
        if model is None:
            from thinkrl.models.tiny_vl import build_tiny_vl
            model = str(build_tiny_vl(tmp / "tiny-vl", tokenizer_dir=Path(args.tokenizer)))
        data = write_sets(tmp, PROMPTS * (args.steps + args.warmup))
        results = {name: time_steps(model, path, tmp / f"run-{name}", args.overrides,
                                    steps=args.steps, warmup=args.warmup)
                   for name, path in data.items()}
    for name, r in results.items():
        print(f"{name:5s} prompts: {r['step_s']:.2f} s/step (gen {r['gen_s']:.2f} s, update "
              f"{r['update_s']:.2f} s), prompt {r['prompt_tokens']:.0f} tokens")
    print(f"image / text: {results['image']['step_s'] / results['text']['step_s']:.2f}x s/step")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
