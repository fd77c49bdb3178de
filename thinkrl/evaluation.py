"""Validation and `thinkrl eval`: generate on held-out prompts, score every
response, report per data source.

Metric names (verl's layout, `{ds}` = data source, `n` = samples per prompt):

    val-core/{ds}/reward/mean@{n}           mean score over all responses
    val-core/{ds}/acc/mean@{n}              fraction of correct responses
    val-aux/{ds}/reward/pass@{k}            unbiased pass@k (n > 1; k = 1, 2, 4, ..., n)
    val-aux/{ds}/reward/best@{k}/mean       expected best score of k responses (n > 1, k > 1)
    val-aux/{ds}/response_length/mean       response tokens
    val-aux/{ds}/response_length/clip_ratio fraction that hit the length limit
    val-aux/reward/errors                   responses whose scorer raised or timed out (scored 0)
    timing_s/testing                        wall time of the whole evaluation

"Correct" means an accuracy of at least CORRECT_SCORE (1.0): the scorer's
`accuracy` part where it reports one (r1, whose score mixes format and
accuracy with configurable weights), else the score itself (the built-in
gsm8k and math scorers give 1.0 for a right answer and less otherwise, so
format credit alone never counts as correct). pass@k counts correct
responses the same way; best@k uses the raw scores.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from thinkrl.algos.pass_at_k import best_at_k, k_values, mean_pass_at_k
from thinkrl.data.dataset import Prompt, batches
from thinkrl.generations import Generation, generations_from_rollouts
from thinkrl.records import FINISH_LENGTH, Rollouts
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rewards.scoring import decode_responses, is_correct as correct_score, score_rollouts
from thinkrl.rollout.base import RolloutEngine, SamplingParams
from thinkrl.run import RunSpec

def is_correct(generation: Generation) -> bool:
    """The scorer's accuracy part when it reports one (r1), else the score,
    at least CORRECT_SCORE (`thinkrl.rewards.scoring.is_correct`)."""
    return correct_score(generation.score,
                         None if generation.accuracy is None else {"accuracy": generation.accuracy})


@dataclass(frozen=True, slots=True)
class SourceSummary:
    """One data source's results (a row of `thinkrl eval`'s table)."""

    data_source: str
    prompts: int
    samples: int
    mean_score: float
    """mean@n: average score over all responses."""
    accuracy: float
    """Fraction of responses that are correct (score >= CORRECT_SCORE)."""
    pass_at: dict[int, float]
    """k -> pass@k averaged over prompts (empty when n = 1)."""
    best_at: dict[int, float]
    """k -> expected best score of k responses (k > 1; empty when n = 1)."""
    mean_length: float
    clip_ratio: float


@dataclass(slots=True)
class EvalResult:
    generations: list[Generation]
    """Every response, grouped by prompt (Generation.prompt_index)."""
    n: int
    """Responses per prompt."""
    seconds: float
    scorer_errors: int = 0
    summaries: list[SourceSummary] = field(init=False)

    def __post_init__(self) -> None:
        self.summaries = summarize(self.generations, n=self.n)

    def metrics(self) -> dict[str, float]:
        """The metric names of the module docstring."""
        n, metrics = self.n, {}
        for s in self.summaries:
            ds = s.data_source
            metrics[f"val-core/{ds}/reward/mean@{n}"] = s.mean_score
            metrics[f"val-core/{ds}/acc/mean@{n}"] = s.accuracy
            metrics.update({f"val-aux/{ds}/reward/pass@{k}": v for k, v in s.pass_at.items()})
            metrics.update({f"val-aux/{ds}/reward/best@{k}/mean": v
                            for k, v in s.best_at.items()})
            metrics[f"val-aux/{ds}/response_length/mean"] = s.mean_length
            metrics[f"val-aux/{ds}/response_length/clip_ratio"] = s.clip_ratio
        metrics["val-aux/reward/errors"] = float(self.scorer_errors)
        metrics["timing_s/testing"] = self.seconds
        return metrics


def summarize(generations: Sequence[Generation], *, n: int) -> list[SourceSummary]:
    """Per data source (sorted by name): scores, accuracy, pass@k over each
    prompt's n responses, lengths. Every prompt must have exactly n responses."""
    by_prompt: dict[int, list[Generation]] = defaultdict(list)
    for g in generations:
        by_prompt[g.prompt_index].append(g)
    by_source: dict[str, list[list[Generation]]] = defaultdict(list)
    for group in by_prompt.values():
        assert len(group) == n, f"prompt {group[0].prompt_index}: {len(group)} responses, not {n}"
        by_source[group[0].data_source].append(group)

    summaries = []
    for source in sorted(by_source):
        groups = by_source[source]
        flat = [g for group in groups for g in group]
        counts = [(n, sum(is_correct(g) for g in group)) for group in groups]
        ks = k_values(n) if n > 1 else []
        summaries.append(SourceSummary(
            data_source=source, prompts=len(groups), samples=len(flat),
            mean_score=sum(g.score for g in flat) / len(flat),
            accuracy=sum(c for _, c in counts) / len(flat),
            pass_at={k: mean_pass_at_k(counts, k) for k in ks},
            best_at={k: sum(best_at_k([g.score for g in group], k) for group in groups)
                     / len(groups) for k in ks if k > 1},
            mean_length=sum(g.response_length for g in flat) / len(flat),
            clip_ratio=sum(g.finish_reason == FINISH_LENGTH for g in flat) / len(flat)))
    return summaries


def score_generations(rollouts: Rollouts, tokenizer, *, reward: RewardScorer,
                      prompt_offset: int) -> tuple[list[Generation], int]:
    """Decode and score one batch of rollouts: (its generations, responses
    whose scorer failed or timed out). The only place evaluation calls the
    reward code."""
    texts = decode_responses(rollouts, tokenizer)
    scored = score_rollouts(reward, rollouts, texts)
    generations = generations_from_rollouts(rollouts, texts=texts, scores=scored.scores.tolist(),
                                            prompt_offset=prompt_offset, parts=scored.parts)
    failures = sum(f is not None for f in rollouts.turns.failures) if rollouts.turns else 0
    return generations, scored.errors + scored.timeouts + failures


def evaluate(engine: RolloutEngine, prompts: Sequence[Prompt], *, tokenizer,
             sampling: SamplingParams, reward: RewardScorer, batch_size: int,
             on_batch: Callable[[int, int], None] | None = None) -> EvalResult:
    """Generate `sampling.n` responses for every prompt (in order, `batch_size`
    prompts per generate call), score them, summarise. `on_batch(done, total)`
    is called after each batch (progress output)."""
    start = time.perf_counter()
    generations: list[Generation] = []
    errors, done = 0, 0
    for batch in batches(list(prompts), batch_size=batch_size,
                         pad_token_id=tokenizer.pad_token_id):
        rollouts = engine.generate(batch, sampling)
        scored, batch_errors = score_generations(rollouts, tokenizer, reward=reward,
                                                 prompt_offset=done)
        generations += scored
        errors += batch_errors
        done += len(batch)
        if on_batch is not None:
            on_batch(done, len(prompts))
    return EvalResult(generations=generations, n=sampling.n,
                      seconds=time.perf_counter() - start, scorer_errors=errors)


def run_validation(engine: RolloutEngine, spec: RunSpec, *, reward: RewardScorer) -> EvalResult:
    """Validation of a training run: its held-out prompts, with rollout.val_kwargs."""
    return evaluate(engine, spec.val_prompts, tokenizer=spec.tokenizer, sampling=spec.val_sampling,
                    reward=reward, batch_size=spec.val_batch_size)
