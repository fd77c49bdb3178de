"""Peak host memory of each rank while a model is built and sharded over 2
CPU ranks (gloo, FSDP2): every rank reading the whole model (the build
before issue 23), against rank 0 reading it and broadcasting the shards
(`thinkrl.parallel.fsdp.build_model`, what the ray backend does now).

    python bench/sharded_build_memory.py [--layers 12 --hidden 768]

Each way runs in fresh processes (peak RSS is per process lifetime). It also
checks that both ways give every rank the same shards.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _memory_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak) of this process, from /proc (Linux);
    unlike getrusage's maximum it starts afresh in a spawned process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**10
    raise RuntimeError(f"no {field} in /proc/self/status")


def _rank(rank: int, store: str, folder: str, way: str, out) -> None:
    import torch.distributed as dist

    from thinkrl.models.loading import causal_lm_skeleton, load_causal_lm
    from thinkrl.parallel import fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=store, rank=rank, world_size=2)
    cpu = torch.device("cpu")
    before = _memory_mib("VmRSS")  # imports, process group
    start = time.perf_counter()

    def shard(model):
        fsdp.parallelize(model, compute_dtype=torch.float32)

    if way == "every rank reads":
        model = load_causal_lm(folder, dtype=torch.float32, device=cpu)
        shard(model)
    else:
        model = fsdp.build_model(lambda on: load_causal_lm(folder, dtype=torch.float32, device=on),
                                 lambda: causal_lm_skeleton(folder, dtype=torch.float32),
                                 prepare=lambda _: None, shard=shard, device=cpu)
    seconds = time.perf_counter() - start
    local = sum(p.to_local().numel() for p in model.parameters())
    checksum = float(sum(p.detach().to_local().double().sum() for p in model.parameters()))
    peak = _memory_mib("VmHWM")
    out.put((way, rank, before, peak, seconds, local, checksum))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    args = parser.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tmp = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                         num_hidden_layers=args.layers, num_attention_heads=12, num_key_value_heads=4,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    # Saved in bfloat16, as released checkpoints are, and trained in float32:
    # every copy a rank makes is its own memory, not the file's shared page cache.
    model.to(torch.bfloat16).save_pretrained(tmp / "model")
    del model
    print(f"model: Qwen2, {params / 1e6:.0f}M parameters, saved in bfloat16, "
          f"{params * 4 / 2**20:.0f} MiB in float32 ({params * 2 / 2**20:.0f} MiB per rank's shard)")
    ctx = mp.get_context("spawn")
    rows = []
    for i, way in enumerate(("every rank reads", "rank 0 reads, shards broadcast")):
        out = ctx.Queue()
        store = f"file://{tmp}/store{i}"
        procs = [ctx.Process(target=_rank, args=(r, store, str(tmp / "model"), way, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        got = sorted(out.get(timeout=600) for _ in procs)
        for p in procs:
            p.join()
        rows.extend(got)
    print(f"{'build':32s} {'rank':>4s} {'RSS before':>10s} {'peak':>6s} {'peak - before':>13s} "
          f"{'seconds':>8s} {'local params':>13s}   (MiB)")
    for way, rank, before, peak, seconds, local, _ in rows:
        print(f"{way:32s} {rank:4d} {before:10.0f} {peak:6.0f} {peak - before:13.0f} "
              f"{seconds:8.1f} {local:13,d}")
    sums = {(r[1]): set() for r in rows}
    for way, rank, *_, checksum in rows:
        sums[rank].add(round(checksum, 6))
    same = all(len(s) == 1 for s in sums.values())
    print("same shards both ways:", same)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
