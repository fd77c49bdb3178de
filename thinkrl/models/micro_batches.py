"""How the rows of one pass (a log-prob pass, a value pass, a mini-batch of
the update) are cut into forward passes, and how ranks agree on their count.

Shapes: N rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.parallel.distributed import max_over_ranks


def micro_batch_rows(token_counts: Tensor, *, micro_batch_size: int,
                     max_tokens: int | None = None) -> list[slice]:
    """Consecutive runs of rows, one per forward: `micro_batch_size` rows
    each, or with `max_tokens` (verl's use_dynamic_bsz) as many rows as fit
    that many tokens (prompt + response, padding excluded), a longer row
    alone. Rows keep their order, so a prompt's responses stay together.
    token_counts [N] -> slices covering 0..N-1."""
    n = len(token_counts)
    if max_tokens is None:
        return [slice(s, min(s + micro_batch_size, n)) for s in range(0, n, micro_batch_size)]
    cuts, start, used = [], 0, 0
    for row, count in enumerate(token_counts.tolist()):
        if row > start and used + count > max_tokens:
            cuts.append(slice(start, row))
            start, used = row, 0
        used += count
    if n:
        cuts.append(slice(start, n))
    return cuts


def agreed_micro_batches(cuts: list[slice], *, device: torch.device) -> list[slice | None]:
    """`cuts` (this rank's micro-batches), then None up to the most
    micro-batches any rank has. With sharded weights every forward and
    backward runs collectives (FSDP2's all-gathers and reduce-scatters), so
    all ranks must run the same number of them, while token budgets
    (use_dynamic_bsz) or a share one row shorter give a rank fewer cuts. A
    None is an idle pass (`thinkrl.models.forward.idle_pass`) that joins
    the collectives and adds nothing. One all-reduce; on one process, `cuts`."""
    return cuts + [None] * (max_over_ranks(len(cuts), device=device) - len(cuts))
