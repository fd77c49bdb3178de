"""The accelerator check: what a session runs, once, when a device is lent
(`bash bench/device_check.sh`, which calls this). Every check is a child
process with its own deadline, so a hang or an out-of-memory in one still
leaves the others' figures; each prints one JSON line per measurement, and
the lines are also appended to $OUT/device_check.jsonl when OUT is set.

Checks, in order (8 minutes at most on a device, each check's deadline
summed, a minute under the 540 s the device tool's call is given; a check
past its deadline is killed with every process it started: pytest, a
rollout process, reward workers; `--dry-run`: the same code on the CPU with
tiny shapes, under 2 minutes):
- env: torch, CUDA, the device and its memory;
- tests: the suite's accelerator tests (`tests/accelerator`, skipped without one);
- grpo-0.5b, grpo-1.5b: one bfloat16 GRPO step (bench/grpo_step.py's
  workload: 8 prompts x 8 responses of 64 tokens, KL loss) on a random model
  of Qwen2.5-0.5B's and -1.5B's shape: seconds per step, generation and
  update tokens per second, model FLOP utilisation against the datasheet
  peak of the device found (dense bfloat16: H100 SXM and H200 989 TFLOP/s,
  H100 PCIe 756, H100/H200 NVL 835, A100 312; none for another device),
  peak device memory beside the doctor's estimate;
- trl: grpo-0.5b's step in TRL's GRPOTrainer at the same precision, when
  TRL's wheels are carried (reported as not run otherwise);
- async-longtail: `bench/async_modes.py --workload longtail`, sync against streaming.

    python bench/device_check.py [--dry-run] [--only grpo-0.5b ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Dense bfloat16 peaks from NVIDIA's datasheets, matched against the device's name
# in this order (the workplace's H200 reaches about 790 TFLOP/s in practice).
PEAK_BF16_FLOPS = [("H100 PCIe", 756e12), ("NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
                   ("A100", 312e12)]
sys.path.insert(0, str(ROOT / "bench"))
from scale_costs import SHAPES as QWEN25_SHAPES, random_qwen2  # noqa: E402

SHAPES = {**QWEN25_SHAPES,  # "tiny" for the dry run
          "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512)}
# (check, deadline in seconds on a device, in a dry run): 540 s at most in all, inside the
# device tool's 600 s a command
CHECKS = [("env", 30, 60), ("tests", 80, 90), ("grpo-0.5b", 90, 100), ("grpo-1.5b", 110, 100),
          ("trl", 80, 100), ("async-longtail", 90, 150)]
BUDGET_S = 480  # on a device: no check starts a deadline that would end past it


def peak_flops(device_name: str | None) -> tuple[float | None, str | None]:
    """The datasheet's dense bfloat16 FLOP/s of the device named, and the entry matched."""
    for key, flops in PEAK_BF16_FLOPS:
        if device_name and key.lower() in device_name.lower():
            return flops, key
    return None, None


def mfu(flops_per_s: float, device_name: str | None) -> float | None:
    peak, _ = peak_flops(device_name)
    return None if peak is None else float(f"{flops_per_s / peak:.3g}")


def emit(record: dict) -> None:
    line = json.dumps(record, sort_keys=False)
    print(line, flush=True)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / "device_check.jsonl", "a") as f:
            f.write(line + "\n")


# -- the checks (each runs in a child process) ---------------------------------
def check_env(dry: bool) -> None:
    import torch
    import transformers
    record = {"check": "env", "torch": torch.__version__, "transformers": transformers.__version__,
              "python": sys.version.split()[0], "cuda": torch.cuda.is_available(), "dry_run": dry}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        record.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                      capability=f"{props.major}.{props.minor}", cuda_runtime=torch.version.cuda)
    emit(record)


def check_tests(dry: bool) -> None:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(ROOT / "tests" / "accelerator")], cwd=ROOT, capture_output=True, text=True)
    tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-300:]
    emit({"check": "tests", "ok": result.returncode in (0, 5), "summary": tail,
          "seconds": round(time.perf_counter() - started, 1)})
    if result.returncode not in (0, 5):
        print(result.stdout[-4000:], file=sys.stderr)


