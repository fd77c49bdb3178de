"""How a vLLM engine gets a LoRA policy after each update, both ways: the
adapter alone for vLLM to serve (the default) or the base with it merged in
(`actor_rollout_ref.model.lora.merge=True`). Per sync: bytes handed to the
engine, seconds to send them, seconds of the attestation (merged: every
weight read back; adapter: the adapter's slots, and the base only at the
first sync: `first_attest_s`), then the engine's decoding speed either way.

    .venv-vllm/bin/python bench/lora_sync.py [--rank 16] [--repeats 3] [--device cpu] [--enforce-eager]

Model: a ~110M Qwen2 (hidden 768, 12 layers, bench/lora_memory.py's shape,
untied head), random weights, adapters on all seven projections with random
A and B. Generation: 8 prompts of 32-48 tokens x 8 samples x 64 tokens
(bench/rollout_engines.py's workload). Each mode starts its own engine;
syncs are timed `--repeats` times after one warm-up; medians, one JSON line
per mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=512,
             tie_word_embeddings=False, eos_token_id=1, pad_token_id=0)


def lora_model(folder: str, rank: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thinkrl.models.lora import LoraSettings, attach_lora
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    model.save_pretrained(folder)
    lora = attach_lora(model, LoraSettings(rank=rank, alpha=2 * rank, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.02)
    return model.eval(), lora


def timed(function) -> tuple[float, object]:
    start = time.perf_counter()
    out = function()
    return time.perf_counter() - start, out


def run_mode(merge: bool, folder: str, model, lora, args) -> dict:
    from rollout_engines import PROMPTS, SAMPLES, TOKENS, prompt_batch  # bench/ is on the path
    from thinkrl.config import Config
    from thinkrl.models.lora import base_tensors, is_adapter_tensor, merged_tensors
    from thinkrl.rollout.attest import check_served, served_by_engine
    from thinkrl.rollout.base import SamplingParams
    from thinkrl.rollout.vllm_engine import VllmEngine
    from thinkrl.rollout.weight_sync import full_state_tensors

    cfg = Config()
    cfg.actor_rollout_ref.rollout.load_format = "dummy"
    cfg.actor_rollout_ref.rollout.enforce_eager = args.enforce_eager
    rank = lora.config.r
    start, engine = timed(lambda: VllmEngine.start(
        cfg, model_path=folder, max_model_len=256, eos_token_ids=[1], pad_token_id=0, seed=0,
        device_kind=args.device, lora_rank=0 if merge else rank))
    base = None if merge else engine.update_weights(base_tensors(full_state_tensors(model)))
    sent_bytes = 0

    def named():
        nonlocal sent_bytes
        source = (merged_tensors(full_state_tensors(model), lora.scalings()) if merge
                  else full_state_tensors(model, keep=is_adapter_tensor))
        sent_bytes = 0
        for name, tensor in source:
            sent_bytes += tensor.numel() * engine.dtype.itemsize
            yield name, tensor

    def sync(first: bool):
        """As PolicyRank.sync_engine: merged weights, or the adapter (with the
        base's digests at the first sync only, when the base is read back too)."""
        if merge:
            return engine.update_weights(named())
        adapter = engine.update_adapter(named(), lora.scalings())
        return adapter.include(base) if first else adapter

    sync_s, attest_s = [], []
    for i in range(args.repeats + 1):
        seconds, sent = timed(lambda: sync(first=i == 0))
        attest, served = timed(lambda: engine.served(adapter_only=not merge and i > 0))
        check_served(sent, served_by_engine(served, sent), engine="bench", version=i)
        if i == 0:
            first_attest = attest
        else:  # the first is a warm-up
            sync_s.append(seconds)
            attest_s.append(attest)
    prompts = prompt_batch(SHAPE["vocab_size"])
    params = SamplingParams(n=SAMPLES, max_tokens=TOKENS, ignore_eos=True)
    engine.generate(prompts, params)  # warm-up
    gen_s = [timed(lambda: engine.generate(prompts, params))[0] for _ in range(args.repeats)]
    engine.close()
    return {"mode": "merged" if merge else "adapter", "rank": rank, "device": args.device,
            "enforce_eager": args.enforce_eager,
            "engine_start_s": round(start, 1), "sent_MiB_per_sync": round(sent_bytes / 2**20, 2),
            "sync_s": round(statistics.median(sync_s), 3), "attest_s": round(statistics.median(attest_s), 3),
            "first_attest_s": round(first_attest, 3),
            "decode_tokens_per_s": round(PROMPTS * SAMPLES * TOKENS / statistics.median(gen_s), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="no torch.compile in either engine (vLLM compiles the merged one only)")
    parser.add_argument("--modes", nargs="+", default=["adapter", "merged"], choices=["adapter", "merged"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        model, lora = lora_model(folder, args.rank)
        for mode in args.modes:
            print(json.dumps(run_mode(mode == "merged", folder, model, lora, args)), flush=True)


if __name__ == "__main__":
    main()
