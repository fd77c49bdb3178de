"""Streaming the actor's weights into a rollout engine that holds its own copy.

The native engine samples from the actor's module itself, so nothing moves.
An engine with its own weights (vLLM) gets them after every actor update,
in memory: the actor yields its tensors one at a time (gathered whole from
FSDP2 shards when sharded) and `buckets` groups them into loads of about
`rollout.update_weights_bucket_megabytes`, so at most one bucket of full
tensors exists beside the shards at any moment.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

import torch
from torch import Tensor

# A decoder layer's tensors ("model.layers.3.self_attn.q_proj.weight"): they
# must reach the engine in one load, because engines fuse them (q, k and v
# into one qkv matrix, gate and up into one) and process a fused layer only
# when all of its parts have arrived.
_LAYER = re.compile(r"^(.*?\.(?:layers|h|blocks)\.\d+)\.")


def layer_of(name: str) -> str:
    """The unit a tensor belongs to: its decoder layer, else its own module path."""
    found = _LAYER.match(name)
    return found.group(1) if found else name.rsplit(".", 1)[0]


def full_state_tensors(model: torch.nn.Module, keep: Callable[[str], bool] | None = None
                       ) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every entry of the model's state dict (those whose
    name `keep` accepts, when given), each whole: a sharded (DTensor) entry is
    gathered when it is reached, which is a collective, so every rank must
    iterate in the same order. Tied weights appear under each of their names
    (an engine may keep both copies)."""
    for name, tensor in model.state_dict().items():
        if keep is not None and not keep(name):
            continue
        full = getattr(tensor, "full_tensor", None)
        yield name, (full() if full is not None else tensor).detach()


def buckets(named_tensors: Iterable[tuple[str, Tensor]], *, megabytes: float
            ) -> Iterator[list[tuple[str, Tensor]]]:
    """Consecutive groups of (name, tensor) of about `megabytes` each.

    A group closes at the first layer boundary after it reaches the size, so
    a decoder layer is never split over two groups (one group may therefore
    exceed the size by up to one layer). Order is kept; nothing is dropped.
    """
    limit = megabytes * 2**20
    bucket: list[tuple[str, Tensor]] = []
    size, unit = 0, None
    for name, tensor in named_tensors:
        this_unit = layer_of(name)
        if bucket and size >= limit and this_unit != unit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
        unit = this_unit
    if bucket:
        yield bucket
