"""The ranks the driver-side handles (`thinkrl.workers.handles`) call.

A `Group` runs one method of every rank's `PolicyRank`, rank r with its own
arguments, and returns the results in rank order. Two implement it: the
`LocalGroup` below (one rank in this process: the local backend) and
`thinkrl.workers.ray_group.RayWorkerGroup` (one Ray actor per device, every
wait with a deadline). The handles are written once, against this protocol:
local and ray run the same planning, sharding and gathering code.
"""

from __future__ import annotations

from typing import Protocol

from thinkrl.workers.policy_rank import PolicyRank, RankSpec


class Group(Protocol):
    spec: RankSpec
    world_size: int

    def call_all(self, stage: str, method: str, per_rank_args: list[tuple] | None = None,
                 **kwargs) -> list:
        """`method` on every rank (rank r with per_rank_args[r]), results in rank order;
        `stage` names the wait in errors and logs."""

    def close(self) -> None:
        """Stop the ranks (and what they hold: engines, processes, devices)."""


class LocalGroup:
    """One `PolicyRank` in this process: a call is a method call."""

    world_size = 1

    def __init__(self, spec: RankSpec) -> None:
        self.spec = spec
        self.rank = PolicyRank(spec)
        """The rank itself (tests reach its models through it)."""

    def call_all(self, stage: str, method: str, per_rank_args: list[tuple] | None = None,
                 **kwargs) -> list:
        args = per_rank_args[0] if per_rank_args else ()
        return [getattr(self.rank, method)(*args, **kwargs)]

    def close(self) -> None:
        close = getattr(self.rank.engine, "close", None)  # vLLM frees its engine core
        if close is not None:
            close()
