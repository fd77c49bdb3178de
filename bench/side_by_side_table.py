"""The thinkrl / TRL table of docs/benchmarks.md, from `../shared/bench/side_by_side.sh` output.

    TRL_PY=$TRLVENV/bin/python TK_PY=.venv/bin/python THINKRL=. WORK=$WORK REPS=3 THREADS=1 \\
        OUT=$WORK/speed.jsonl bash ../shared/bench/side_by_side.sh small:16 small:64 medium:16 medium:64
    python bench/side_by_side_table.py $WORK/speed.jsonl

Per workload (model size : response tokens; 8 prompts x 8 samples, KL to a
reference, one optimizer step): the medians over repetitions of each
system's median seconds per step, the median of the paired ratios (rep r's
thinkrl run over rep r's TRL run, which ran just before it), thinkrl's stage
split, the share of the machine's matmul rate each system reached, peak
memory and the matmul probe range (GFLOP/s of a 512^3 float32 product,
before and after each thinkrl run: low or spread readings mean foreign load).

Share of the matmul rate: the step's nominal matrix-product work over
(seconds x probe), the work being 2 W FLOPs per token per forward pass (W =
the weights of every linear layer and the output head) over N (P + R)
tokens for the reference, 3x that for the update (forward + backward) and
N R for generation; attention is left out. Both systems get the same
nominal work, so the shares compare like the speeds do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

# side_by_side.sh's model sizes (trl_grpo_cpu.MODEL_SIZES) and vocabulary.
SIZES = {"small": (128, 512, 4), "medium": (256, 1024, 10)}  # hidden, intermediate, layers
VOCAB, RESPONSES = 48, 64


def linear_weights(size: str) -> int:
    """W: q, k, v, o (as many key/value heads as heads), gate, up, down per layer, and the head."""
    hidden, inter, layers = SIZES[size]
    return layers * (4 * hidden * hidden + 3 * hidden * inter) + VOCAB * hidden


def nominal_gflop(size: str, prompt_tokens: float, response_tokens: int) -> dict[str, float]:
    """Matrix-product work of one step, GFLOP, by stage (see the module docstring)."""
    per_token = 2 * linear_weights(size) / 1e9
    sequence = RESPONSES * (prompt_tokens + response_tokens)
    return {"gen": per_token * RESPONSES * response_tokens, "ref": per_token * sequence,
            "update": 3 * per_token * sequence}


def load(path: str) -> dict[tuple[str, int], dict[str, dict[int, dict]]]:
    runs: dict = defaultdict(lambda: {"trl": {}, "thinkrl": {}})
    for line in open(path):
        rec = json.loads(line)
        if rec["bench"] == "thinkrl_grpo_step":
            runs[(rec["model_size"], rec["completion_len"])]["thinkrl"][rec["rep"]] = rec
        else:
            size = rec["config"]["model_size"]
            rep = int(rec["tag"].rsplit("-r", 1)[1])
            runs[(size, rec["config"]["max_completion_length"])]["trl"][rep] = rec
    return runs


def row(size: str, length: int, trl: dict[int, dict], tk: dict[int, dict]) -> dict:
    reps = sorted(set(trl) & set(tk))
    med = statistics.median
    trl_s = med(trl[r]["seconds_per_step_median"] for r in reps)
    tk_s = med(tk[r]["seconds_per_step_median"] for r in reps)
    ratio = med(tk[r]["seconds_per_step_median"] / trl[r]["seconds_per_step_median"] for r in reps)
    stages = {s: med(tk[r]["stage_median_s"][s] for r in reps) for s in ("gen", "ref", "update_actor")}
    prompt = med(statistics.mean(tk[r]["prompt_tokens_per_step"]) / RESPONSES for r in reps)
    work = sum(nominal_gflop(size, prompt, length).values())
    probes = [p for r in reps for p in (tk[r]["probe_gflops_before"], tk[r]["probe_gflops_after"])]
    probe = med(probes)
    return {
        "workload": f"{size}:{length}", "pairs": len(reps), "trl_s": trl_s, "thinkrl_s": tk_s,
        "ratio": ratio, "ratios": [tk[r]["seconds_per_step_median"] / trl[r]["seconds_per_step_median"]
                                   for r in reps],
        "split": {s: v / tk_s for s, v in stages.items()},
        "share_thinkrl": work / tk_s / probe, "share_trl": work / trl_s / probe,
        "peak_thinkrl_mib": med(tk[r]["info"]["peak_memory_bytes"] for r in reps) / 2**20,
        "peak_trl_mib": med(trl[r]["peak_rss_mb"] for r in reps),
        "probe_min": min(probes), "probe_max": max(probes),
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| workload | pairs | TRL s/step | thinkrl s/step | thinkrl/TRL (paired median; each) "
             "| thinkrl gen / ref / update | matmul-rate share thinkrl / TRL | peak RSS MiB thinkrl / TRL "
             "| probe GFLOP/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        split = " / ".join(f"{100 * r['split'][s]:.0f}%" for s in ("gen", "ref", "update_actor"))
        each = ", ".join(f"{x:.2f}" for x in r["ratios"])
        lines.append(
            f"| {r['workload']} | {r['pairs']} | {r['trl_s']:.3f} | {r['thinkrl_s']:.3f} "
            f"| **{r['ratio']:.2f}** ({each}) | {split} "
            f"| {100 * r['share_thinkrl']:.0f}% / {100 * r['share_trl']:.0f}% "
            f"| {r['peak_thinkrl_mib']:.0f} / {r['peak_trl_mib']:.0f} "
            f"| {r['probe_min']:.0f}-{r['probe_max']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", help="side_by_side.sh's OUT file")
    args = parser.parse_args(argv)
    runs = load(args.jsonl)
    order = sorted(runs, key=lambda k: (list(SIZES).index(k[0]), k[1]))
    rows = [row(size, length, runs[(size, length)]["trl"], runs[(size, length)]["thinkrl"])
            for size, length in order
            if set(runs[(size, length)]["trl"]) & set(runs[(size, length)]["thinkrl"])]
    if not rows:
        print(f"no paired runs in {args.jsonl}", file=sys.stderr)
        return 2
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
