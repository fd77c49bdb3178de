"""Full fine-tuning vs LoRA on a ~110M-parameter Qwen2 (random weights, the
tiny model's tokenizer): trainable parameters, AdamW's state, peak memory of
one GRPO step of the tiny recipe on the CPU, and the doctor's estimate beside it.

    python bench/lora_memory.py [--rank 16] [--steps 1]

Each mode runs in a fresh process (peak RSS is per process): build the run
(the actor, the reference when it is a separate copy, AdamW), one training
step, then read AdamW's state bytes and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 2**20
# ~110M parameters: Qwen2 proportions at GPT-2-small scale.
SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512,
             tie_word_embeddings=True)


def make_model(folder: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thinkrl import builtin
    from transformers import AutoTokenizer

    tiny = builtin.resolve_model_path("builtin:tiny-qwen2", log=lambda *_: None)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPE, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def overrides(model: Path, run_dir: Path, rank: int, steps: int) -> list[str]:
    lora = [f"actor_rollout_ref.model.lora_rank={rank}", f"actor_rollout_ref.model.lora_alpha={2 * rank}"]
    return [f"actor_rollout_ref.model.path={model}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "data.max_response_length=32",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            f"trainer.total_training_steps={steps}", "trainer.val_before_train=False",
            "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.progress_bar=False",
            "trainer.logger=[]", "reward.num_workers=0", *(lora if rank else [])]


def measure(model: Path, rank: int, steps: int) -> dict:
    """One mode in this process: the numbers of one row."""
    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.doctor import DoctorContext
    from thinkrl.doctor.memory import estimate_memory
    from thinkrl.trainer import train_run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("tiny", overrides(model, Path(tmp) / "run", rank, steps))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        run = build_run(cfg, log=lambda *_: None)
        built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            train_run(run, log=lambda *_: None)
            actor = run.roles.actor.group.rank.actor
            trainable = sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
            total = sum(p.numel() for p in actor.model.parameters())
            adam = sum(t.numel() * t.element_size() for state in actor.learner.optimizer.state.values()
                       for t in state.values() if hasattr(t, "numel"))
        finally:
            run.close()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        estimate = estimate_memory(DoctorContext(cfg, env={}))
    return {"trainable": trainable, "total": total, "adam": adam, "start": before, "built": built, "peak": peak,
            "estimate": estimate.peak, "resident_estimate": estimate.resident}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: MODEL:RANK, in a subprocess
    args = parser.parse_args()
    if args.one:
        model, rank = args.one.rsplit(":", 1)
        print(json.dumps(measure(Path(model), int(rank), args.steps)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "qwen2-110m"
        make_model(model)
        rows = {}
        for name, rank in (("full", 0), (f"LoRA r={args.rank}", args.rank)):
            out = subprocess.run([sys.executable, __file__, "--one", f"{model}:{rank}", "--steps", str(args.steps)],
                                 check=True, capture_output=True, text=True).stdout
            rows[name] = json.loads(out.strip().splitlines()[-1])
    print("| mode | trainable params | AdamW state | peak RSS while building | peak RSS | peak - start "
          "| doctor's peak estimate |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['trainable'] / 1e6:.2f}M of {r['total'] / 1e6:.1f}M | {r['adam'] / MIB:.1f} MiB | "
              f"{r['built'] / MIB:.0f} MiB | {r['peak'] / MIB:.0f} MiB | {(r['peak'] - r['start']) / MIB:.0f} MiB | "
              f"{r['estimate'] / MIB:.0f} MiB |")


if __name__ == "__main__":
    main()
