"""The driver's side of asynchronous training: the rollout role over the
rollout process (`AsyncRollout`), and the step's generate-and-score stage
that takes its batches (`AsyncSampler`).

Schedule. Batches of prompts are dispatched to the rollout process in the
loader's order; the process generates them in that order with the weights it
holds. Weights go to it every `trigger_parameter_sync_step` steps (policy
version v = the step whose update made them), after the update, without
waiting; at no other point. Between two syncs at most `cap` =
floor((1 + staleness_threshold) * trigger_parameter_sync_step) batches are
dispatched, counting those still in flight at the sync (verl's rule, here in
whole batches). A step takes the oldest batch, then dispatches what the
window allows, so the next batches generate while this one trains:
- staleness_threshold=0, trigger_parameter_sync_step=1: cap 1. Batch k+1 is
  dispatched only after the sync of step k: the synchronous algorithm.
- one_step_off (cap 2, sync every step): batch k+1 is generated with the
  weights of step k-1 while step k trains, as verl's one-step-off recipe.

Every load is attested: the process returns the digests of the copy it now
holds and the driver compares them with what it sent (`thinkrl.rollout.attest`).

A checkpoint keeps the batches in flight: it waits for them and saves their
responses with the loader position they were drawn at, so a resumed run
trains on exactly the batches the straight run would have (`queue_state`).
It sends no weights: the process keeps the version it holds. When that is
older than the trainer's (a checkpoint between two syncs), those weights
need no saving: the window dispatches batches only right after a sync, so
every batch they will ever sample was dispatched before the checkpoint, and
is waited for and saved with it; the next load comes before any other
generation. A resumed process is given the trainer's weights in their place.
Validation generates on the trainer's own engine. Neither changes what the
process samples, so (without partial rollout, whose loads apply when they
arrive) a seeded run trains the same tokens whatever `trainer.save_freq`
and `trainer.test_freq` are.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass

import torch

from thinkrl.async_rollout.loads import AttestedLoads
from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.async_rollout.server import NO_VERSION, Generated
from thinkrl.data.dataset import PromptLoader
from thinkrl.errors import UserError
from thinkrl.metrics import StageTimer
from thinkrl.records import PromptBatch, Rollouts
from thinkrl.rollout.base import SamplingParams
from thinkrl.stages.sampling import Draw, ScoredRollouts, score
from thinkrl.workers.roles import PolicyRole


@dataclass(frozen=True)
class Window:
    """How far generation may run ahead (see the module's docstring)."""

    sync_every: int
    """trigger_parameter_sync_step: steps between two weight syncs."""
    cap: int
    """Batches dispatched between two syncs, those in flight at the sync included."""

    @classmethod
    def of(cls, mode: str, *, staleness_threshold: float, sync_every: int) -> "Window":
        if mode == "one_step_off":
            return cls(1, 2)
        return cls(sync_every, max(1, math.floor((1 + staleness_threshold) * sync_every + 1e-9)))


@dataclass
class _Batch:
    """A dispatched batch: its request (None once answered), the loader's
    state before it was drawn, and its responses when they have come."""

    request_id: int | None
    loader_state: dict
    generated: Generated | None = None


class AsyncRollout:
    """The rollout role over the rollout process: the training stream's
    dispatch, the weight syncs and their attestation, validation's generation,
    and the queue a checkpoint keeps."""

    def __init__(self, process: RolloutProcess, actor: PolicyRole, *, window: Window,
                 loader: PromptLoader, sampling: SamplingParams, validation_engine) -> None:
        self.process, self.actor, self.window = process, actor, window
        self.loader, self.sampling = loader, sampling
        self.validation_engine = validation_engine
        self.version = 0
        """The trainer's latest policy version (passed to sync_weights, sent or not)."""
        self.sent_version: int | None = None
        self.queue: collections.deque[_Batch] = collections.deque()
        self.dispatched_since_sync = 0
        self.loads = AttestedLoads(process)
        self.busy_seconds = 0.0
        """The process's generation time reported so far (its busy time)."""

    # -- RolloutRole -----------------------------------------------------------
    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        """Generation outside the training stream (validation): on the
        trainer's engine, with its current weights."""
        return self.validation_engine.generate(prompts, params)

    def sync_weights(self, version: int) -> dict[str, float]:
        """Record the trainer's version; send the weights when a sync is due
        (every `window.sync_every` steps, and always the first time)."""
        self.version = version
        if self.sent_version is not None and (version == self.sent_version
                                              or version % self.window.sync_every):
            return {}
        return {"timing_s/weight_attest": self._send(version, self.actor.full_weights())}

    def generator_state(self) -> dict:
        """The queue and the process's state (see `queue_state`)."""
        return self.queue_state()

    def set_generator_state(self, state) -> None:
        if isinstance(state, dict) and "stream" in state:
            raise UserError("this checkpoint was saved with async_training.streaming=True: resume it "
                             "with the async_training settings it was saved with")
        if isinstance(state, dict) and "sent_version" in state:  # this module's checkpoint
            self.load_queue_state(state)
        elif isinstance(state, dict):
            raise UserError("this async checkpoint was saved by a thinkrl whose checkpoints forced a "
                             "weight sync; resume it with the thinkrl release it was saved with")
        else:  # a synchronous run's engine state: the first engine's
            state = state[0] if isinstance(state, list) else state
            self._wait(self.process.submit("set_generator_state", state))

    # -- the training stream ---------------------------------------------------
    def fill(self) -> None:
        """Dispatch batches while the window allows."""
        while self.dispatched_since_sync < self.window.cap:
            loader_state = self.loader.state_dict()
            prompts = self.loader.next_batch()
            request_id = self.process.submit("generate", prompts, self.sampling)
            self.queue.append(_Batch(request_id, loader_state))
            self.dispatched_since_sync += 1

    def take(self) -> Generated:
        """The oldest dispatched batch, when generated (load replies on the way are attested)."""
        batch = self.queue.popleft()
        if batch.generated is None:
            batch.generated = self._wait(batch.request_id)
            self.busy_seconds += batch.generated.seconds
        return batch.generated

    # -- checkpoints -----------------------------------------------------------
    def queue_state(self) -> dict:
        """What a checkpoint keeps: every dispatched batch, waited for, as
        tensors with the loader state it was drawn at; the process's
        generator after them; the version last sent and the dispatch count
        of the sync window (the module's docstring says why the weights the
        process holds are not kept)."""
        for batch in self.queue:
            if batch.generated is None:
                batch.generated = self._wait(batch.request_id)
                self.busy_seconds += batch.generated.seconds
                batch.request_id = None
        return {"generator": self._wait(self.process.submit("generator_state")),
                "queue": [_saved(b) for b in self.queue],
                "sent_version": self.sent_version, "trainer_version": self.version,
                "dispatched_since_sync": self.dispatched_since_sync,
                "validation_generator": self.validation_engine.generator_state()}

    def load_queue_state(self, state: dict) -> None:
        """The queue of a checkpoint: each batch's prompts drawn again from its
        loader state (the same rows), with its saved responses; the process
        given the trainer's weights (attested) and its generator."""
        self._wait(self.process.submit("set_generator_state", state["generator"]))
        self.queue.clear()
        for saved in state["queue"]:
            prompts = self.loader.batch_at(saved["loader_state"])
            self.queue.append(_Batch(None, saved["loader_state"], _restored(saved, prompts, self.sampling.n)))
        self.version = int(state["trainer_version"])
        self._send(self.version, self.actor.full_weights())
        self.sent_version = int(state["sent_version"])  # what the straight run's next sync compares with
        self.dispatched_since_sync = int(state["dispatched_since_sync"])
        self.validation_engine.set_generator_state(state["validation_generator"])

    # -- weights ---------------------------------------------------------------
    def _send(self, version: int, weights: dict) -> float:
        """A load of `weights` as policy `version` (attested when the process answers)."""
        seconds = self.loads.send(version, weights)
        self.sent_version = version
        self.dispatched_since_sync = len(self.queue)  # dispatched before the sync, not yet trained on
        return seconds

    def _wait(self, request_id: int):
        return self.loads.wait(request_id)


def _saved(batch: _Batch) -> dict:
    g, r = batch.generated, batch.generated.rollouts
    return {"loader_state": batch.loader_state, "response_ids": r.response_ids,
            "response_mask": r.response_mask, "rollout_logprobs": r.rollout_logprobs,
            "finish_reasons": list(r.finish_reasons), "versions": g.versions,
            "seconds": g.seconds, "continued": g.continued, "decode_steps": g.decode_steps}


def _restored(saved: dict, prompts: PromptBatch, n: int) -> Generated:
    """A saved batch's Generated record, its prompts laid out as the engine lays them."""
    rollouts = Rollouts(prompts.input_ids.repeat_interleave(n, 0), prompts.attention_mask.repeat_interleave(n, 0),
                        saved["response_ids"], saved["response_mask"], saved["rollout_logprobs"],
                        list(saved["finish_reasons"]), torch.arange(len(prompts)).repeat_interleave(n),
                        [s for s in prompts.samples for _ in range(n)])
    return Generated(rollouts, saved["versions"], float(saved["seconds"]), int(saved["continued"]),
                     decode_steps=int(saved.get("decode_steps", 0)))


class AsyncSampler:
    """The step's generate-and-score stage under async training (a `Sampler`)."""

    def __init__(self, rollout: AsyncRollout, draw: Draw) -> None:
        self.rollout, self.draw = rollout, draw
        self._last_call: float | None = None

    def __call__(self, timer: StageTimer) -> ScoredRollouts:
        rollout = self.rollout
        rollout.fill()
        busy_before = rollout.busy_seconds
        with timer("gen"):  # the trainer's wait for the batch
            generated = rollout.take()
        rollout.fill()  # the next batches generate while this one trains
        scored = score(self.draw, generated.rollouts, timer)
        scored.versions = generated.versions
        now = time.perf_counter()
        scored.metrics = staleness_metrics(generated, trainer_version=rollout.version)
        scored.behind_trainer = scored.metrics["fully_async/staleness/max"] > 0
        if self._last_call is not None:  # the rollout side's idle share since the last step
            busy = rollout.busy_seconds - busy_before
            scored.metrics["fully_async/rollouter/idle_ratio"] = max(0.0, 1 - busy / (now - self._last_call))
        self._last_call = now
        return scored


def staleness_metrics(generated: Generated, *, trainer_version: int) -> dict[str, float]:
    """How old a batch is when the trainer takes it: per response, the lag of
    its oldest token (trainer version - the version that sampled it)."""
    versions = generated.versions
    sampled = versions != NO_VERSION
    oldest = torch.where(sampled, versions, torch.iinfo(torch.long).max).min(-1).values  # [N]
    newest = torch.where(sampled, versions, NO_VERSION).max(-1).values
    has_tokens = sampled.any(-1)
    lag = (trainer_version - oldest)[has_tokens]
    span = (newest - oldest)[has_tokens]
    n = max(1, int(has_tokens.sum()))
    metrics = {
        "fully_async/staleness/mean": float(lag.float().mean()) if lag.numel() else 0.0,
        "fully_async/staleness/max": float(lag.max()) if lag.numel() else 0.0,
        "fully_async/count/current_param_version": float(trainer_version),
        "fully_async/count/stale_trajectory_processed": float((lag > 0).sum()),
        "fully_async/partial/total_partial_num": float(generated.continued),
        "fully_async/partial/partial_ratio": generated.continued / n,
        "fully_async/partial/max_partial_span": float(span.max()) if span.numel() else 0.0,
        "fully_async/rollouter/decode_steps": float(generated.decode_steps),
    }
    for k, count in zip(*torch.unique(lag, return_counts=True)):
        metrics[f"fully_async/samples_per_lag/{int(k)}"] = float(count)
    if generated.origins:  # streamed: the rollout process's loader drew the prompts
        metrics["training/epoch"] = float(max(epoch for epoch, _, _ in generated.origins))
    return metrics
