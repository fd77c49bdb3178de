"""Two gloo processes for the FSDP2 tests: spawned, meeting through a file
store (nothing listens on the network), each calling `target(rank, store,
*args, results)` and putting its result on `results`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch.multiprocessing as mp


def run_two_ranks(target: Callable, *args, folder: Path, deadline_s: float, hang: str) -> list:
    """Each rank's result, sorted (rank first in each); fails when a rank is
    still running after `deadline_s` (`hang` says what that means) or fails."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = f"file://{folder / 'store'}"
    procs = [ctx.Process(target=target, args=(r, store, *args, results)) for r in range(2)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + deadline_s
    try:
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        assert not hung, f"ranks {hung} still running after {deadline_s} s: {hang}"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return sorted(results.get(timeout=5) for _ in procs)
