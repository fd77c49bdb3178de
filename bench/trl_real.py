"""TRL's GRPOTrainer on any model folder and verl-schema parquet: the other
side of `bench/side_by_side_real.sh` (thinkrl vs TRL on a real model).

The data are verl's rows (`prompt` as chat messages, `reward_model.ground_truth`),
rendered by the model's own chat template (TRL applies it to conversational
prompts, as thinkrl's `data.template=chat` does). The reward is thinkrl's GSM8K
scorer (strict "#### n", verl's default), so both sides pay the same
responses the same. Settings mirror a thinkrl recipe key for key: prompts per
step x generations, completion length, temperature, learning rate, no KL
(beta 0, no reference model), one update per step, float32 (or `--bf16`).

Each step is timed from the Trainer's step begin to its end; the first
`--warmup` steps are not counted. With `--minutes M` the run stops at the
first step that ends past M minutes of training and saves the policy to
`--save` (for `thinkrl eval`, the held-out accuracy after the same wall
clock). Prints one JSON line (also appended to `--json-out`).

Needs trl 1.16 beside this project's venv (not a project dependency):
    pip install --no-deps --target /tmp/trlsite trl==1.16.0 datasets pandas dill xxhash \
        multiprocess httpx httpcore anyio h11 sniffio python-dateutil pytz tzdata
    PYTHONPATH=/tmp/trlsite .venv/bin/python bench/trl_real.py --model DIR --data FILE.parquet
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(key, "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face model folder (or builtin:NAME)")
    p.add_argument("--data", required=True, help="verl-schema parquet file (or builtin:NAME)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="generations per prompt")
    p.add_argument("--micro", type=int, default=32,
                   help="completions per forward/backward (gradient accumulation makes up the step)")
    p.add_argument("--max-completion", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--format-score", type=float, default=0.0,
                   help="score of a readable wrong answer (thinkrl's reward.format_score)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (counted ones after --warmup)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--minutes", type=float, help="stop at the first step ending past this training time")
    p.add_argument("--save", help="folder to save the trained policy into")
    p.add_argument("--ignore-eos", action="store_true",
                   help="every completion exactly --max-completion tokens (the same work on both sides)")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (TrainingArguments.bf16)")
    p.add_argument("--seed", type=int, default=1, help="thinkrl's trainer.seed default")
    p.add_argument("--tag", default="trl")
    p.add_argument("--json-out")
    return p.parse_args(argv)


def verl_rows(path: str) -> list[dict]:
    """{'prompt': messages, 'ground_truth': str} per row of a verl parquet file."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return [{"prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
             "ground_truth": str(row["reward_model"]["ground_truth"])} for row in rows]


def main(argv=None) -> dict:
    args = parse_args(argv)
    import datasets
    import transformers
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    from thinkrl.builtin import resolve_data_files, resolve_model_path
    from thinkrl.rewards.gsm8k import compute_score

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    if args.micro < 1 or args.prompts * args.n % args.micro:
        raise SystemExit(f"--micro {args.micro} must divide --prompts x --n = {args.prompts * args.n}: "
                         "TRL generates micro x accumulation completions per step")
    transformers.set_seed(args.seed)
    model_dir = resolve_model_path(args.model, log=lambda *_: None)
    rows = verl_rows(resolve_data_files(args.data, log=lambda *_: None))
    steps: list[dict] = []
    scores: list[float] = []

    def gsm8k_strict(completions, ground_truth, **_):
        out = [compute_score(c[-1]["content"] if isinstance(c, list) else c, gt,
                             format_score=args.format_score)
               for c, gt in zip(completions, ground_truth)]
        scores.extend(out)
        return out

    class StepClock(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_begin(self, a, state, control, **kw):
            self.t0, self.first = time.perf_counter(), len(scores)

        def on_step_end(self, a, state, control, **kw):
            now = time.perf_counter()
            reward = statistics.mean(scores[self.first:]) if len(scores) > self.first else 0.0
            steps.append({"step": state.global_step, "seconds": now - self.t0, "reward": reward,
                          "elapsed": now - self.start})
            print(f"[trl] step {state.global_step}: {now - self.t0:.1f} s reward {reward:.3f}",
                  file=sys.stderr, flush=True)
            if args.minutes is not None and now - self.start >= 60 * args.minutes:
                control.should_training_stop = True

    work = tempfile.TemporaryDirectory(prefix="trl_real_")
    max_steps = 10_000 if args.minutes is not None else args.warmup + args.steps
    config = GRPOConfig(
        output_dir=os.path.join(work.name, "out"), per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=args.prompts * args.n // args.micro, num_generations=args.n,
        max_completion_length=args.max_completion,
        temperature=args.temperature, beta=0.0, num_iterations=1, learning_rate=args.lr,
        weight_decay=0.01, lr_scheduler_type="constant", warmup_steps=0, max_steps=max_steps, bf16=args.bf16,
        # TRL's default recomputes activations in the backward; thinkrl's does not
        fp16=False, use_cpu=True, gradient_checkpointing=False, report_to="none", logging_steps=1,
        save_strategy="no",
        disable_tqdm=True, seed=args.seed, data_seed=args.seed, dataloader_num_workers=0,
        model_init_kwargs={"dtype": "float32"},
        generation_kwargs={"min_new_tokens": args.max_completion} if args.ignore_eos else None)
    trainer = GRPOTrainer(model=model_dir, reward_funcs=gsm8k_strict, args=config,
                          train_dataset=datasets.Dataset.from_list(rows), callbacks=[StepClock()])
    for callback in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(callback)
    trainer.train()
    if args.save:
        trainer.save_model(args.save)
        trainer.processing_class.save_pretrained(args.save)
    counted = [s["seconds"] for s in steps[args.warmup:]] or [s["seconds"] for s in steps]
    result = {"bench": "trl_real", "tag": args.tag, "model": model_dir, "bf16": args.bf16,
              "prompts": args.prompts, "n": args.n, "max_completion": args.max_completion,
              "seconds_per_step_median": round(statistics.median(counted), 3),
              "step_seconds": [round(s["seconds"], 3) for s in steps],
              "rewards": [round(s["reward"], 4) for s in steps],
              "train_seconds": round(steps[-1]["elapsed"], 1) if steps else 0.0,
              "steps": len(steps), "trl": __import__("trl").__version__}
    line = json.dumps(result)
    print(line)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(line + "\n")
    return result


if __name__ == "__main__":
    main()
