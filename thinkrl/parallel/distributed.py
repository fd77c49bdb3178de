"""torch.distributed for the ranks of a worker group: joining, and the few
collectives thinkrl needs outside FSDP2 itself (summed metrics and counts).

Every function here is a no-op in a single process, so the roles call them
unconditionally and run unchanged under the local backend.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from thinkrl.parallel.device import process_group_backend


def init_process_group(*, rank: int, world_size: int, init_method: str,
                       device: torch.device, timeout_s: float, host_tensors: bool = False) -> None:
    """Join the run's process group.

    `init_method` is "file://<path>" (nothing listens on the network: the
    ranks meet through a file on a disk they share) or "tcp://HOST:PORT" (a
    store that rank 0 opens on its node's address, for several nodes).
    `host_tensors`: collectives also run on CPU tensors (FSDP2 offload keeps
    shards, gradients and norms on the host)."""
    if world_size <= 1 or dist.is_initialized():
        return
    dist.init_process_group(process_group_backend(device, host_tensors=host_tensors),
                            init_method=init_method, rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def sum_over_ranks(values: dict[str, float], *, device: torch.device) -> dict[str, float]:
    """Each value summed over all ranks, in one all-reduce of a float64
    tensor on `device` (the rank's compute device)."""
    if not dist.is_initialized() or not values:
        return values
    keys = sorted(values)
    total = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return dict(zip(keys, total.tolist()))


def max_over_ranks(value: int, *, device: torch.device) -> int:
    """The largest `value` any rank holds (one all-reduce; every rank must
    call it). On one process, `value` itself."""
    if not dist.is_initialized():
        return value
    top = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return int(top.item())


def close_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
