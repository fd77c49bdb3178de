"""The driver's side of streaming rollout (`async_training.streaming`): the
rollout role over a rollout process that draws and decodes prompts itself
(`thinkrl.async_rollout.stream`). A step takes the next emitted batch; the
trainer's weights go to the process at every sync step of the schedule and
are attested when the process applies them; a checkpoint keeps the
process's snapshot, taken where it applied that step's weights.

Validation generates on the trainer's own engine (its current weights, its
own generator): the stream's schedule stays what it would be without it.
"""

from __future__ import annotations

import torch

from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.async_rollout.server import Generated
from thinkrl.async_rollout.stream import StreamSchedule
from thinkrl.records import PromptBatch, Rollouts
from thinkrl.rollout.attest import Ledger, check_served, recording, served_by_engine
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import PolicyRole

ENGINE = "the rollout process"


class StreamingRollout:
    """The rollout role of a streaming run; `AsyncSampler` takes its batches."""

    def __init__(self, process: RolloutProcess, actor: PolicyRole, *, schedule: StreamSchedule,
                 validation_engine) -> None:
        self.process, self.actor, self.schedule = process, actor, schedule
        self.validation_engine = validation_engine
        self.version = 0
        self.sent_version: int | None = None
        self.busy_seconds = 0.0
        self._unattested: dict[int, tuple[int, Ledger]] = {}
        self._snapshots: dict[int, dict] = {}

    # -- RolloutRole -----------------------------------------------------------
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        return self.validation_engine.generate(prompts, params)

    def sync_weights(self, version: int) -> dict[str, float]:
        """Send the weights at the schedule's sync steps (and the first time);
        a checkpoint step's load asks for the process's snapshot."""
        self.version = version
        if self.sent_version is not None and not self.schedule.is_sync(version):
            return {}
        sent = Ledger()
        weights = dict(recording(self.actor.full_weights().items(), sent, dtype=torch.float32))
        wanted = self.sent_version is not None and self.schedule.is_checkpoint(version)
        request_id = self.process.submit("load", version, weights, wanted)
        self._unattested[request_id] = (version, sent)
        self.sent_version = version
        return {"timing_s/weight_attest": sent.seconds}

    def generator_state(self) -> dict:
        """At a checkpoint: the process's snapshot at this step's load, and
        the validation engine's generator."""
        pending = [r for r, (v, _) in self._unattested.items() if v == self.version]
        for request_id in pending:
            self._wait(request_id)
        if self.version not in self._snapshots:
            raise AssertionError(f"no snapshot of the rollout process for step {self.version}: "
                                 "a checkpoint step must be a sync step (StreamSchedule.is_sync)")
        return {"stream": self._snapshots.pop(self.version),
                "validation_generator": self.validation_engine.generator_state()}

    def set_generator_state(self, state) -> None:
        if not (isinstance(state, dict) and "stream" in state):
            raise ValueError("this checkpoint was saved without async_training.streaming: resume "
                             "it with the async_training settings it was saved with")
        self._wait(self.process.submit("restore", state["stream"]))
        self.validation_engine.set_generator_state(state["validation_generator"])

    # -- the training stream ---------------------------------------------------
    def fill(self) -> None:
        """Nothing to dispatch: the process draws its prompts itself."""

    def take(self) -> Generated:
        generated = self._wait(self.process.submit("take"))
        self.busy_seconds += generated.seconds
        return generated

    def _wait(self, request_id: int):
        return self.process.wait_attesting(request_id, self._unattested, self._on_reply)

    def _on_reply(self, request_id: int, value) -> None:
        version, sent = self._unattested.pop(request_id)
        served, snapshot = value
        if snapshot is not None:
            self._snapshots[version] = snapshot
        if served is not None:  # None: the schedule passed this version by within one tick
            check_served(sent, served_by_engine([served], sent), engine=ENGINE, version=version)
