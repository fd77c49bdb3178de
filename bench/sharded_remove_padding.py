"""Seconds per log-prob pass and per update on FSDP2 shards, padded forward
against the shared-prompt pass (`actor_rollout_ref.model.use_remove_padding`),
2 CPU ranks (gloo, one thread each), a GRPO-shaped workload with mixed lengths.

    python bench/sharded_remove_padding.py [--layers 4 --hidden 256 --repeats 3]

Each rank holds 2 prompts x 8 responses (prompts of 40-160 tokens, left-padded;
responses of 8-384 tokens, right-padded, so most columns of a padded row are
padding). Per way and rank it prints the median over `--repeats` of:
- a no-grad log-prob pass (the old-log-prob and reference passes),
- an update: forward and backward of every micro-batch (no optimizer step),
and checks that both ways give the same log-probs on the real tokens.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

GROUPS, N = 2, 8  # per rank: prompts x responses each


def _workload(rank: int, vocab: int, prompt_max: int, response_max: int):
    gen = torch.Generator().manual_seed(100 + rank)
    prompt_lengths = torch.randint(40, prompt_max + 1, (GROUPS,), generator=gen)
    prompt_mask = (torch.arange(prompt_max)[None] >= prompt_max - prompt_lengths[:, None]).long()
    prompts = torch.randint(3, vocab, (GROUPS, prompt_max), generator=gen) * prompt_mask
    lengths = torch.randint(8, response_max + 1, (GROUPS * N,), generator=gen)
    response_mask = (torch.arange(response_max)[None] < lengths[:, None]).long()
    responses = torch.randint(3, vocab, (GROUPS * N, response_max), generator=gen) * response_mask
    ids = torch.cat((prompts.repeat_interleave(N, 0), responses), 1)
    mask = torch.cat((prompt_mask.repeat_interleave(N, 0), response_mask), 1)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_mask.bool()


def _rank(rank: int, store: str, args, out) -> None:
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from thinkrl.models.forward import batched_response_logprobs, response_logprobs
    from thinkrl.parallel import fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=1024))
    fsdp.parallelize(model, compute_dtype=torch.float32)
    ids, mask, pos, real = _workload(rank, args.vocab, args.prompt_max, args.response_max)
    r = real.shape[1]
    micro = args.micro_batch

    def logprob_pass(remove_padding):
        return batched_response_logprobs(model, ids, mask, pos, response_length=r, temperature=1.0,
                                         micro_batch_size=micro, remove_padding=remove_padding)

    def update(remove_padding):
        model.zero_grad()
        for start in range(0, len(ids), micro):
            rows = slice(start, start + micro)
            logp, _ = response_logprobs(model, ids[rows], mask[rows], pos[rows], response_length=r,
                                        temperature=1.0, remove_padding=remove_padding)
            (logp * real[rows]).sum().backward()

    seconds = {}
    results = {}
    for way in (False, True, False, True) + (False, True) * (args.repeats - 1):
        start = time.perf_counter()
        results[way] = logprob_pass(way)
        middle = time.perf_counter()
        update(way)
        seconds.setdefault(way, []).append((middle - start, time.perf_counter() - middle))
    gap = float((results[True][real] - results[False][real]).abs().max())
    for way, times in seconds.items():
        times = times[1:]  # the first of each way warms up
        out.put((way, rank, statistics.median(t for t, _ in times),
                 statistics.median(u for _, u in times), gap,
                 int(mask.numel()), int(mask.sum()), sum(p.numel() for p in model.parameters())))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompt-max", type=int, default=160)
    parser.add_argument("--response-max", type=int, default=384)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as folder:
        store = f"file://{Path(folder) / 'store'}"
        procs = [ctx.Process(target=_rank, args=(r, store, args, out)) for r in range(2)]
        for p in procs:
            p.start()
        rows = sorted(out.get(timeout=1800) for _ in range(4))
        for p in procs:
            p.join()
    _, _, _, _, gap, cells, real, params = rows[0]
    print(f"model: Qwen2, {params / 1e6:.1f}M parameters (whole), {args.layers} layers, "
          f"hidden {args.hidden}; per rank {GROUPS} prompts x {N} responses, "
          f"{real} of {cells} padded cells real (rank 0)")
    print(f"{'forward':<22}{'rank':>5}{'log-prob pass s':>17}{'update s':>10}")
    for way, rank, logprob_s, update_s, *_ in rows:
        name = "shared-prompt pass" if way else "padded"
        print(f"{name:<22}{rank:>5}{logprob_s:>17.3f}{update_s:>10.3f}")
    slow = {w: max(r[3] for r in rows if r[0] == w) for w in (False, True)}
    slow_lp = {w: max(r[2] for r in rows if r[0] == w) for w in (False, True)}
    print(f"slowest rank, padded / shared: log-prob pass {slow_lp[False] / slow_lp[True]:.2f}x, "
          f"update {slow[False] / slow[True]:.2f}x")
    print(f"largest log-prob gap on real tokens: {max(r[4] for r in rows):.2e}")


if __name__ == "__main__":
    main()
