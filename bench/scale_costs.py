"""Per-save and per-step costs that grow with the model, at Qwen2.5-0.5B and
-1.5B shapes (random float32 weights: the costs do not depend on the values),
before and after issue 37's changes:

- hash: sha256 of a checkpoint's files (model.safetensors at 4 bytes and
  AdamW's moments at 8 bytes a parameter, the single-process layout),
  one core after another (before) against `file_digests` (every core,
  1 GiB pieces);
- guard: the divergence guard's weight statistics, float64 copies (before)
  against `parameter_stats` (one float32 reduction per tensor), with the
  peak of resident memory above the model's;
- attest: the trainer side's digests of a weight sync (cast to bfloat16 as
  for a bfloat16 engine), every tensor (stride 1) against
  `rollout.attest_stride=4`, mean and max over 4 syncs.

    .venv/bin/python bench/scale_costs.py --shape 0.5b [--what hash guard attest] [--dir /tmp]

Prints one JSON line per measurement (median of --repeats).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

SHAPES = {  # the public configs' sizes (Qwen2.5-0.5B/1.5B; tied embeddings)
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936),
}


def random_qwen2(shape: dict, **config) -> torch.nn.Module:
    """A Qwen2 of `shape` (tied embeddings, more `config` keys on top) with
    N(0, 0.02) float32 weights, made on the meta device and filled: seconds,
    where transformers' own initialisation takes a minute at 1.5B on a CPU."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **shape, **config))
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gave the head a tensor of its own
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=generator)
    return model.requires_grad_(False)


def parameter_count(shape: dict) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    with torch.device("meta"):
        return sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **shape)).parameters())


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_above(fn) -> tuple[float, float, int]:
    """(seconds, result, peak RSS above the start in bytes), RSS sampled every 2 ms."""
    start, peak, done = rss(), [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss() - start)
            time.sleep(0.002)
    watcher = threading.Thread(target=watch)
    watcher.start()
    began = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - began
    done.set()
    watcher.join()
    return seconds, result, peak[0]


def serial_sha256(folder: Path) -> dict:
    """Before: one file after another, one core, whole-file sha256."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        out[path.name] = digest.hexdigest()
    return out


def float64_stats(model: torch.nn.Module) -> float:
    """Before: the guard's formula until issue 37 (a float64 copy of each tensor)."""
    square_sum = 0.0
    for p in model.parameters():
        bool(torch.isfinite(p).all())
        square_sum += float(p.detach().double().pow(2).sum())
    return square_sum


def measure_hash(shape: str, params: int, repeats: int, where: str) -> None:
    from thinkrl.checkpoint.verify import file_digests
    with tempfile.TemporaryDirectory(dir=where, prefix="thinkrl-hash-") as tmp:
        folder = Path(tmp)
        block = os.urandom(64 << 20)
        for name, size in (("model.safetensors", 4 * params), ("optimizer.pt", 8 * params)):
            with (folder / name).open("wb") as f:
                for start in range(0, size, len(block)):
                    f.write(block[:min(len(block), size - start)])
        total = sum(p.stat().st_size for p in folder.iterdir())
        for label, fn in (("serial", serial_sha256), ("threads", file_digests)):
            times = [peak_above(lambda: fn(folder))[0] for _ in range(repeats)]
            report(shape, "hash", label, seconds=statistics.median(times), bytes=total,
                   gib_per_s=total / 2**30 / statistics.median(times))


def measure_guard(shape: str, model: torch.nn.Module, repeats: int) -> None:
    from thinkrl.parallel.fsdp import parameter_stats
    for label, fn in (("float64", lambda: float64_stats(model)),
                      ("float32", lambda: parameter_stats(model)["square_sum"])):
        runs = [peak_above(fn) for _ in range(repeats)]
        report(shape, "guard", label, seconds=statistics.median(r[0] for r in runs),
               square_sum=runs[0][1], peak_extra_mib=max(r[2] for r in runs) / 2**20)


def measure_attest(shape: str, model: torch.nn.Module, repeats: int) -> None:
    from thinkrl.rollout.attest import AttestShare, Ledger, recording
    weights = list(model.state_dict().items())
    for stride in (1, 4):
        times = []
        for version in range(4):  # a stride-4 share each
            ledger = Ledger()
            for _ in recording(weights, ledger, dtype=torch.bfloat16, share=AttestShare.of(stride, version)):
                pass
            times.append(ledger.seconds)
        report(shape, "attest", f"stride {stride}", seconds_mean=statistics.mean(times),
               seconds_max=max(times))


def report(shape: str, what: str, label: str, **values) -> None:
    print(json.dumps({"shape": shape, "what": what, "variant": label, "threads": torch.get_num_threads(),
                      "cores": os.cpu_count(), **{k: round(v, 4) if isinstance(v, float) else v
                                                  for k, v in values.items()}}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--what", nargs="+", choices=["hash", "guard", "attest"], default=["hash", "guard", "attest"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the checkpoint files are written")
    args = parser.parse_args()
    if "hash" in args.what:  # before the model exists: the files, not the model, in memory
        measure_hash(args.shape, parameter_count(SHAPES[args.shape]), args.repeats, args.dir)
    if {"guard", "attest"} & set(args.what):
        model = random_qwen2(SHAPES[args.shape])
        if "guard" in args.what:
            measure_guard(args.shape, model, args.repeats)
        if "attest" in args.what:
            measure_attest(args.shape, model, args.repeats)


if __name__ == "__main__":
    main()
