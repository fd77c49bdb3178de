"""Reward scoring throughput: responses per second for each built-in scorer,
in the trainer process (num_workers=0) and through the worker pool.

Inputs are real reference solutions from ../shared/data:
- gsm8k: the 1,319 GSM8K test solutions (`... #### N`);
- math:  the 500 MATH-500 solutions (`... \\boxed{...}`);
- r1:    the MATH-500 solutions rewritten as `<think>solution</think><answer>answer</answer>`.
Each set is scored twice: against its own answer ("right": most answers equal
the ground truth as strings, a shortcut) and against the next row's answer
("wrong": math-verify must parse and compare both).

    python bench/reward_throughput.py                 # all rows, pool of 2
    python bench/reward_throughput.py --limit 200 --workers 2 4

Pool start-up (fork server + workers ready) is timed separately and excluded
from the pool's rate; so is parsing the data. sympy keeps caches of its own
across calls, so an r1 row measured after the math rows in the same process
is flattered; `--scorers r1` alone gives its cold rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _datasets(limit: int | None) -> dict[str, tuple[str, list[str], list[str]]]:
    """scorer -> (data_source, responses, answers)."""
    gsm = [json.loads(line) for line in (SHARED / "gsm8k" / "test.jsonl").open(encoding="utf-8")]
    math = [json.loads(line) for line in (SHARED / "math500" / "test.jsonl").open(encoding="utf-8")]
    gsm, math = gsm[:limit], math[:limit]
    return {
        "gsm8k": ("openai/gsm8k", [r["answer"] for r in gsm],
                  [r["answer"].split("####")[-1].strip() for r in gsm]),
        "math": ("HuggingFaceH4/MATH-500", [r["solution"] for r in math], [r["answer"] for r in math]),
        "r1": ("HuggingFaceH4/MATH-500",
               [f"<think>\n{r['solution']}\n</think>\n<answer>{r['answer']}</answer>" for r in math],
               [r["answer"] for r in math]),
    }


def _start_up_costs() -> None:
    """Seconds until a pool's workers are ready: the first pool of a process
    (forkserver: the server starts and imports the worker module), then a
    one-worker pool once the server runs (what replacing a killed worker costs)."""
    from thinkrl.rewards.pool import ScoringPool
    from thinkrl.rewards.reward_fn import RewardFnSpec

    print(f"{'start method':<12} {'first pool x2 s':>15} {'next worker s':>13}")
    for method in ("forkserver", "spawn"):
        times = []
        for workers in (2, 1):
            pool = ScoringPool(RewardFnSpec(), num_workers=workers, timeout_s=10, start_method=method)
            pool.start()
            times.append(pool.start_seconds)
            pool.close()
        print(f"{method:<12} {times[0]:>15.2f} {times[1]:>13.3f}")
    print()


def main() -> None:
    # Imported here, not at the top: pool workers re-import this script (as
    # multiprocessing does with __main__) and must not pay for torch.
    from thinkrl.records import Sample
    import math_verify.parser as mv_parser

    from thinkrl.rewards.math import _parse_gold as parsed_ground_truths
    from thinkrl.rewards.reward_fn import RewardFnSpec
    from thinkrl.rewards.scorer import RewardScorer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="rows per data set (default all)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="pool sizes to time")
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--scorers", nargs="+", default=["gsm8k", "math", "r1"],
                        choices=["gsm8k", "math", "r1"], help="which scorers to time")
    args = parser.parse_args()
    if not SHARED.is_dir():
        raise SystemExit(f"{SHARED} is absent: this benchmark needs the shared data")

    print(f"# reward throughput  python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f}")
    _start_up_costs()
    rows = []
    for name, (source, responses, answers) in _datasets(args.limit).items():
        if name not in args.scorers:
            continue
        for case, truths in (("right", answers), ("wrong", answers[1:] + answers[:1])):
            samples = [Sample(data_source=source, ground_truth=t, prompt_text="", index=i)
                       for i, t in enumerate(truths)]
            spec = RewardFnSpec(scorer=name)
            reference = None
            for workers in [0, *args.workers]:
                # every mode starts cold, as a fresh worker does (ours and math-verify's caches)
                for cache in (parsed_ground_truths, mv_parser.parse_latex_cached, mv_parser.parse_expr_cached):
                    cache.cache_clear()
                with RewardScorer(spec, num_workers=workers, timeout_s=args.timeout_s) as scorer:
                    start_s = 0.0
                    if workers:
                        scorer.start()
                        start_s = scorer.pool.start_seconds
                    begin = time.perf_counter()
                    result = scorer.score(responses, samples)
                    seconds = time.perf_counter() - begin
                if reference is None:
                    reference = result.scores.tolist()
                assert result.scores.tolist() == reference, f"{name}/{case}: pool != inline"
                mode = "inline" if workers == 0 else f"pool x{workers}"
                rows.append((name, case, mode, len(responses), seconds, len(responses) / seconds,
                             start_s, float(result.scores.mean()), result.errors + result.timeouts))
    print(f"{'scorer':<7} {'answers':<7} {'mode':<8} {'n':>5} {'seconds':>8} {'resp/s':>9} "
          f"{'start s':>8} {'mean score':>10} {'failed':>6}")
    for name, case, mode, n, seconds, rate, start_s, mean, failed in rows:
        start = f"{start_s:8.2f}" if start_s else f"{'-':>8}"
        print(f"{name:<7} {case:<7} {mode:<8} {n:>5} {seconds:>8.2f} {rate:>9.0f} {start} "
              f"{mean:>10.3f} {failed:>6}")


if __name__ == "__main__":
    main()
