"""A tiny mixture-of-experts step against the same-size dense step, on this machine.

    python bench/moe_step.py [--steps 3] [--warmup 1] [--out /tmp/moe_bench] [--replay]

Makes two random models with the built-in tiny model's tokenizer and the same
attention (hidden 256, 4 layers, 8 heads, 2 key/value heads): a Qwen3-MoE
with 16 experts of width 128, 4 active (the active MLP width 512), and a
dense Qwen3 with an MLP of width 512 (the same active parameters per token,
a quarter of the MoE's MLP parameters). Each runs `bench/grpo_step.py`'s fixed
GRPO workload (8 prompts x 8 samples x 64 tokens, the shared-prompt pass, the
native engine's slot decoder) in a process of its own; the table is its
tokens per second and stage times side by side. `--replay` adds the MoE with
router replay R3 (recorded in the rollout, replayed in the trainer's padded
forward).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
             tie_word_embeddings=False, max_position_embeddings=512)
EXPERTS, ACTIVE, EXPERT_WIDTH = 16, 4, 128


def make_models(out: Path) -> dict[str, Path]:
    """The MoE and the dense model, with the tiny model's tokenizer, saved once."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from thinkrl.builtin import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny-qwen2", log=lambda *_: None))
    common = dict(SHAPE, vocab_size=64 * -(-len(tokenizer) // 64), eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    configs = {"moe": Qwen3MoeConfig(num_experts=EXPERTS, num_experts_per_tok=ACTIVE,
                                     moe_intermediate_size=EXPERT_WIDTH, intermediate_size=ACTIVE * EXPERT_WIDTH,
                                     norm_topk_prob=True, **common),
               "dense": Qwen3Config(intermediate_size=ACTIVE * EXPERT_WIDTH, **common)}
    folders = {}
    for name, config in configs.items():
        folder = out / name
        if not (folder / "config.json").exists():
            torch.manual_seed(0)
            model = (Qwen3MoeForCausalLM if name == "moe" else Qwen3ForCausalLM)(config)
            if name == "moe":
                with torch.no_grad():
                    for layer in model.model.layers:
                        layer.mlp.gate.weight.normal_(0, 0.1)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        folders[name] = folder
    return folders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("/tmp/moe_bench"))
    parser.add_argument("--replay", action="store_true")
    args = parser.parse_args()
    folders = make_models(args.out)
    arms = [("dense", folders["dense"], []), ("moe", folders["moe"], [])]
    if args.replay:
        arms.append(("moe + R3", folders["moe"], ["actor_rollout_ref.actor.router_replay.mode=R3"]))
    results = {}
    for name, folder, extra in arms:
        path = args.out / f"{name.replace(' ', '').replace('+', '_')}.json"
        subprocess.run([sys.executable, str(Path(__file__).with_name("grpo_step.py")), "--steps", str(args.steps),
                        "--warmup", str(args.warmup), "--json", str(path),
                        f"actor_rollout_ref.model.path={folder}", *extra], check=True, stdout=subprocess.DEVNULL)
        results[name] = json.loads(path.read_text())
    rows = {"parameters (M)": lambda r: r["info"]["parameters"] / 1e6,
            "step s (mean)": lambda r: r["result"]["step_s_mean"],
            "generation tokens/s": lambda r: r["result"]["gen_tokens_per_s"],
            "overall tokens/s": lambda r: r["result"]["total_tokens_per_s"],
            **{f"{stage} s": (lambda r, s=stage: r["result"]["stages_s"][s])
               for stage in ("gen", "old_log_prob", "ref", "update_actor")}}
    print("| | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for label, read in rows.items():
        print(f"| {label} | " + " | ".join(f"{read(r):.2f}" for r in results.values()) + " |")


if __name__ == "__main__":
    main()
