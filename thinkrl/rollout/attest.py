"""Weight-sync attestation: after every sync, the engine proves it serves
the trainer's weights, exactly.

Both sides reduce each tensor to a *digest*, an order-free hash of its
elements' values (see `tensor_digest`): the sum over elements of a 32-bit
mix of the element's float32 bits, with zeros left out, and the count of
nonzero elements. Because it is a sum over elements, the digest of a
concatenation is the sum of its parts' digests and the digest of a tensor
is the sum over any split of it, so it survives what engines do to
weights: vLLM fuses q|k|v and gate|up into one matrix, shards matrices over
tensor-parallel ranks, pads the vocabulary with zero rows, and on a CPU
repacks matrices for its kernels (they are read back through the kernel,
exactly: `thinkrl.rollout.vllm_engine`). The trainer's side casts each
tensor to the engine's dtype first, as the engine's load does, so the digests
are equal bit for bit or the engine holds another value somewhere.

What it does not see: elements moved *within* a tensor (a transposed
matrix of the right values). What it does see: any changed value (a missed
bucket, a stale layer, a corrupted tensor), with probability 1 - 2^-32 per
changed element.

Cost, and `rollout.attest_stride`: hashing is a few passes over every weight
on each side per sync (on a GPU, well under a second at 7B; on vLLM's CPU
build the read-back through the kernels dominates). With a stride k > 1 a
sync digests a k-th of the units (`AttestShare`): decoder layer i's at the
syncs of versions v with v = i (mod k), the others (embeddings, final norm,
head: together, so that a tied head meets its embedding) with layer 0's.
Every unit is checked
once every k syncs, so a load path that keeps corrupting a tensor is caught
within k syncs, and a one-off corruption of one unit at one sync with
probability 1/k. Stride 0 digests nothing.

Digests are grouped into *units*, named so that both sides agree
(`unit_of`): a trainer tensor takes the name of the fused engine tensor it
goes into (the engine's `packed_modules_mapping`), and names are cut to
the part from the decoder layer on ("layers.3.self_attn.qkv_proj.weight")
or, outside the layers, to the last two parts ("embed_tokens.weight"), so
prefixes that differ between the two sides ("model.language_model." in
transformers, "language_model.model." in vLLM) do not matter.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import torch
from torch import Tensor

from thinkrl.errors import RunStopped

# Elements hashed per pass: bounds the int64 temporaries to 128 MiB each.
_CHUNK = 1 << 24
_MASK32 = (1 << 32) - 1
_LAYER_TAIL = re.compile(r"(?:^|\.)((?:layers|h|blocks)\.\d+\..*)$")

Packed = dict[str, list[str]]
"""A fused engine tensor's name part -> the trainer's parts, in order
({"qkv_proj": ["q_proj", "k_proj", "v_proj"]})."""


@dataclass(frozen=True, slots=True)
class Digest:
    """The order-free hash of a set of values (`tensor_digest`)."""

    hash: int = 0
    """Sum over the nonzero elements of a 32-bit mix of their float32 bits."""
    nonzero: int = 0
    """How many elements are nonzero."""

    def __add__(self, other: "Digest") -> "Digest":
        return Digest(self.hash + other.hash, self.nonzero + other.nonzero)


INCONSISTENT = Digest(-1, -1)
"""A unit whose copies in the engine disagree (two tensor-parallel ranks, or
a kernel's packed copy and its parameter)."""


def _mix(bits: Tensor) -> Tensor:
    """A 32-bit mix of int64 values (two multiply-xorshift rounds, wrapping
    int64 arithmetic); 0 maps to 0."""
    h = bits * -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64
    h = h ^ (h >> 29)
    h = h * -4658895280553007687  # 0xBF58476D1CE4E5B9
    h = h ^ (h >> 32)
    return (h >> 16) & _MASK32


@torch.no_grad()
def tensor_digest(tensor: Tensor) -> Digest:
    """The digest of a tensor's values as float32 (any shape, device, dtype that
    float32 holds exactly: float32, bfloat16, float16). Sums of up to 2^31
    elements of 32-bit values fit an int64, so nothing wraps."""
    flat = tensor.detach().reshape(-1)
    total = nonzero = 0
    for start in range(0, flat.numel(), _CHUNK):
        values = flat[start:start + _CHUNK].float()
        bits = values.view(torch.int32).to(torch.int64)
        bits = torch.where(values == 0, torch.zeros_like(bits), bits)  # -0.0 too
        total += int(_mix(bits).sum())
        nonzero += int((values != 0).sum())
    return Digest(total, nonzero)


def unit_of(name: str, packed: Packed | None = None) -> str:
    """The name both sides give the tensor `name` (see the module's docstring)."""
    parts = name.split(".")
    if packed:
        into = {part: fused for fused, sources in packed.items() for part in sources}
        parts = [into.get(p, p) for p in parts]
    joined = ".".join(parts)
    tail = _LAYER_TAIL.search(joined)
    return tail.group(1) if tail else ".".join(parts[-2:])


_LAYER_INDEX = re.compile(r"^(?:layers|h|blocks)\.(\d+)\.")


@dataclass(frozen=True)
class AttestShare:
    """Which units one sync digests (see the module's docstring): decoder
    layer i's when i = phase (mod stride), the others with layer 0; stride
    0: none. Picklable, for the engine's workers."""

    stride: int
    phase: int = 0

    @classmethod
    def of(cls, stride: int, version: int) -> "AttestShare | None":
        """Sync `version`'s share under `rollout.attest_stride`; None: every unit."""
        return None if stride == 1 else cls(stride, version % stride if stride else 0)

    def __call__(self, unit: str) -> bool:
        if self.stride == 0:
            return False
        layer = _LAYER_INDEX.match(unit)
        return (int(layer.group(1)) if layer else 0) % self.stride == self.phase


@dataclass
class Ledger:
    """Digests by unit, added up as tensors arrive (one side of a sync)."""

    units: dict[str, Digest] = field(default_factory=dict)
    numel: dict[str, int] = field(default_factory=dict)
    """Elements per unit, the full (unsharded, unpadded) count on the trainer's side."""
    seconds: float = 0.0
    """Time spent hashing."""

    def add(self, unit: str, tensor: Tensor) -> None:
        self.add_digest(unit, tensor_digest(tensor), tensor.numel())

    def add_digest(self, unit: str, digest: Digest, numel: int) -> None:
        self.units[unit] = self.units.get(unit, Digest()) + digest
        self.numel[unit] = self.numel.get(unit, 0) + numel

    def include(self, other: "Ledger") -> "Ledger":
        """This ledger with the units of `other`, whose units are others (the
        base's and the adapter's); returns self."""
        self.units.update(other.units)
        self.numel.update(other.numel)
        self.seconds += other.seconds
        return self


def recording(named_tensors: Iterable[tuple[str, Tensor]], ledger: Ledger, *,
              dtype: torch.dtype, packed: Packed | None = None, share: AttestShare | None = None
              ) -> Iterator[tuple[str, Tensor]]:
    """Pass the trainer's (name, tensor) pairs on unchanged, adding each one's
    digest, as the engine will hold it (cast to `dtype`), to `ledger` (only
    the units in `share`, when given)."""
    for name, tensor in named_tensors:
        started = time.perf_counter()
        unit = unit_of(name, packed)
        if share is None or share(unit):
            ledger.add(unit, tensor.to(dtype))
        ledger.seconds += time.perf_counter() - started
        yield name, tensor


class WeightSyncMismatch(RunStopped):
    """The engine does not serve the weights the trainer sent (a stop: the
    command line prints it with what is kept and the resume line, exit 1)."""


def served_by_engine(ranks: list[Ledger], expected: Ledger) -> dict[str, Digest]:
    """One engine's digests from the ledgers of its tensor-parallel ranks.

    A unit that every rank holds whole (its element count on each rank equals
    the trainer's: a norm, a replicated bias) must be the same on every rank
    and counts once; any other unit is split over the ranks (or padded), and
    its parts add up."""
    served: dict[str, Digest] = {}
    for unit in set().union(*(r.units for r in ranks)):
        held = [r for r in ranks if unit in r.units]
        whole = len(ranks) > 1 and all(r.numel[unit] == expected.numel.get(unit) for r in held)
        if whole:
            digests = {r.units[unit] for r in held}
            served[unit] = held[0].units[unit] if len(digests) == 1 else INCONSISTENT
        else:
            total = Digest()
            for r in held:
                total = total + r.units[unit]
            served[unit] = total
    return served


def check_served(expected: Ledger, served: dict[str, Digest], *, engine: str, version: int) -> None:
    """Raise `WeightSyncMismatch` naming the first unit the engine serves
    otherwise than the trainer sent. A unit the engine does not hold is fine
    only when it is a tied copy of one it does (the same digest: an output
    embedding tied to the input one); units only the engine holds (a vision
    tower that is not synced) are not compared."""
    held = set(served.values())
    wrong = [u for u, d in expected.units.items()
             if (u in served and served[u] != d) or (u not in served and d not in held)]
    if not wrong:
        return
    unit = sorted(wrong)[0]
    found = served.get(unit)
    what = ("holds no such tensor" if found is None else
            "holds two copies that differ (on two tensor-parallel ranks, or its kernel's "
            "packed copy and its parameter)" if found == INCONSISTENT else
            f"holds {found.nonzero} nonzero values with digest {found.hash}, the trainer sent "
            f"{expected.units[unit].nonzero} with digest {expected.units[unit].hash}")
    others = f" (and {len(wrong) - 1} more: {', '.join(sorted(wrong)[1:4])})" if len(wrong) > 1 else ""
    raise WeightSyncMismatch(
        f"weight sync to policy version {version}: {engine} does not serve the trainer's weights: "
        f"for {unit!r} it {what}{others}. The engine would sample from weights the trainer never "
        "had; the run stops here, before any sample of that policy is trained on. Check the "
        "rollout engine's weight loading (rollout.update_weights_bucket_megabytes, the vLLM "
        "release: thinkrl doctor) or report it with this message")
