"""Time a fixed GRPO workload: seconds per step, tokens per second, stages, memory.

Workload (the same on any model, so it can be run beside other frameworks):
8 prompts x 8 samples from the built-in arithmetic set, exactly 64 response
tokens each (`rollout.ignore_eos=True`), KL loss to a frozen reference on,
one optimizer step per training step (`ppo_mini_batch_size=8`), the
shared-prompt forward on (`model.use_remove_padding=True`). The tiny
recipe supplies everything else; verl-style overrides go on top (e.g.
data.train_files=... to time your own prompts), and the report prints the
workload as run: the data, the sizes, the measured mean response length:

    python bench/grpo_step.py                                  # tiny Qwen2, CPU
    python bench/grpo_step.py --steps 5 --warmup 2 --json out.json
    python bench/grpo_step.py actor_rollout_ref.model.path=/path/to/hf_folder
    python bench/grpo_step.py actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \\
        trainer.device=cuda

Warmup steps are run and discarded; the numbers are over the measured steps.
Peak memory is the process's peak RSS on CPU (it includes loading the
model), and `torch.cuda.max_memory_allocated` over the measured steps on CUDA.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time

import torch
import transformers

from thinkrl.build import build_run
from thinkrl.parallel.device import peak_memory_bytes, reset_peak_memory
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train_step

PROMPTS, SAMPLES, RESPONSE_TOKENS = 8, 8, 64
WORKLOAD = [
    f"data.train_batch_size={PROMPTS}",
    f"actor_rollout_ref.rollout.n={SAMPLES}",
    f"data.max_response_length={RESPONSE_TOKENS}",
    "actor_rollout_ref.rollout.ignore_eos=True",
    "actor_rollout_ref.actor.use_kl_loss=True",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
    # The whole batch in one forward/backward; lower it if a big model runs out of memory.
    f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={PROMPTS * SAMPLES}",
    # The shared-prompt pass (same math up to float32 rounding; verl's runs set it too).
    "actor_rollout_ref.model.use_remove_padding=True",
    "trainer.val_before_train=False",
    "trainer.progress_bar=False",
    "trainer.logger=[]",
    "trainer.seed=1",
]
# The stages grpo_step times, in the order it runs them (verl's timing_s/ names).
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="measured steps (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="discarded steps first (default 1)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to this file")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides (verl style)")
    return parser


def summarize(steps: list[dict[str, float]], *, responses: int) -> dict:
    """Means over the measured steps (`responses` per step); throughputs are
    totals over totals."""
    step_s = [m["timing_s/step"] for m in steps]
    generated = sum(m["response_length/mean"] * responses for m in steps)
    stages = {s: sum(m.get(f"timing_s/{s}", 0.0) for m in steps) / len(steps) for s in STAGES}
    stages["other"] = sum(step_s) / len(steps) - sum(stages.values())  # batching, bookkeeping
    return {
        "step_s": step_s,
        "step_s_mean": sum(step_s) / len(step_s),
        "step_s_min": min(step_s),
        "gen_tokens_per_s": generated / sum(m["timing_s/gen"] for m in steps),
        "total_tokens_per_s": sum(m["perf/total_num_tokens"] for m in steps) / sum(step_s),
        "response_length_mean": generated / (responses * len(steps)),
        "stages_s": stages,
    }


def report(info: dict, result: dict) -> str:
    mean = result["step_s_mean"]
    lines = [
        f"model         {info['model']}  ({info['parameters'] / 1e6:.2f}M parameters)",
        f"device        {info['device']}  dtype {info['dtype']}  torch threads {info['threads']}",
        f"versions      torch {info['torch']}  transformers {info['transformers']}  "
        f"python {info['python']}",
        f"data          {info['train_files']}",
        f"workload      {info['prompts']} prompts x {info['samples']} samples, responses of "
        f"{result['response_length_mean']:.1f} tokens on average (limit "
        f"{info['max_response_length']}{', ignore_eos' if info['ignore_eos'] else ''}), KL loss "
        f"{'on' if info['kl_loss'] else 'off'}; {info['warmup']} warmup + {info['steps']} "
        "measured steps",
        f"step          {mean:.3f} s mean, {result['step_s_min']:.3f} s min "
        f"(each: {' '.join(f'{s:.3f}' for s in result['step_s'])})",
        f"generation    {result['gen_tokens_per_s']:.1f} response tokens/s "
        f"(mean response length {result['response_length_mean']:.1f})",
        f"overall       {result['total_tokens_per_s']:.1f} tokens/s "
        "(prompt + response tokens / step time)",
        f"peak memory   {info['peak_memory_bytes'] / 2**20:.0f} MiB ({info['peak_memory_kind']})",
        "",
        f"{'stage':<16}{'seconds':>9}{'% of step':>11}",
    ]
    for stage, seconds in result["stages_s"].items():
        lines.append(f"{stage:<16}{seconds:>9.3f}{100 * seconds / mean:>10.1f}%")
    lines.append(f"{'step':<16}{mean:>9.3f}{100.0:>10.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        print("bench: error: --steps must be >= 1 and --warmup >= 0", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="thinkrl-bench-") as run_dir:
        fixed = WORKLOAD + [f"trainer.total_training_steps={args.warmup + args.steps}",
                            f"trainer.default_local_dir={run_dir}"]
        try:
            cfg = load_config(recipe_path("tiny"), fixed + args.overrides)
            run = build_run(cfg, log=lambda message: print(f"# {message}"))
        except ValueError as err:  # a user mistake: the message says what to do
            print(f"bench: error: {err}", file=sys.stderr)
            return 2
        model = run.roles.actor.group.rank.actor.model
        device = next(model.parameters()).device
        for step in range(args.warmup):
            start = time.perf_counter()
            train_step(run, step + 1)
            print(f"# warmup step {step + 1}: {time.perf_counter() - start:.2f} s")
        reset_peak_memory(device)
        measured = [train_step(run, args.warmup + i + 1) for i in range(args.steps)]
        run.close()
    peak, peak_kind = peak_memory_bytes(device)
    info = {
        "model": run.spec.model_path, "parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device), "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "warmup": args.warmup, "steps": args.steps, "overrides": args.overrides,
        "peak_memory_bytes": peak, "peak_memory_kind": peak_kind,
        # The workload as run (overrides may change the defaults above).
        "train_files": cfg.data.train_files, "prompts": cfg.data.train_batch_size,
        "samples": cfg.actor_rollout_ref.rollout.n,
        "max_response_length": cfg.data.max_response_length,
        "ignore_eos": cfg.actor_rollout_ref.rollout.ignore_eos,
        "kl_loss": cfg.actor_rollout_ref.actor.use_kl_loss,
    }
    result = summarize(measured, responses=cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n)
    print(report(info, result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "result": result, "steps": measured}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
