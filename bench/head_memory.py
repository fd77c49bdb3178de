"""Peak memory of the update's output head: whole logits vs the chunked head.

The update turns the last hidden states [T, E] into log-probs and entropies
through the output head [V, E]. With whole logits (`model.use_fused_kernels`
off) the [T, V] logits and their softmax and gradients exist at once; the
chunked head (`thinkrl.models.fused_head`, the key on) holds one chunk of
tokens' logits at a time. This times one forward + backward (log-probs and
entropies, the entropy without gradient as in the default recipe) at the
shape of Qwen2.5-0.5B's head (E = 896, V = 151,936) and prints the peak
resident memory above what the inputs and weights take, each case in a
fresh process:

    python bench/head_memory.py                      # 8 responses x 512 tokens, bfloat16
    python bench/head_memory.py --rows 1 2 4 8 --dtype float32

64 responses x 512 tokens with whole logits need ~20 GB of float32 logits
alone: more than this machine's memory; run it where it fits.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

HIDDEN, VOCAB = 896, 151_936  # Qwen2.5-0.5B


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one_case(rows: int, tokens: int, dtype: str, fused: bool) -> dict:
    """Run one forward + backward in this process and measure it."""
    import torch

    from thinkrl.models.fused_head import head_logprobs
    from thinkrl.models.logprobs import entropy_from_logits, logprobs_from_logits

    torch.manual_seed(0)
    hidden = torch.randn(rows, tokens, HIDDEN, requires_grad=True)
    weight = (torch.randn(VOCAB, HIDDEN) * 0.02).requires_grad_()
    labels = torch.randint(0, VOCAB, (rows, tokens))
    base = _rss_mib()
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        if fused:
            logprobs, entropy = head_logprobs(hidden, weight, None, labels, with_entropy=True)
        else:
            logits = torch.nn.functional.linear(hidden, weight)  # what the model's head does
            logprobs = logprobs_from_logits(logits, labels)
            with torch.no_grad():
                entropy = entropy_from_logits(logits)
    (logprobs.sum() + 0 * entropy.sum()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"rows": rows, "tokens": tokens, "dtype": dtype, "fused_head": fused,
            "peak_above_inputs_mib": round(peak - base), "seconds": round(seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--one", nargs=2, metavar=("ROWS", "FUSED"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_case(int(args.one[0]), args.tokens, args.dtype, args.one[1] == "1")))
        return 0
    print(f"output head {VOCAB} x {HIDDEN}, responses of {args.tokens} tokens, {args.dtype}")
    print("rows  logits          peak above inputs   seconds")
    for rows in args.rows:
        for fused in (False, True):
            out = subprocess.run([sys.executable, __file__, "--one", str(rows), str(int(fused)),
                                  "--tokens", str(args.tokens), "--dtype", args.dtype],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{rows:>4}  {'chunked' if fused else 'whole':<14}  failed: "
                      f"{out.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(out.stdout)
            print(f"{rows:>4}  {'chunked' if fused else 'whole':<14}  "
                  f"{r['peak_above_inputs_mib']:>10} MiB      {r['seconds']:>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
