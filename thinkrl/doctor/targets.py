"""The machine a run is judged for when it is not this one (`thinkrl doctor
--target h100x8`, `thinkrl rehearse --target 910bx16`): a device from the
catalogue, or an explicit size, and how many a node holds.

    h100 | h200 | a100 | a100-40 | a100-80 | l40s | h20 | 910b | 910c  (x N devices per node)
    80GiB | 64GB | cuda:80GiB | npu:64GB                               (x N)

Sizes are the memory a device reports (GiB = 2**30 bytes; GB = 10**9).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from thinkrl.errors import UserError

CATALOGUE = {
    # name: (kind, GiB the device reports, what it is)
    "h100": ("cuda", 79.2, "NVIDIA H100 80 GB"),
    "h200": ("cuda", 139.8, "NVIDIA H200 141 GB"),
    "a100": ("cuda", 79.2, "NVIDIA A100 80 GB"),
    "a100-80": ("cuda", 79.2, "NVIDIA A100 80 GB"),
    "a100-40": ("cuda", 39.4, "NVIDIA A100 40 GB"),
    "l40s": ("cuda", 44.5, "NVIDIA L40S 48 GB"),
    "h20": ("cuda", 95.0, "NVIDIA H20 96 GB"),
    "910b": ("npu", 64.0, "Ascend 910B 64 GB"),
    "910c": ("npu", 128.0, "Ascend 910C 128 GB"),
}
DEFAULT_FOR_KIND = {"cuda": "h100", "npu": "910b"}
"""What a rehearsal assumes for a device kind when no target is named."""
_SIZE = re.compile(r"^(?:(cuda|npu):)?(\d+(?:\.\d+)?)(gib|gb)$")


@dataclass(frozen=True)
class Target:
    kind: str
    """"cuda" or "npu"."""
    bytes_per_device: int
    per_node: int | None
    """Devices of one node; None: not said."""
    label: str

    def describe(self) -> str:
        count = f"{self.per_node} x " if self.per_node else ""
        return f"{count}{self.label} (the target, not this machine)"


def parse_target(text: str) -> Target:
    """ValueError naming the catalogue and the size form where `text` is neither."""
    spec = text.strip().lower()
    name, count = spec, None
    match = re.fullmatch(r"(.+?)x(\d+)", spec)
    if match and (match.group(1) in CATALOGUE or _SIZE.match(match.group(1))):
        name, count = match.group(1), int(match.group(2))
        if count < 1:
            raise UserError(f"--target {text}: a node holds at least one device")
    if name in CATALOGUE:
        kind, gib, label = CATALOGUE[name]
        return Target(kind, int(gib * 2**30), count, label)
    size = _SIZE.match(name)
    if size:
        kind, amount, unit = size.group(1) or "cuda", float(size.group(2)), size.group(3)
        if amount <= 0:
            raise UserError(f"--target {text}: a device holds more than 0 bytes")
        scale = 2**30 if unit == "gib" else 10**9
        return Target(kind, int(amount * scale), count,
                      f"a {kind} device of {size.group(2)} {'GiB' if unit == 'gib' else 'GB'}")
    raise UserError(f"--target {text}: not a device this knows ({', '.join(CATALOGUE)}) nor a size "
                     "(80GiB, 64GB, npu:64GB); add xN for N devices per node (h100x8)")
