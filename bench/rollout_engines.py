"""Tokens per second of the rollout engines, `native` and `vllm`, on the same weights.

Workload: 8 prompts (32-48 random tokens) x 8 samples x exactly 64 response
tokens (ignore_eos), temperature 1, as in bench/grpo_step.py. Models are
made from a Qwen2 config (random weights; speed does not depend on them):

    small   hidden 128, 4 layers, 4 heads of 32, vocab 512      (~1M parameters)
    medium  hidden 384, 6 layers, 6 heads of 64, vocab 4096     (~12M parameters)

Run in the venv that has vLLM (`make test-vllm` builds .venv-vllm):

    .venv-vllm/bin/python bench/rollout_engines.py --sizes small medium --repeats 3
    .venv-vllm/bin/python bench/rollout_engines.py --device cuda --sizes medium   # on a GPU

Each engine generates once to warm up (vLLM compiles and profiles then),
then `--repeats` times; the median is reported. vLLM's start-up time is
printed apart. One JSON line per (size, engine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

SIZES = {
    "small": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "medium": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                   num_attention_heads=6, num_key_value_heads=2, vocab_size=4096),
}
PROMPTS, SAMPLES, TOKENS = 8, 8, 64


def make_model(size: str, folder: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**SIZES[size], max_position_embeddings=512,
                                         tie_word_embeddings=False, eos_token_id=1,
                                         pad_token_id=0))
    model.save_pretrained(folder)
    return model.eval()


def prompt_batch(vocab: int):
    from thinkrl.records import PromptBatch, Sample
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(32, 49, (PROMPTS,), generator=g).tolist()
    width = max(lengths)
    ids = torch.zeros(PROMPTS, width, dtype=torch.long)
    mask = torch.zeros(PROMPTS, width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(2, vocab, (n,), generator=g)
        mask[row, width - n:] = 1
    return PromptBatch(ids, mask, [Sample("bench", "", "", index=i) for i in range(PROMPTS)])


def time_engine(engine, prompts, repeats: int) -> list[float]:
    from thinkrl.rollout.base import SamplingParams
    params = SamplingParams(n=SAMPLES, max_tokens=TOKENS, ignore_eos=True)
    engine.generate(prompts, params)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, params)
        seconds.append(time.perf_counter() - start)
        assert out.response_mask.sum() == PROMPTS * SAMPLES * TOKENS
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "medium"], choices=sorted(SIZES))
    parser.add_argument("--engines", nargs="+", default=["native", "vllm"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    from thinkrl.config import Config
    from thinkrl.rollout.native import NativeEngine

    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            model = make_model(size, folder).to(args.device)
            prompts = prompt_batch(SIZES[size]["vocab_size"])
            for name in args.engines:
                start = time.perf_counter()
                if name == "native":
                    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=0, seed=0,
                                          device=torch.device(args.device))
                else:
                    from thinkrl.rollout.vllm_engine import VllmEngine
                    cfg = Config()
                    cfg.actor_rollout_ref.rollout.dtype = "float32"
                    cfg.actor_rollout_ref.rollout.load_format = "auto"
                    engine = VllmEngine.start(cfg, model_path=folder, max_model_len=256,
                                              eos_token_ids=[1], pad_token_id=0, seed=0,
                                              device_kind=args.device)
                startup = time.perf_counter() - start
                seconds = time_engine(engine, prompts, args.repeats)
                median = statistics.median(seconds)
                print(json.dumps({
                    "size": size, "engine": name, "device": args.device,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "threads": torch.get_num_threads(), "startup_s": round(startup, 2),
                    "seconds": [round(s, 3) for s in seconds], "median_s": round(median, 3),
                    "tokens_per_s": round(PROMPTS * SAMPLES * TOKENS / median, 1)}), flush=True)
                if hasattr(engine, "close"):
                    engine.close()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
