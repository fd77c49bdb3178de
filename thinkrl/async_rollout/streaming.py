"""The driver's side of streaming rollout (`async_training.streaming`): the
rollout role over a rollout process that draws and decodes prompts itself
(`thinkrl.async_rollout.stream`). A step takes the next emitted batch; the
trainer's weights go to the process at every sync step of the schedule and
are attested when the process applies them.

Neither a checkpoint nor validation changes what the process does. A
checkpoint asks for the process's snapshot wherever it stands (its held
weights and unapplied loads included, `thinkrl.async_rollout.stream_state`)
and no weights are sent for it; validation generates on the trainer's own
engine (its current weights, its own generator). A seeded run therefore
samples the same tokens whatever `trainer.save_freq` and `trainer.test_freq` are.
"""

from __future__ import annotations

import torch

from thinkrl.async_rollout.loads import AttestedLoads, check
from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.async_rollout.server import Generated
from thinkrl.async_rollout.stream import StreamSchedule
from thinkrl.errors import UserError
from thinkrl.records import PromptBatch, Rollouts
from thinkrl.rollout.attest import Ledger, recording
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import PolicyRole


class StreamingRollout:
    """The rollout role of a streaming run; `AsyncSampler` takes its batches."""

    def __init__(self, process: RolloutProcess, actor: PolicyRole, *, schedule: StreamSchedule,
                 validation_engine) -> None:
        self.process, self.actor, self.schedule = process, actor, schedule
        self.validation_engine = validation_engine
        self.version = 0
        self.sent_version: int | None = None
        self.busy_seconds = 0.0
        self.loads = AttestedLoads(process)

    # -- RolloutRole -----------------------------------------------------------
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        return self.validation_engine.generate(prompts, params)

    def sync_weights(self, version: int) -> dict[str, float]:
        """Send the weights at the schedule's sync steps (and the first time)."""
        self.version = version
        if self.sent_version is not None and (version == self.sent_version
                                              or not self.schedule.is_sync(version)):
            return {}
        self.sent_version = version
        return {"timing_s/weight_attest": self.loads.send(version, self.actor.full_weights())}

    def generator_state(self) -> dict:
        """At a checkpoint: the process's snapshot (taken at once, nothing
        sent or awaited for it), the driver's last sent version, and the
        validation engine's generator."""
        snapshot = self._wait(self.process.submit("snapshot", self.version))
        return {"stream": snapshot, "sent_version": self.sent_version, "trainer_version": self.version,
                "validation_generator": self.validation_engine.generator_state()}

    def set_generator_state(self, state) -> None:
        """A checkpoint's snapshot into the (fresh) process: its held weights
        applied and attested, then its unapplied loads sent again in order.
        Weights the snapshot left out are the trainer's, just restored."""
        if not (isinstance(state, dict) and "stream" in state and "sent_version" in state):
            raise UserError("this checkpoint was saved without async_training.streaming, or by a "
                             "thinkrl whose streaming checkpoints forced a weight sync: resume it "
                             "with the async_training settings and thinkrl release it was saved with")
        stream = dict(state["stream"])
        held, pending = stream.pop("held_weights"), stream.pop("pending")
        version = int(stream["version"])
        if held is None and version == state["trainer_version"]:
            held = self.actor.full_weights()
        sent = Ledger()
        held = None if held is None else dict(recording(held.items(), sent, dtype=torch.float32))
        served = self._wait(self.process.submit("restore", stream, held))
        if held is not None:
            check(sent, served, version=version)
        for pending_version in sorted(pending):
            weights = pending[pending_version]
            self.loads.send(int(pending_version), self.actor.full_weights() if weights is None else weights)
        self.sent_version = state["sent_version"]
        self.validation_engine.set_generator_state(state["validation_generator"])

    # -- the training stream ---------------------------------------------------
    def fill(self) -> None:
        """Nothing to dispatch: the process draws its prompts itself."""

    def take(self) -> Generated:
        generated = self._wait(self.process.submit("take"))
        self.busy_seconds += generated.seconds
        return generated

    def _wait(self, request_id: int):
        return self.loads.wait(request_id)
