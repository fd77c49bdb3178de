"""Weight loads into the rollout process, each attested when its reply
comes: the process returns the digests of the copy it then holds and they
must equal those of what was sent (`thinkrl.rollout.attest`). Used by both
of the driver's rollout roles (`sampler.AsyncRollout`, `streaming.StreamingRollout`)."""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.rollout.attest import Ledger, check_served, recording, served_by_engine

ENGINE = "the rollout process"


class AttestedLoads:
    """The process's requests, with the loads sent and not yet attested."""

    def __init__(self, process: RolloutProcess) -> None:
        self.process = process
        self.unattested: dict[int, tuple[int, Ledger]] = {}
        """request id -> (policy version, the digests of what was sent)."""

    def send(self, version: int, weights: dict[str, Tensor]) -> float:
        """A load of `weights` (the trainer's names, float32) as policy
        `version`; the seconds its digests took."""
        sent = Ledger()
        weights = dict(recording(weights.items(), sent, dtype=torch.float32))
        self.unattested[self.process.submit("load", version, weights)] = (version, sent)
        return sent.seconds

    def wait(self, request_id: int):
        """The reply to `request_id`; every load reply that comes meanwhile
        (its own included, when it is a load) is attested as it comes."""
        return self.process.wait_attesting(request_id, self.unattested, self._attest)

    def _attest(self, request_id: int, served) -> None:
        version, sent = self.unattested.pop(request_id)
        if served is not None:  # None: the process failed (the wait raises its error)
            check(sent, served, version=version)


def check(sent: Ledger, served: Ledger, *, version: int) -> None:
    """WeightSyncMismatch unless the process serves what was sent."""
    check_served(sent, served_by_engine([served], sent), engine=ENGINE, version=version)
