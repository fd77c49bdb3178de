"""The rollout engines alone on the long-tail task (`thinkrl.data.longtail`),
one torch thread: what a decode step costs for 1 to 256 rows, and the time
and decoding forwards per batch of 32 prompts x 8 responses for the native
engine (a batch decoded alone: its longest response sets the forwards) and
for the streaming engine (continuous batching over 256 slots, the first 32
groups to finish make a batch, a weight load applied after every batch as
one-step-off applies them).

    python bench/stream_engine.py [--batches 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch

from thinkrl.async_rollout.stream import StreamEngine, StreamSchedule
from thinkrl.builtin import resolve_data_files, resolve_model_path
from thinkrl.data.dataset import Prompt, PromptLoader, load_prompts
from thinkrl.models.lean_decoder import lean_spec
from thinkrl.models.loading import load_causal_lm
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.continuous import SlotDecoder
from thinkrl.rollout.native import NativeEngine

BATCH, N, MAX_TOKENS = 32, 8, 192


def prompts_of(tokenizer) -> list[Prompt]:
    """The task's training prompts, read and rendered as a run reads them."""
    return load_prompts(resolve_data_files("builtin:longtail/train"), tokenizer, key="data.train_files",
                        prompt_key="prompt", reward_fn_key="data_source", max_prompt_length=256,
                        filter_overlong=False, truncation="error", chat_kwargs={}, log=lambda *_: None)


def step_cost(model) -> None:
    print("decode step (ms) by rows:", end="")
    for rows in (1, 8, 32, 128, 256):
        decoder = SlotDecoder(lean_spec(model), slots=rows, device=torch.device("cpu"))
        decoder.prefill(torch.arange(rows), [torch.randint(3, 400, (80,)) for _ in range(rows)])
        token, every = torch.randint(3, 400, (rows,)), torch.arange(rows)
        for _ in range(5):
            decoder.step(every, token)
        started = time.perf_counter()
        for _ in range(40):
            decoder.step(every, token)
        print(f"  {rows}: {(time.perf_counter() - started) / 40 * 1e3:.2f}", end="")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    path = resolve_model_path("builtin:tiny-qwen2-longtail")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = load_causal_lm(path, dtype=torch.float32, device=torch.device("cpu")).eval()
    prompts, params = prompts_of(tokenizer), SamplingParams(n=N, max_tokens=MAX_TOKENS)
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                          pad_token_id=tokenizer.pad_token_id, seed=0)

    def loader() -> PromptLoader:
        return PromptLoader(prompts, batch_size=BATCH, shuffle=True, seed=1,
                            pad_token_id=tokenizer.pad_token_id)

    with torch.no_grad():
        step_cost(model)
        batches, seconds, forwards = loader(), [], []
        for _ in range(args.batches):
            batch = batches.next_batch()
            started = time.perf_counter()
            rollouts = engine.generate(batch, params)
            seconds.append(time.perf_counter() - started)
            forwards.append(rollouts.response_ids.shape[1])
        print(f"native engine, a batch alone: {sum(seconds[1:]) / (len(seconds) - 1):.2f} s/batch, "
              f"{sum(forwards) / len(forwards):.1f} decoding forwards/batch")
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        stream = StreamEngine(engine, loader(), params,
                              StreamSchedule(groups_per_batch=BATCH, cap=2, sync_every=1),
                              slots=BATCH * N, partial=True, seed=0)
        marks = []
        started = time.perf_counter()
        while stream.emitted < args.batches:
            if not stream.tick():
                stream.offer(stream.required, weights)
            if stream.emitted > len(marks):
                marks.append((time.perf_counter() - started, stream.steps))
        (t0, s0), (t1, s1) = marks[0], marks[-1]
        print(f"streaming engine: {(t1 - t0) / (len(marks) - 1):.2f} s/batch, "
              f"{(s1 - s0) / (len(marks) - 1):.1f} decoding forwards/batch (after the first batch)")


if __name__ == "__main__":
    main()
