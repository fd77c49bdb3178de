"""Tokens per second of the rollout engines, `native` and `vllm`, and of transformers'
`generate` (`hf`), on the same weights.

Workload: 8 prompts (32-48 random tokens) x 8 samples x exactly 64 response
tokens (ignore_eos), temperature 1, as in bench/grpo_step.py. Models are
made from a Qwen2 config (random weights; speed does not depend on them):

    small   hidden 128, 4 layers, 4 heads of 32, vocab 512      (~1M parameters)
    medium  hidden 384, 6 layers, 6 heads of 64, vocab 4096     (~12M parameters)

Run in the venv that has vLLM (`make test-vllm` builds .venv-vllm):

    .venv-vllm/bin/python bench/rollout_engines.py --sizes small medium --repeats 3
    .venv-vllm/bin/python bench/rollout_engines.py --device cuda --sizes medium   # on a GPU
    .venv/bin/python bench/rollout_engines.py --engines native hf --dtype bfloat16

`--dtype bfloat16` runs `native` and `hf` under bfloat16 autocast (vLLM in
its own bfloat16). `--eos-share 0.03` (native only) makes the lowest 3 % of
the vocabulary stop ids instead of running every row to 64 tokens: uneven
lengths, so finished rows leave the batch as with a real model; tokens/s
then counts the tokens generated.

Each engine generates once to warm up (vLLM compiles and profiles then),
then `--repeats` times; the median is reported. vLLM's start-up time is
printed apart. One JSON line per (size, engine).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
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


class HfGenerate:
    """transformers' `generate` with the same work: G samples per prompt,
    exactly TOKENS new tokens, temperature 1, no top-k/top-p."""

    def __init__(self, model, autocast) -> None:
        self.model, self.autocast = model, autocast

    @torch.no_grad()
    def generate(self, prompts, params):
        device = next(self.model.parameters()).device
        with self.autocast():
            out = self.model.generate(
                input_ids=prompts.input_ids.to(device), attention_mask=prompts.attention_mask.to(device),
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=params.n,
                max_new_tokens=params.max_tokens, min_new_tokens=params.max_tokens, pad_token_id=0)
        responses = out[:, prompts.input_ids.shape[1]:]
        return type("Out", (), {"response_mask": torch.ones_like(responses)})()


def time_engine(engine, prompts, repeats: int, autocast=contextlib.nullcontext,
                stop: bool = False) -> tuple[list[float], int]:
    """Seconds of each repeat, and the tokens one call generates."""
    from thinkrl.rollout.base import SamplingParams
    params = SamplingParams(n=SAMPLES, max_tokens=TOKENS, ignore_eos=not stop)
    with autocast():
        engine.generate(prompts, params)  # warm-up
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        with autocast():
            out = engine.generate(prompts, params)
        seconds.append(time.perf_counter() - start)
        assert stop or out.response_mask.sum() == PROMPTS * SAMPLES * TOKENS
    return seconds, int(out.response_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "medium"], choices=sorted(SIZES))
    parser.add_argument("--engines", nargs="+", default=["native", "vllm"],
                        choices=["native", "vllm", "hf"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--eos-share", type=float, default=0.0)
    args = parser.parse_args()
    if args.eos_share and args.engines != ["native"]:
        parser.error("--eos-share measures the native engine only (--engines native)")
    from thinkrl.config import Config
    from thinkrl.rollout.native import NativeEngine

    for size in args.sizes:
        with tempfile.TemporaryDirectory() as folder:
            model = make_model(size, folder).to(args.device)
            prompts = prompt_batch(SIZES[size]["vocab_size"])
            bf16 = args.dtype == "bfloat16"
            autocast = functools.partial(torch.autocast, args.device, dtype=torch.bfloat16,
                                         enabled=bf16)
            for name in args.engines:
                start = time.perf_counter()
                if name == "hf":
                    engine = HfGenerate(model, autocast)
                elif name == "native":
                    stops = max(1, int(args.eos_share * SIZES[size]["vocab_size"]))
                    engine = NativeEngine(model, eos_token_ids=list(range(1, 1 + stops)),
                                          pad_token_id=0, seed=0,
                                          device=torch.device(args.device))
                else:
                    from thinkrl.rollout.vllm_engine import VllmEngine
                    cfg = Config()
                    cfg.actor_rollout_ref.rollout.dtype = args.dtype
                    cfg.actor_rollout_ref.rollout.load_format = "auto"
                    engine = VllmEngine.start(cfg, model_path=folder, max_model_len=256,
                                              eos_token_ids=[1], pad_token_id=0, seed=0,
                                              device_kind=args.device)
                startup = time.perf_counter() - start
                seconds, tokens = time_engine(engine, prompts, args.repeats,
                                              autocast if name == "native" else contextlib.nullcontext,
                                              stop=bool(args.eos_share))
                median = statistics.median(seconds)
                print(json.dumps({
                    "size": size, "engine": name, "device": args.device, "dtype": args.dtype,
                    "eos_share": args.eos_share, "tokens": tokens,
                    "parameters": sum(p.numel() for p in model.parameters()),
                    "threads": torch.get_num_threads(), "startup_s": round(startup, 2),
                    "seconds": [round(s, 3) for s in seconds], "median_s": round(median, 3),
                    "tokens_per_s": round(tokens / median, 1)}), flush=True)
                if hasattr(engine, "close"):
                    engine.close()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
