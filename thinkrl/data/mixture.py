"""Training batches that mix data sources in set proportions (``data.mixture``).

    data:
      mixture: {"reasoning_gym/*": 2, "textarena/GuessTheNumber-v0": 1}

Each data source present in the training files takes the entry that names
it exactly, else the first glob that matches it; a glob's weight is shared
evenly by the sources that take it (``reasoning_gym/*: 2`` gives the whole
family 2), and weights are normalised over the sources present. Batch k holds, of source s, the whole part of
``(k + 1) * B * w_s`` not drawn yet, the remaining places going to the
largest remainders (then the earlier source): every batch is within one
prompt of its share, and the counts over steps are exact (Hamilton's
method with a running total). Each source is drawn in its own seeded
permutation, a new one each time it is used up, so a small source repeats
sooner than a large one; a source no entry names is left out (said at
start).
"""

from __future__ import annotations

import difflib
import fnmatch
import math

import torch

from thinkrl.data.dataset import Prompt, PromptLoader, collate
from thinkrl.errors import UserError


def source_weights(mixture: dict[str, float], sources: list[str], *, log=print) -> dict[str, float]:
    """Weight of each source (normalised, only those > 0): a source takes the
    entry that names it exactly, else the first glob that matches it, and a
    glob's weight is shared evenly by the sources that take it. ValueError
    for an entry that matches no source, naming the closest."""
    for pattern in mixture:
        if not any(fnmatch.fnmatchcase(source, pattern) for source in sources):
            close = difflib.get_close_matches(pattern, sources, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"sources: {', '.join(sources)}"
            raise UserError(f"data.mixture.{pattern}: no training row has that data_source; {hint}")
    taken: dict[str, list[str]] = {}
    for source in sources:
        entry = source if source in mixture else next(
            (pattern for pattern in mixture if fnmatch.fnmatchcase(source, pattern)), None)
        if entry is not None:
            taken.setdefault(entry, []).append(source)
    weights = {source: float(mixture[entry]) / len(members)
               for entry, members in taken.items() for source in members if mixture[entry] > 0}
    left_out = [s for s in sources if s not in weights]
    if left_out:
        log(f"note: data.mixture leaves out {', '.join(left_out)} (weight 0 or not named)")
    if not weights:
        raise UserError("data.mixture gives no training data source a weight > 0")
    total = sum(weights.values())
    return {s: weights[s] / total for s in sources if s in weights}


def batch_counts(weights: dict[str, float], *, batch_size: int, batches_before: int,
                 drawn: dict[str, int]) -> dict[str, int]:
    """How many prompts of each source batch number `batches_before` holds,
    given `drawn` (per source, in the batches before it)."""
    target = {s: (batches_before + 1) * batch_size * w for s, w in weights.items()}
    counts = {s: max(0, math.floor(target[s]) - drawn.get(s, 0)) for s in weights}
    short = batch_size - sum(counts.values())
    by_remainder = sorted(weights, key=lambda s: (-(target[s] - drawn.get(s, 0) - counts[s]),
                                                  list(weights).index(s)))
    for source in by_remainder[:max(0, short)]:
        counts[source] += 1
    while sum(counts.values()) > batch_size:  # float rounding gave one too many
        largest = max(counts, key=counts.get)
        counts[largest] -= 1
    return counts


class MixtureLoader(PromptLoader):
    """`PromptLoader` whose batches follow `weights` (see the module docstring);
    the same checkpointable interface (`state_dict`, `batch_at`)."""

    def __init__(self, prompts: list[Prompt], *, weights: dict[str, float], batch_size: int,
                 shuffle: bool, seed: int, pad_token_id: int) -> None:
        super().__init__(prompts, batch_size=batch_size, shuffle=shuffle, seed=seed, pad_token_id=pad_token_id)
        self.weights = weights
        self.by_source = {s: [i for i, p in enumerate(prompts) if p.sample.data_source == s] for s in weights}
        self.batches = 0
        self.cursor = {s: 0 for s in weights}
        """Prompts of each source drawn so far (its pass is cursor // size)."""
        self._orders: dict[tuple[str, int], list[int]] = {}

    def _source_order(self, source: str, lap: int) -> list[int]:
        """Row numbers of `source` in the order of its pass number `lap`."""
        if (source, lap) not in self._orders:
            rows = self.by_source[source]
            if self.shuffle:
                offset = sorted(self.weights).index(source) * 1_000_003
                gen = torch.Generator().manual_seed(self.seed + offset + lap)
                rows = [rows[i] for i in torch.randperm(len(rows), generator=gen).tolist()]
            self._orders = {k: v for k, v in self._orders.items() if k[0] != source}  # one pass kept per source
            self._orders[(source, lap)] = rows
        return self._orders[(source, lap)]

    def next_batch(self):
        counts = batch_counts(self.weights, batch_size=self.batch_size, batches_before=self.batches,
                              drawn=self.cursor)
        chosen: list[Prompt] = []
        for source, count in counts.items():
            size = len(self.by_source[source])
            for _ in range(count):
                lap, place = divmod(self.cursor[source], size)
                chosen.append(self.prompts[self._source_order(source, lap)[place]])
                self.cursor[source] += 1
        self.batches += 1
        self.epoch, self.position = divmod(self.batches, self.batches_per_epoch)
        return collate(chosen, pad_token_id=self.pad_token_id)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "batches": self.batches,
                "cursor": dict(self.cursor)}

    def load_state_dict(self, state: dict) -> None:
        if "cursor" not in state or set(state["cursor"]) != set(self.weights):
            raise UserError("the checkpoint's data position was saved with another data.mixture "
                             f"(sources {sorted(state.get('cursor', {}))}, now {sorted(self.weights)}); "
                             "resume with the same data.mixture, or set trainer.resume_mode=disable")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.batches = int(state["batches"])
        self.cursor = {s: int(v) for s, v in state["cursor"].items()}