def random_model(shape: str, folder: Path) -> Path:
    """A random Qwen2 of `shape` in bfloat16 with a small byte-level tokenizer
    (ids past it decode to nothing: the reward sees text, the step's cost is the shape's)."""
    import torch

    from thinkrl.models.tiny import build_tokenizer
    texts = [f"What is {a} + {b}? {a + b}" for a in range(40) for b in range(40)]
    tokenizer = build_tokenizer(texts, vocab_size=400)
    model = random_qwen2(SHAPES[shape], max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model.to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def check_grpo(shape: str, dry: bool) -> None:
    import torch
    from grpo_step import WORKLOAD, summarize

    from thinkrl.build import build_run
    from thinkrl.cli import recipe_path
    from thinkrl.config import load_config
    from thinkrl.doctor.context import DoctorContext
    from thinkrl.doctor.memory import estimate_memory
    from thinkrl.parallel.device import peak_memory_bytes, reset_peak_memory
    from thinkrl.trainer import train_step

    name = "tiny" if dry else shape
    device = "cpu" if dry else "cuda"
    with tempfile.TemporaryDirectory(prefix="thinkrl-device-check-") as tmp:
        model_dir = random_model(name, Path(tmp) / "model")
        overrides = WORKLOAD + [f"actor_rollout_ref.model.path={model_dir}", f"trainer.device={device}",
                                "actor_rollout_ref.model.dtype=bfloat16", "trainer.total_training_steps=3",
                                "data.max_prompt_length=256",  # the small tokenizer's prompts are long
                                f"trainer.default_local_dir={tmp}/run", "trainer.save_freq=-1",
                                "trainer.test_freq=-1"]
        cfg = load_config(recipe_path("tiny"), overrides)
        run = build_run(cfg, log=lambda *_: None)
        try:
            model = run.roles.actor.group.rank.actor.model
            params = sum(p.numel() for p in model.parameters())
            where = next(model.parameters()).device
            train_step(run, 1)  # warm-up: kernels, caches, allocator
            reset_peak_memory(where)
            steps = [train_step(run, 2), train_step(run, 3)]
        finally:
            run.close()
        peak, peak_kind = peak_memory_bytes(where)
        capacity = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
        estimate = estimate_memory(DoctorContext(cfg, device=device), capacity=capacity).peak
    responses = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    summary = summarize(steps, responses=responses)
    tokens = sum(m["perf/total_num_tokens"] for m in steps) / len(steps)  # prompt + response, per step
    generated = summary["response_length_mean"] * responses
    update_s = sum(m["timing_s/update_actor"] for m in steps) / len(steps)
    # 2PN per forward token, 6PN per trained token: generation, the pi_old and reference
    # forwards that ran (pi_old is skipped on-policy), the update; attention's own FLOPs left out
    forwards = sum(summary["stages_s"][s] > 0 for s in ("old_log_prob", "ref"))
    flops = 2 * params * generated + forwards * 2 * params * tokens + 6 * params * tokens
    # A dry run's figure is taken against the H200's peak, to exercise the arithmetic.
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "dry run (H200's peak)"
    emit({"check": f"grpo-{shape}", "ran_shape": name, "device": device, "device_name": device_name,
          "peak_tflops": (peak_flops(device_name)[0] or 0) / 1e12 or None, "parameters": params,
          "step_s": round(summary["step_s_mean"], 4),
          "gen_tokens_per_s": round(summary["gen_tokens_per_s"], 1),
          "update_tokens_per_s": round(tokens / update_s, 1),
          "mfu_step": mfu(flops / summary["step_s_mean"], device_name),
          "mfu_update": mfu(6 * params * tokens / update_s, device_name),
          "peak_memory_gib": round(peak / 2**30, 3), "peak_memory_kind": peak_kind,
          "doctor_estimate_gib": round(estimate / 2**30, 3),
          "stages_s": {k: round(v, 4) for k, v in summary["stages_s"].items()}})


def check_trl(dry: bool) -> None:
    """grpo-0.5b's step in TRL's GRPOTrainer, when TRL is installed (carried as
    wheels: trl, datasets and their missing needs): the same random model
    folder, 8 prompts x 8 completions of exactly 64 tokens, KL beta 0.04 to a
    reference, one optimizer step per step, bfloat16 autocast on the device
    (as thinkrl's model.dtype=bfloat16); seconds per step after a warm-up."""
    try:
        import trl
    except ImportError:
        emit({"check": "trl", "ran": False, "why": "trl is not installed: carry its wheels (trl, datasets, "
              "dill, xxhash, multiprocess, pandas) to run TRL's step beside thinkrl's"})
        return
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback

    device = "cpu" if dry else "cuda"
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.started)

    def digits(completions, **kwargs) -> list[float]:  # any reward: the cost is the same
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [sum(ch.isdigit() for ch in text) / max(1, len(text)) for text in texts]

    with tempfile.TemporaryDirectory(prefix="thinkrl-device-check-") as tmp:
        folder = random_model("tiny" if dry else "0.5b", Path(tmp) / "model")
        tokenizer = AutoTokenizer.from_pretrained(folder)
        import pyarrow.parquet as pq

        from thinkrl.builtin import resolve_data_files
        # grpo-0.5b's prompts: the tiny recipe's data, its chat messages (TRL applies the template)
        rows = pq.read_table(resolve_data_files("builtin:arith/train", log=lambda *_: None)).to_pylist()
        prompts = [[{"role": m["role"], "content": m["content"]} for m in row["prompt"]] for row in rows[:512]]
        config = trl.GRPOConfig(
            output_dir=f"{tmp}/trl", per_device_train_batch_size=64, num_generations=8,
            max_completion_length=64, generation_kwargs={"min_new_tokens": 64}, beta=0.04,
            learning_rate=1e-6, max_steps=3, logging_steps=1, report_to=[], save_strategy="no",
            gradient_checkpointing=False, bf16=not dry, use_cpu=dry, seed=0, dataloader_num_workers=0)
        trainer = trl.GRPOTrainer(model=str(folder), reward_funcs=digits, args=config,
                                  train_dataset=Dataset.from_dict({"prompt": prompts}),
                                  processing_class=tokenizer, callbacks=[StepClock()])
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        with contextlib.redirect_stdout(sys.stderr):  # its log lines are not this check's JSON
            trainer.train()
    measured = times[1:] or times
    emit({"check": "trl", "ran": True, "trl": trl.__version__, "ran_shape": "tiny" if dry else "0.5b",
          "device": device, "precision": "float32" if dry else "bfloat16 autocast",
          "step_s": round(sorted(measured)[len(measured) // 2], 4), "steps_s": [round(t, 4) for t in times],
          "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if device == "cuda" else None})


def check_async(dry: bool) -> None:
    """The long-tail workload (its pretrained tiny model, built on first use);
    the dry run takes a random tiny model and short responses instead."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="thinkrl-device-check-") as tmp:
        extra = ["trainer.device=cuda"]
        if dry:
            extra = [f"actor_rollout_ref.model.path={random_model('tiny', Path(tmp) / 'model')}",
                     "data.max_prompt_length=512", "data.max_response_length=32", "data.train_batch_size=4",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]
        result = subprocess.run([sys.executable, str(ROOT / "bench" / "async_modes.py"), "--workload",
                                 "longtail", "--steps", "2" if dry else "6", "--modes", "sync", "streaming",
                                 "--json", *extra], cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"bench/async_modes.py failed:\n{result.stderr[-3000:]}")
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            emit({"check": "async-longtail", **json.loads(line)})
    emit({"check": "async-longtail", "seconds": round(time.perf_counter() - started, 1)})


RUN = {"env": check_env, "tests": check_tests, "trl": check_trl, "async-longtail": check_async,
       "grpo-0.5b": lambda dry: check_grpo("0.5b", dry), "grpo-1.5b": lambda dry: check_grpo("1.5b", dry)}


# -- the driver ----------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU, tiny shapes")
    parser.add_argument("--only", nargs="+", choices=list(RUN), help="these checks alone")
    parser.add_argument("--child", choices=list(RUN), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        RUN[args.child](args.dry_run)
        return 0
    failed, began = 0, time.perf_counter()
    for check, deadline, dry_deadline in CHECKS:
        if args.only and check not in args.only:
            continue
        limit = dry_deadline if args.dry_run else min(deadline, BUDGET_S - (time.perf_counter() - began))
        started = time.perf_counter()
        if limit < 10:
            code, why = -1, f"not started: {BUDGET_S} s of checks spent"
        else:
            command = [sys.executable, __file__, "--child", check, *(["--dry-run"] if args.dry_run else [])]
            code, why = run_with_deadline(command, limit)
        if code:
            failed += 1
            emit({"check": check, "ok": False, "seconds": round(time.perf_counter() - started, 1),
                  "error": why.strip().splitlines()[-1] if why.strip() else f"exit code {code}"})
            print(why, file=sys.stderr)
    return 1 if failed else 0


def run_with_deadline(command: list[str], limit: float) -> tuple[int, str]:
    """Run `command` in a session of its own; past `limit` seconds kill it and
    every process it started (a process group can be left by a grandchild
    that made its own session: this process is their subreaper, so such
    orphans stay its descendants, found in /proc). What a check leaves
    running after it ends is killed the same way. Returns the exit code (-1
    past the deadline) and the end of stderr."""
    become_subreaper()
    with tempfile.TemporaryFile(mode="w+") as err:
        child = subprocess.Popen(command, stderr=err, text=True, start_new_session=True)
        try:
            code = child.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_tree(child.pid, group=True)  # still unreaped: its pid is its own
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=30)  # a process stuck in a driver call may never die
            code, why = -1, f"did not finish within its {limit:.0f} s deadline"
        else:
            err.seek(0)
            why = err.read()[-2000:]
        kill_tree(os.getpid(), group=False)  # orphans the check left, re-parented here
        return code, why


def become_subreaper() -> None:
    """prctl(PR_SET_CHILD_SUBREAPER): orphaned descendants re-parent to this
    process instead of init (Linux; elsewhere a no-op)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)


def kill_tree(pid: int, *, group: bool) -> None:
    """SIGKILL every descendant of `pid` and, with `group`, its process group
    (`pid` must then be a live or unreaped child that leads its group)."""
    victims = descendants(pid)
    if group:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


if __name__ == "__main__":
    sys.exit(main())
