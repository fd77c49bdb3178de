"""What an environment adds to a rollout: the environment loop's time beside
the engine's, for environments that answer slowly (a simulated user behind
an API, a game server), with the calls of a batch run one at a time and
side by side.

Workload: SmolLM2-135M-Instruct (or `--model`) plays a number-guessing
game (`Guess` below: "higher" / "lower" as user turns, reward 1 for the
secret) for `--prompts` x `--n` conversations of up to `--turns` turns;
every environment call sleeps `--latency` seconds (as a remote environment
would take), in this process (threads) or in `--workers` worker processes.
Printed per setting: the wall time of one batch, the part spent waiting on
environments (`timing_s/env`), and the engine's part.

    python bench/env_step.py                       # latency 0.05 s, concurrency 1 vs 32
    python bench/env_step.py --latency 0.2 --workers 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path

import torch

from thinkrl import builtin
from thinkrl.envs.base import EnvStep
from thinkrl.envs.loop import EnvRollout, LoopLimits
from thinkrl.envs.routing import EnvEntry, EnvRouter
from thinkrl.envs.server import ServedEnvironment
from thinkrl.envs.turn_tokens import TurnTokens
from thinkrl.records import SINGLE_TURN, PromptBatch, Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine


class Guess:
    """The secret is the row's ground truth; every call sleeps `latency` s."""

    scores = True

    def __init__(self, config: dict | None = None) -> None:
        self.latency = float((config or {}).get("latency", 0.0))

    def reset(self, sample):
        time.sleep(self.latency)
        return int(sample.ground_truth)

    def step(self, secret, reply: str) -> EnvStep:
        time.sleep(self.latency)
        numbers = re.findall(r"\d+", reply)
        guess = int(numbers[-1]) if numbers else -1
        if guess == secret:
            return EnvStep(reward=1.0, done=True)
        return EnvStep(messages=({"role": "user", "content": "higher" if guess < secret else "lower"},))

    def close(self, secret) -> None:
        time.sleep(self.latency)


def run(args, engine, tokenizer, env, concurrency: int) -> dict:
    router = EnvRouter(named={"guess": env}, by_data_source={"bench/guess": "guess"}, default=SINGLE_TURN,
                       wrap_tools=None, builtins={})
    rollout = EnvRollout(engine, tokenizer=tokenizer, router=router,
                         turn_tokens=TurnTokens(tokenizer, end_of_turn_ids=[tokenizer.eos_token_id]),
                         limits=LoopLimits(max_assistant_turns=args.turns, concurrency=concurrency),
                         eos_token_ids=[tokenizer.eos_token_id])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Guess my number from 1 to 20."}],
                                         tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]] * args.prompts)
    secrets = random.Random(0).choices(range(1, 21), k=args.prompts)
    batch = PromptBatch(ids, torch.ones_like(ids), [Sample("bench/guess", str(s), text, index=i)
                                                     for i, s in enumerate(secrets)])
    start = time.perf_counter()
    out = rollout.generate(batch, SamplingParams(n=args.n, max_tokens=args.max_tokens, temperature=1.0))
    wall = time.perf_counter() - start
    env = float(out.turns.env_wall.sum())
    return {"concurrency": concurrency, "wall_s": round(wall, 3), "env_s": round(env, 3),
            "engine_s": round(wall - env, 3), "turns_mean": round(float(
                (out.turns.assistant_turns + out.turns.env_turns + 1).float().mean()), 2),
            "env_calls": 2 * len(out) + sum(len(steps) for steps in out.turns.turn_rewards)}  # reset, close, steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--workers", type=int, default=0, help="also serve the game from N worker processes")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = builtin.resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    results = []
    for concurrency in (1, 32):
        engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                              seed=1)
        results.append({"where": "threads", **run(args, engine, tokenizer, Guess({"latency": args.latency}),
                                                   concurrency)})
    if args.workers:
        served = ServedEnvironment(EnvEntry("guess", "env_step.Guess", {"latency": args.latency},
                                            workers=args.workers, where="bench"),
                                   default_timeout_s=60, concurrency=32)
        try:
            engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                                  pad_token_id=tokenizer.pad_token_id, seed=1)
            results.append({"where": f"{args.workers} worker processes", **run(args, engine, tokenizer, served, 32)})
        finally:
            served.shutdown()
    print(f"model {folder}; {args.prompts} prompts x {args.n}, up to {args.turns} turns, "
          f"{args.latency:g} s per environment call")
    for r in results:
        print(f"  {r['where']:>22}  concurrency {r['concurrency']:>2}: batch {r['wall_s']:7.2f} s = engine "
              f"{r['engine_s']:6.2f} s + environments {r['env_s']:6.2f} s  ({r['env_calls']} calls, "
              f"{r['turns_mean']} turns/conversation)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "results": results},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # env_step.Guess for worker processes
    sys.exit(main())
