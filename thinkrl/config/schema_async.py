"""Asynchronous training: verl's `async_training.*` keys (its fully-async and
one-step-off recipes), and the mode switch that thinkrl adds because one
command runs every mode (verl has one entry point per recipe)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AsyncTrainingConfig:
    """Rollout on its own process(es), overlapping the trainer's update."""

    mode: str = "off"
    """thinkrl: "off" (generation and update take turns, on the same weights),
    "one_step_off" (verl's one-step-off recipe: the next batch is generated
    with the weights from before this step's update, while the update runs),
    or "fully_async" (verl's fully-async recipe: generation runs ahead of the
    trainer within ``staleness_threshold``, and weights are synced every
    ``trigger_parameter_sync_step`` steps)."""
    staleness_threshold: float = 0.1
    """fully_async: how far generation may run ahead, as a fraction of a sync
    window. A window is ``trigger_parameter_sync_step`` training batches; between
    two syncs at most floor((1 + staleness_threshold) * window) batches are
    dispatched, counting those still queued or generating from before. 0: none
    ahead (with trigger_parameter_sync_step=1, the synchronous algorithm)."""
    trigger_parameter_sync_step: int = 4
    """fully_async: training steps between two weight syncs to the rollout side."""
    require_batches: int = 1
    """fully_async: mini-batches of ``actor.ppo_mini_batch_size`` prompts the
    trainer takes per step. thinkrl's step takes ``data.train_batch_size``
    prompts, which must then equal ``require_batches`` x ``ppo_mini_batch_size``
    (verl's fully-async lines set ``data.train_batch_size=0``; set it to that
    product here)."""
    partial_rollout: bool | None = None
    """fully_async / one_step_off: a weight sync that arrives while a batch is
    being generated is applied between two chunks of its decoding (its rows
    continue with the new weights, their prefix prefilled again), instead of
    waiting for the batch to finish; with ``streaming``, at the stream's fixed
    points, running responses keeping their cached prefix. Each token keeps
    the version it was sampled with. None (thinkrl's default; verl's is on):
    on with ``streaming``, whose points are fixed so a seeded run repeats;
    off in batch mode, where which chunk a sync lands on depends on timing,
    so a seeded run would not repeat and a resume would not be exact
    (`partial_rollout_on`)."""
    streaming: bool = False
    """thinkrl, fully_async / one_step_off: the rollout process draws prompts
    itself and decodes them with continuous batching (a finished response's
    slot takes a new prompt at once); a training batch is the first
    ``data.train_batch_size`` groups to finish, as verl's rollouter streams
    samples, so a long response no longer holds its batch back. Slots:
    ``rollout.max_num_seqs``, at most one batch's responses. Weights are
    applied at fixed points of the stream (after batch m, those of the sync
    at or before step m + 1 - window), so a seeded run repeats exactly.
    Needs a plain Llama/Qwen2/Qwen3/Mistral decoder."""
    partial_chunk_tokens: int = 64
    """thinkrl: tokens decoded between two looks for a weight sync when
    ``partial_rollout`` is on."""
    rollout_threads: int = 0
    """thinkrl, CPU: torch threads of the rollout process; 0: half of the
    threads this process would use alone."""
    use_rollout_log_probs: bool | None = None
    """verl's fully-async recipe: ``actor_rollout_ref.actor.use_rollout_log_probs``
    (pi_old is the rollout's log-probs); None: not given."""
    trainer_threads: int = 0
    """thinkrl, CPU: torch threads of the trainer in async modes; 0: those the
    rollout process leaves (more than that oversubscribes the cores, which pays
    when the rollout side is mostly idle: docs/benchmarks.md)."""


def partial_rollout_on(asynchronous: AsyncTrainingConfig) -> bool:
    """`partial_rollout` as it applies: None means on with streaming, off in batch mode."""
    if asynchronous.partial_rollout is None:
        return asynchronous.streaming
    return asynchronous.partial_rollout
