"""Validation: generate on the held-out prompts with rollout.val_kwargs and
score every response, reported per data source."""

from __future__ import annotations

import time
from collections import defaultdict

from thinkrl.data.dataset import batches
from thinkrl.rewards.scoring import score_rollouts


def validate(run) -> dict[str, float]:
    """Mean reward per data source with rollout.val_kwargs (greedy by default),
    as `val-core/<data_source>/reward/mean@<n>`."""
    from thinkrl.build import val_batch_size

    start = time.perf_counter()
    per_source: dict[str, list[float]] = defaultdict(list)
    size = val_batch_size(run.cfg, len(run.val_prompts))
    pad = run.tokenizer.pad_token_id
    for prompts in batches(run.val_prompts, batch_size=size, pad_token_id=pad):
        rollouts = run.engine.generate(prompts, run.val_sampling)
        scored = score_rollouts(rollouts, run.tokenizer, scorer_for=run.scorer_for)
        for sample, score in zip(rollouts.samples, scored.scores.tolist()):
            per_source[sample.data_source].append(score)
    n = run.val_sampling.n
    metrics = {f"val-core/{source}/reward/mean@{n}": sum(v) / len(v)
               for source, v in per_source.items()}
    metrics["timing_s/testing"] = time.perf_counter() - start
    return metrics
