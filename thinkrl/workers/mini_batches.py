"""How one step's responses are cut for the policy update and spread over ranks.

A mini-batch is one optimizer step. Its loss normalisers (`LossScale`: the
response tokens and sequences of the WHOLE mini-batch) are measured here,
before the mini-batch is split over ranks and micro-batches, and travel with
every piece: each rank's micro-batch loss is then its exact share of the
mini-batch loss, so neither the device count nor the micro-batch size can
change the gradient.

Shapes: N responses, S = P + R sequence tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.algos.losses import LossScale
from thinkrl.records import CriticBatch, TrainBatch


@dataclass(slots=True)
class MiniBatch:
    """The rows of one optimizer step (or one rank's share of them) and the
    normalisers of the whole mini-batch across all ranks."""

    batch: TrainBatch | CriticBatch
    scale: LossScale


def plan_mini_batches(batch: TrainBatch | CriticBatch, *, mini_batch_size: int, epochs: int, shuffle: bool,
                      generator: torch.Generator, response_length: int) -> list[MiniBatch]:
    """`epochs` passes over `batch`, each cut into mini-batches of
    `mini_batch_size` responses, in a fresh random order per pass when
    `shuffle` (drawn from `generator`, whose state a checkpoint keeps).
    `response_length` is the configured maximum (Dr. GRPO's constant divisor)."""
    minis = []
    for _ in range(epochs):
        order = (torch.randperm(len(batch), generator=generator) if shuffle
                 else torch.arange(len(batch)))
        for start in range(0, len(batch), mini_batch_size):
            rows = batch.select(order[start:start + mini_batch_size])
            minis.append(MiniBatch(rows, LossScale.of(rows.response_mask,
                                                      response_length=response_length)))
    return minis


def balanced_shares(token_counts: Tensor, parts: int) -> list[Tensor]:
    """Row numbers for each of `parts` ranks: as equal in count as possible
    (sharded ranks must run the same number of forward passes, since every
    pass gathers weights collectively) and balanced in tokens: rows sorted by
    length are dealt out in snake order (0, 1, .., p-1, p-1, .., 0, ...).
    Each share is sorted, so rows keep their relative order. [N] -> parts x [~N/parts]."""
    order = torch.argsort(token_counts, descending=True, stable=True)
    shares: list[list[int]] = [[] for _ in range(parts)]
    for i, row in enumerate(order.tolist()):
        lap, pos = divmod(i, parts)
        shares[pos if lap % 2 == 0 else parts - 1 - pos].append(row)
    return [torch.tensor(sorted(s), dtype=torch.long) for s in shares]


def contiguous_shares(n: int, parts: int) -> list[Tensor]:
    """Row numbers 0..n-1 cut into `parts` consecutive runs whose lengths
    differ by at most one (prompts for generation: a prompt's G responses are
    produced together on one rank)."""
    base, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return [torch.arange(bounds[p], bounds[p + 1]) for p in range(parts)]


def split_mini_batch(mini: MiniBatch, shares: list[Tensor]) -> list[MiniBatch]:
    """Each rank's rows of a mini-batch (`shares`, row numbers per rank), each
    with the whole mini-batch's normalisers."""
    return [MiniBatch(mini.batch.select(rows), mini.scale) for rows in shares]
