"""The demo recipe from differently built base models: what another CPU kind
would give. Float rounding differs by CPU, so the tiny base model that
`make demo` pretrains differs by machine; here the differences are made on
purpose (other pretraining seeds, other thread counts) and each base is then
trained by the unchanged `--config tiny` recipe.

    python bench/demo_bases.py --seeds 1 2 3 4 5 --threads 1 2 [--steps 40] [--out /tmp/bases] \
        [--spec pretrain_steps=1600 ...] [dotted.key=value overrides of the recipe]

Prints one row per base: seed, threads, held-out accuracy before training and
at each validation. Each base is built once into --out (reused when there);
each training run goes to its own folder under --out/runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ACCURACY = "val-core/thinkrl/arith/acc/mean@1"


def build_base(folder: Path, *, seed: int, threads: int, spec: dict) -> float:
    """Pretrain the tiny base with `seed` (and the `spec` changes of
    TinyModelSpec) on `threads` threads, in a fresh process, so the thread
    count holds for the whole build."""
    if (folder / "config.json").exists():
        return 0.0
    code = ("import sys, dataclasses, torch\n"
            "from thinkrl.models.tiny import TinyModelSpec, build_tiny_model\n"
            f"torch.set_num_threads({threads})\n"
            f"spec = dataclasses.replace(TinyModelSpec(), **{ {**spec, 'seed': seed}!r})\n"
            f"build_tiny_model({str(folder)!r}, spec, log=lambda m: None)\n")
    start = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - start


def train(base: Path, run_dir: Path, *, steps: int, threads: int, extra: list[str]) -> list[dict]:
    """The tiny recipe on `base`; the validation records of its metrics.jsonl."""
    thinkrl = Path(sys.executable).with_name("thinkrl")
    cmd = [str(thinkrl), "train", "--config", "tiny", "--skip-doctor",
           f"actor_rollout_ref.model.path={base}", f"trainer.default_local_dir={run_dir}",
           f"trainer.total_training_steps={steps}", "trainer.progress_bar=False",
           "trainer.resume_mode=disable", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if ACCURACY in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("/tmp/thinkrl-demo-bases"))
    parser.add_argument("--spec", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="changes of thinkrl.models.tiny.TinyModelSpec (default: none)")
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for every run")
    args = parser.parse_args()
    from thinkrl.models.tiny import TinyModelSpec

    default_seed = TinyModelSpec().seed
    spec = {}
    for item in args.spec:
        name, _, value = item.partition("=")
        spec[name] = type(getattr(TinyModelSpec(), name))(value)
    tag = "".join(f"-{k}{v}" for k, v in sorted(spec.items()))
    print(f"{'seed':>5} {'threads':>7} {'build_s':>7} {'train_s':>7}  accuracy by step")
    finals = []
    for threads in args.threads:
        for seed in args.seeds:
            name = f"seed{seed}-threads{threads}{tag}"
            base = args.out / "bases" / name
            build_s = build_base(base, seed=seed, threads=threads, spec=spec)
            start = time.perf_counter()
            vals = train(base, args.out / "runs" / name, steps=args.steps, threads=threads,
                         extra=args.overrides)
            train_s = time.perf_counter() - start
            curve = " ".join(f"{r['step']}:{r[ACCURACY]:.3f}" for r in vals)
            marker = " (the default seed)" if seed == default_seed else ""
            print(f"{seed:>5} {threads:>7} {build_s:>7.0f} {train_s:>7.0f}  {curve}{marker}",
                  flush=True)
            finals.append(vals[-1][ACCURACY])
    print(f"final accuracy over {len(finals)} bases: min {min(finals):.3f}, "
          f"max {max(finals):.3f}, mean {sum(finals) / len(finals):.3f}")


if __name__ == "__main__":
    main()
