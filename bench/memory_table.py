"""What fits: the doctor's memory estimate (`thinkrl.doctor.memory`) for
Qwen2.5 0.5B / 7B / 32B / 72B on one node of 8 devices of 80 GB and of 64 GB,
with seed 004's workload (verl's GSM8K line: 512 prompts x 5 responses,
prompts 1024 + responses 2048 tokens, micro-batch 2, gradient checkpointing,
bf16, the ray backend with FSDP2 over the 8 devices, the reference offloaded).

    python bench/memory_table.py [--engine vllm|native] [--tp 4] [--nodes 1] [--moe] [key=value ...]

Prints one row per model and device size: per device, what stays (weights,
AdamW, reference), the largest phase (update or rollout) and the peak; per
node, the host RAM of rank 0's node. A planning estimate, not a measurement:
the formulas and their sources are in `thinkrl/doctor/memory.py`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import Qwen2Config

from thinkrl.config import load_config
from thinkrl.doctor import DoctorContext
from thinkrl.doctor.context import estimate_param_count
from thinkrl.doctor.memory import estimate_memory, host_need

GIB = 2**30
# Qwen2.5's published configs (hidden, layers, heads, kv heads, intermediate, tied embeddings).
MODELS = {
    "Qwen2.5-0.5B": (896, 24, 14, 2, 4864, True),
    "Qwen2.5-7B": (3584, 28, 28, 4, 18944, False),
    "Qwen2.5-32B": (5120, 64, 40, 8, 27648, False),
    "Qwen2.5-72B": (8192, 80, 64, 8, 29568, False),
}
SEED_004 = ["data.train_batch_size=512", "data.max_prompt_length=1024", "data.max_response_length=2048",
            "actor_rollout_ref.rollout.n=5", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.ref.fsdp_config.param_offload=True",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
            "data.val_batch_size=512", "trainer.backend=ray", "trainer.device=cuda"]


QWEN3_MOE = Path(__file__).resolve().parents[2] / "shared" / "data" / "models" / "qwen3-30b-a3b-config"
"""Qwen3-30B-A3B's real config.json (128 experts, 8 active), with --moe."""


def model_config(name: str):
    if name == "Qwen3-30B-A3B":
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(QWEN3_MOE)
    hidden, layers, heads, kv_heads, inter, tied = MODELS[name]
    return Qwen2Config(vocab_size=152064 if not tied else 151936, hidden_size=hidden,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, intermediate_size=inter,
                       tie_word_embeddings=tied)


def row(name: str, capacity_gb: int, overrides: list[str]) -> str:
    config = model_config(name)
    cfg = load_config(None, SEED_004 + overrides)
    ctx = DoctorContext(cfg, env={})
    ctx.__dict__.update(model_config=config, param_count=estimate_param_count(config),
                        device_kind="cuda")  # what the doctor would read from the folder
    capacity = capacity_gb * 10**9
    e = estimate_memory(ctx, capacity=capacity)
    phase = max(e.phases, key=e.phases.get)
    host, _ = host_need(ctx)
    verdict = "fits" if e.peak <= capacity else f"no (x{e.peak / capacity:.1f})"
    if e.vllm_share and e.vllm_weights > 0.9 * e.vllm_share:
        verdict = f"no: vLLM's weights {e.vllm_weights / GIB:.0f} of its {e.vllm_share / GIB:.0f} share"
    return (f"| {name} | {ctx.param_count / 1e9:.2f}B | {capacity_gb} GB | {e.resident / GIB:.1f} | "
            f"{phase} {e.phases[phase] / GIB:.1f} | {e.peak / GIB:.1f} | {verdict} | {host / GIB:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("vllm", "native"), default="vllm")
    parser.add_argument("--tp", type=int, default=4, help="rollout.tensor_model_parallel_size")
    parser.add_argument("--nodes", type=int, default=1, help="trainer.nnodes (8 devices each)")
    parser.add_argument("--moe", action="store_true",
                        help="Qwen3-30B-A3B's real config (../shared/data/models) instead of Qwen2.5's")
    parser.add_argument("overrides", nargs="*", help="more dotted key=value overrides")
    args = parser.parse_args()
    overrides = [f"actor_rollout_ref.rollout.name={args.engine}", "trainer.n_gpus_per_node=8",
                 f"trainer.nnodes={args.nodes}",
                 f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.tp}", *args.overrides]
    print(f"engine {args.engine}, TP {args.tp}, {args.nodes} node(s) x 8 devices")
    print("| model | parameters | device | stays (GiB) | largest phase (GiB) | peak (GiB) "
          "| fits? | host, rank 0's node (GiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in (["Qwen3-30B-A3B"] if args.moe else MODELS):
        for capacity_gb in (80, 64):
            print(row(name, capacity_gb, overrides))


if __name__ == "__main__":
    main()
