"""Checkpoints that prove they are intact: a checksum of every file, finite weights.

Every save lists each file of the checkpoint folder in `meta.json`:

    "files": {"actor/model.safetensors": {"bytes": 1234, "sha256": "..."}, ...}

whatever the layout (one safetensors file, shards, a distributed checkpoint's
per-rank files): verification reads only that list. sha256, because it is
the checksum people can check with `sha256sum`, and it is fast enough on
many cores: 1.2-1.9 GiB/s on one core of our 2-core dev machine (hashlib with
SHA-NI; `bench/fault_table.py` prints it), against 6.5 GiB/s for zlib.crc32,
which would not be worth a second format.

One core's sha256 would make a 7B save (84 GB of weights and AdamW moments)
wait about a minute, so the work is spread over threads (hashlib and file
reads release the GIL), when saving and when verifying: every file, and every `PIECE_BYTES` piece of a larger
file, is a task of its own. A file of more than one piece is listed with one
sha256 per piece instead ("piece_bytes", "sha256_pieces": piece i is bytes
[i * piece_bytes, (i + 1) * piece_bytes), which `dd`/`split` and `sha256sum`
check by hand). Checkpoints listed before pieces existed (a whole-file sha256
of any size) still verify. The tiny model's 1.4 MB checkpoint hashes in 5 ms,
and verifying it (checksums plus the finiteness scan) takes 2-3 ms.

A checkpoint is intact when its `meta.json` reads, every listed file exists
with its size and checksum, every safetensors file has a valid header and
finite floating-point tensors. A checkpoint saved before checksums existed
(no "files" list) gets the header and finiteness checks only.

Resuming walks the complete checkpoints newest first and takes the first
intact one, saying which were skipped and why (`newest_intact`).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from thinkrl.errors import UserError


MARKER = "meta.json"  # thinkrl.checkpoint.store writes it last; it marks a complete save
FILES_KEY = "files"
_CHUNK = 8 * 2**20
PIECE_BYTES = 2**30
"""A file larger than this is hashed (and listed) as pieces of this size."""


class DamagedCheckpoint(UserError):
    """A checkpoint folder that fails verification; the message names the
    folder, the file and what is wrong with it."""


def sha256_file(path: Path, start: int = 0, length: int | None = None) -> str:
    """The sha256 of `path`'s bytes [start, start + length) (to its end by default)."""
    digest = hashlib.sha256()
    left = length if length is not None else path.stat().st_size - start
    with path.open("rb") as f:
        f.seek(start)
        while left > 0 and (chunk := f.read(min(_CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _threads() -> int:
    return min(32, os.cpu_count() or 1)


def file_digests(folder: Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} (or {"bytes", "piece_bytes",
    "sha256_pieces"} past one piece) of every file under `folder` except the
    marker (which holds this list), hashed on every core."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).as_posix() != MARKER]
    sizes = {path: path.stat().st_size for path in files}
    tasks = [(path, start) for path in files for start in range(0, max(sizes[path], 1), PIECE_BYTES)]
    with ThreadPoolExecutor(_threads()) as pool:
        digests = list(pool.map(lambda task: sha256_file(task[0], task[1], PIECE_BYTES), tasks))
    pieces: dict[Path, list[str]] = {path: [] for path in files}
    for (path, _), digest in zip(tasks, digests):
        pieces[path].append(digest)
    return {path.relative_to(folder).as_posix(): _entry(sizes[path], pieces[path]) for path in files}


def _entry(size: int, pieces: list[str]) -> dict:
    if len(pieces) == 1:
        return {"bytes": size, "sha256": pieces[0]}
    return {"bytes": size, "piece_bytes": PIECE_BYTES, "sha256_pieces": pieces}


def hash_tasks(listed: dict[str, dict]) -> list[tuple[str, int, int | None, str]]:
    """(file, start, length, sha256) for every file of `listed`, and for every
    piece of one listed piece by piece: each a task of its own, so one large
    file (a 7B optimizer state) verifies on every core, as it was saved."""
    tasks = []
    for rel, expected in listed.items():
        if "sha256_pieces" not in expected:
            tasks.append((rel, 0, None, expected["sha256"]))
            continue
        step = int(expected["piece_bytes"])
        tasks += [(rel, i * step, step, digest) for i, digest in enumerate(expected["sha256_pieces"])]
    return tasks


def read_meta(folder: Path) -> dict:
    """The parsed `meta.json`, or DamagedCheckpoint."""
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DamagedCheckpoint(f"{folder}: {MARKER} does not read ({err})") from None
    if not isinstance(meta, dict):
        raise DamagedCheckpoint(f"{folder}: {MARKER} holds a {type(meta).__name__}, not a record")
    return meta


def verify_checkpoint(folder: Path) -> bool:
    """Raise DamagedCheckpoint unless `folder` is intact; returns False when
    it could only be partly verified (saved without a checksum list)."""
    meta = read_meta(folder)
    listed = meta.get(FILES_KEY)
    for rel, expected in (listed or {}).items():
        path = folder / rel
        if not path.is_file():
            raise DamagedCheckpoint(f"{folder}: {rel} is missing")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise DamagedCheckpoint(f"{folder}: {rel} has {size} bytes, {expected['bytes']} were "
                                    "saved (truncated or overwritten)")
    tasks = hash_tasks(listed or {})
    with ThreadPoolExecutor(_threads()) as pool:  # every file and every piece on a core of its own
        matches = list(pool.map(lambda task: sha256_file(folder / task[0], task[1], task[2]) == task[3], tasks))
    for (rel, start, length, _), ok in zip(tasks, matches):
        if not ok:
            end = min(start + length, listed[rel]["bytes"]) - 1 if length is not None else None
            where = f" (bytes {start}-{end})" if length is not None else ""
            raise DamagedCheckpoint(f"{folder}: {rel}{where} does not match its saved sha256 (its "
                                    "bytes changed after the save)")
    weights = sorted(folder / rel for rel in listed) if listed else sorted(folder.rglob("*.safetensors"))
    for path in weights:
        if path.suffix == ".safetensors":
            check_finite_safetensors(path, folder=folder)
    return listed is not None


def check_finite_safetensors(path: Path, *, folder: Path) -> None:
    """DamagedCheckpoint if `path` has a bad header or a non-finite value.
    One tensor in memory at a time."""
    import torch
    from safetensors import safe_open

    rel = path.relative_to(folder).as_posix()
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                    bad = int((~torch.isfinite(tensor)).sum())
                    raise DamagedCheckpoint(f"{folder}: {rel} holds {bad} non-finite value(s) "
                                            f"(NaN or inf) in {name}")
    except DamagedCheckpoint:
        raise
    except Exception as err:  # safetensors raises its own error types for bad headers
        raise DamagedCheckpoint(f"{folder}: {rel} does not read as safetensors "
                                f"({type(err).__name__}: {err})") from None


def newest_intact(candidates: list[Path], *, log=print) -> Path | None:
    """The first intact checkpoint of `candidates` (newest first), warning
    about each one skipped; None when none is intact."""
    skipped: list[str] = []
    for folder in candidates:
        try:
            verified = verify_checkpoint(folder)
        except DamagedCheckpoint as err:
            log(f"warning: skipping checkpoint {folder.name}: {err}")
            skipped.append(folder.name)
            continue
        if not verified:
            log(f"note: {folder.name} was saved without checksums; only its weights were checked")
        if skipped:
            log(f"falling back to {folder.name}, the newest intact checkpoint "
                f"(damaged: {', '.join(skipped)}; they stay on disk for inspection)")
        return folder
    if skipped:
        log(f"warning: no intact checkpoint ({', '.join(skipped)} damaged): starting from step 0")
    return None
