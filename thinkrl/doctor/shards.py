"""Reading the parallel layout of a Megatron / MindSpeed sharded checkpoint.

Such a folder (what `convert_ckpt.py` writes from a Hugging Face model) holds

    latest_checkpointed_iteration.txt      "release" or an iteration number
    release/ or iter_0000100/
        mp_rank_00/            tensor-parallel rank 0 (no pipeline parallelism)
        mp_rank_03_001/        tensor-parallel rank 3, pipeline stage 1

so its TP and PP sizes are the number of distinct ranks in the folder names.
Weights converted for one layout cannot be loaded by a run with another
(seed 000: actor and reference converted with different TP/PP ended in
`AclOpKernelInit failed` deep inside the device kernels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
_RANK_DIR = re.compile(r"^mp_rank_(\d+)(?:_(\d+))?$")


@dataclass(frozen=True, slots=True)
class ShardedLayout:
    folder: Path
    """The iteration folder holding the mp_rank_* folders."""
    tensor_parallel: int
    pipeline_parallel: int

    def describe(self) -> str:
        return f"TP{self.tensor_parallel} PP{self.pipeline_parallel} ({self.folder})"


def read_sharded_layout(path: str | Path) -> ShardedLayout | None:
    """The layout of the Megatron-style checkpoint at `path`, or None when
    `path` is not one (a Hugging Face folder, a hub id, a missing path)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return None
    for folder in _iteration_folders(root):
        ranks = [m.groups() for m in (_RANK_DIR.match(p.name) for p in folder.iterdir()
                                      if p.is_dir()) if m]
        if ranks:
            tp = len({int(t) for t, _ in ranks})
            pp = len({int(p or 0) for _, p in ranks})
            return ShardedLayout(folder=folder, tensor_parallel=tp, pipeline_parallel=pp)
    return None


def _iteration_folders(root: Path) -> list[Path]:
    """The folder the tracker file names first, then the usual candidates."""
    candidates: list[Path] = []
    tracker = root / TRACKER
    if tracker.is_file():
        text = tracker.read_text().strip()
        candidates.append(root / ("release" if text == "release" else f"iter_{int(text):07d}")
                          if text == "release" or text.isdigit() else root)
    candidates += [root, root / "release", *sorted(root.glob("iter_*"), reverse=True)]
    return [c for c in candidates if c.is_dir()]
