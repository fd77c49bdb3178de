"""Streaming rollout (`async_training.streaming`): the rollout process draws
prompts itself and decodes them with continuous batching; the trainer's
batch is the first `data.train_batch_size` groups to finish, whatever batch
their prompts were drawn in, as verl's fully-async rollouter streams samples.
A long response no longer holds its batch back: its slot keeps decoding
while freed slots take new prompts, and it joins a later batch.

Everything the engine does is a function of what it has done, never of when
a message arrived, so a seeded run is repeatable and a resumed one equals
the straight one:
- A group (one prompt's `rollout.n` responses) is admitted as soon as `n`
  slots are free, drawn from the engine's own copy of the prompt loader.
- Groups are emitted in the order they finish (ties: the order admitted);
  every `data.train_batch_size` of them make batch m = 1, 2, ...
- After emitting batch m the engine must hold the weights of the latest
  sync at or before step m + 1 - cap (`StreamSchedule.required`; cap from
  `async_training.staleness_threshold` and `trigger_parameter_sync_step`,
  as `Window`). If they have not come, it waits for them; it never applies
  weights at any other point, and emits no batch while it owes one. With
  partial rollout the running responses then continue under the new
  weights; without, no group is admitted until they have finished, and the
  weights are applied after.
- A running response keeps its cached keys and values across a load: the
  tokens it samples next come from the new weights attending over a prefix
  the older ones encoded (PipelineRL's in-flight weight update). Prefilling
  every running response again at every sync cost 2 s per batch against
  0.95 s of decoding (docs/benchmarks.md). The log-probs it records are
  those it sampled with, so they are the behaviour policy either way.
- Its sampling generator is its own (validation samples elsewhere).

A checkpoint observes the engine without changing what it does: no load is
forced, nothing is prefilled again. It takes the engine's whole state
between two ticks, wherever the engine is (`thinkrl.async_rollout.stream_state`):
the responses in flight with their tokens and cached keys and values, the
groups finished and the batches emitted but not yet taken, the loader
position, the generator, the weights it holds and the loads it has not
applied yet. Restored, the engine goes on exactly as it did, so a seeded
run trains the same tokens whatever `trainer.save_freq` is.

Shapes: S slots, V vocabulary, R response tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from thinkrl.async_rollout.server import NO_VERSION, Generated, right_padded
from thinkrl.data.dataset import Prompt, PromptLoader, collate
from thinkrl.errors import UserError
from thinkrl.models.lean_decoder import lean_spec
from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.continuous import SlotDecoder
from thinkrl.rollout.native import NativeEngine, sample_tokens


@dataclass(frozen=True)
class StreamSchedule:
    """When weights are synced and when the engine must hold them."""

    groups_per_batch: int
    """data.train_batch_size: groups in one emitted batch."""
    cap: int
    """`Window.cap`: batches generated per sync window."""
    sync_every: int
    """trigger_parameter_sync_step."""

    def is_sync(self, version: int) -> bool:
        """Is the trainer's version `version` sent? Every `sync_every` steps
        (and version 0, the weights a run starts from)."""
        return version % self.sync_every == 0

    def required(self, emitted: int) -> int:
        """The version the engine must hold after emitting `emitted` batches:
        the latest sync at or before step emitted + 1 - cap (0 at first)."""
        version = max(0, emitted + 1 - self.cap)
        while not self.is_sync(version):
            version -= 1
        return version


@dataclass(frozen=True)
class StreamArgs:
    """What the rollout process needs to stream (sent to it at start)."""

    loader: PromptLoader
    """A copy of the trainer's prompt loader, at the position to start from."""
    params: SamplingParams
    schedule: StreamSchedule
    slots: int
    partial: bool
    seed: int


@dataclass
class Group:
    """One prompt and its n responses, from admission to emission."""

    origin: tuple[int, int, int]
    """(epoch, position, row): where the loader drew its prompt (to draw it again)."""
    prompt: Tensor  # [P] the prompt's tokens, unpadded
    sample: object
    """The prompt's `Sample` (ground truth, data source) for scoring."""
    slots: list[int]
    tokens: list[Tensor | None]  # per response in sample order, set when it finishes
    logprobs: list[Tensor | None]
    versions: list[Tensor | None]
    reasons: list[str | None]

    @property
    def done(self) -> bool:
        return None not in self.reasons


class StreamEngine:
    """Continuous-batching generation over `engine`'s model (module docstring)."""

    def __init__(self, engine: NativeEngine, loader: PromptLoader, params: SamplingParams,
                 schedule: StreamSchedule, *, slots: int, partial: bool, seed: int) -> None:
        spec = lean_spec(engine.model)
        if spec is None:
            raise UserError("async_training.streaming: continuous batching covers plain "
                             "Llama/Qwen2/Qwen3/Mistral decoders; this model is not one. Set "
                             "async_training.streaming=False")
        self.engine, self.loader, self.params, self.schedule = engine, loader, params, schedule
        self.n, self.partial = params.n, partial
        self.slots = max(slots - slots % self.n, self.n)  # whole groups
        with engine.autocast():  # its fused weights in the compute dtype
            self.decoder = SlotDecoder(spec, slots=self.slots, device=engine.device)
        self.generator = torch.Generator(device=engine.device).manual_seed(seed)
        device, r = engine.device, params.max_tokens
        self.tokens = torch.zeros(self.slots, r, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(self.slots, r, device=device)
        self.versions = torch.full((self.slots, r), NO_VERSION, dtype=torch.long, device=device)
        self.counts = torch.zeros(self.slots, dtype=torch.long, device=device)
        self.active = torch.zeros(self.slots, dtype=torch.bool, device=device)
        self.logits: Tensor | None = None  # [S, V]: each active slot's next-token logits
        # [S]: the version whose weights computed them: the version of the token sampled
        # from them (the first token after a load comes from logits of the weights before it)
        self.logit_versions = torch.full((self.slots,), NO_VERSION, dtype=torch.long, device=device)
        self.owner: list[Group | None] = [None] * self.slots
        self.admitted: list[Group] = []  # in flight, in admission order
        self.finished: list[Group] = []  # done, not yet emitted, in finishing order
        self.ready: list[Generated] = []  # emitted, not yet taken
        self.drawn: list[tuple[tuple[int, int, int], Tensor, object]] = []  # drawn, not admitted
        self.loads: dict[int, dict[str, Tensor]] = {}
        self.version, self.required, self.emitted = NO_VERSION, 0, 0
        self.busy, self._busy_emitted = 0.0, 0.0
        self.steps, self._steps_emitted = 0, 0  # decoding forwards
        # None: EOS does not stop a response (ignore_eos)
        self.stop_ids = None if params.ignore_eos else engine.eos_token_ids.to(device)

    # -- the loop ---------------------------------------------------------------
    def offer(self, version: int, weights: dict[str, Tensor]) -> None:
        """Weights of `version` have come; applied when the schedule requires them."""
        self.loads[version] = weights

    def tick(self) -> bool:
        """One token for every running response (admitting, syncing and emitting
        around it). False when it cannot go on before a weight load comes."""
        started = time.perf_counter()
        running = bool(self.active.any())
        with torch.no_grad(), self.engine.autocast():
            if self.version < self.required and (self.partial or not running):
                if self.required not in self.loads:
                    return False
                self._apply()
            if self.version >= self.required:
                self._admit()
            self._decode()
        self.busy += time.perf_counter() - started
        self._emit()
        return True

    def take_ready(self) -> Generated | None:
        """The oldest emitted batch not yet taken, if any."""
        return self.ready.pop(0) if self.ready else None

    # -- stages of a tick -------------------------------------------------------
    def _apply(self) -> None:
        """Load the required version (every sync version is required in turn:
        no batch is emitted while one is owed, `_emit`)."""
        self.hold(self.required, self.loads.pop(self.required))

    def hold(self, version: int, weights: dict[str, Tensor]) -> None:
        """Serve `weights` as policy `version` from the next token on (the
        running responses keep their caches). Called inside `tick`'s
        autocast, or by a restore."""
        self.engine.update_weights(weights.items())
        self.decoder.refresh()
        self.version = version

    def _admit(self) -> None:
        """Groups into free slots, n at a time, while slots are free."""
        free = (~self.active).nonzero()[:, 0].tolist()
        admitted: list[Group] = []
        while len(free) >= self.n:
            if not self.drawn:
                self._draw()
            origin, prompt, sample = self.drawn.pop(0)
            slots, free = free[:self.n], free[self.n:]
            admitted.append(Group(origin, prompt, sample, slots, *([None] * self.n for _ in range(4))))
        if not admitted:
            return
        groups = torch.tensor([g.slots for g in admitted], device=self.tokens.device)  # [B, n]
        logits = self.decoder.prefill_groups(groups, [g.prompt for g in admitted])  # one per prompt
        for group, slots, row_logits in zip(admitted, groups, logits):
            self._set_logits(slots, row_logits.expand(self.n, -1))
            for s in group.slots:
                self.owner[s] = group
            self.counts[slots] = 0
            self.active[slots] = True
        self.admitted.extend(admitted)

    def _draw(self) -> None:
        state = self.loader.state_dict()  # loaded again, it draws this batch again
        batch = self.loader.next_batch()
        for row in range(len(batch)):
            origin = (int(state["epoch"]), int(state["position"]), row)
            self.drawn.append((origin, prompt_tokens(batch, row), batch.samples[row]))

    def _decode(self) -> None:
        """Sample one token for every running response, finish those that
        stopped (EOS, or the token budget), step the others."""
        rows = self.active.nonzero()[:, 0]
        if len(rows) == 0:
            return
        self.steps += 1
        token, logprob = sample_tokens(self.logits[rows].float(), self.params, self.generator,
                                       rows=rows, total=self.slots)
        at = self.counts[rows]
        self.tokens[rows, at], self.logprobs[rows, at] = token, logprob
        self.versions[rows, at] = self.logit_versions[rows]
        self.counts[rows] += 1
        stopped = (torch.zeros_like(token, dtype=torch.bool) if self.stop_ids is None
                   else torch.isin(token, self.stop_ids))
        done = stopped | (self.counts[rows] >= self.params.max_tokens)
        for slot, stop in zip(rows[done].tolist(), stopped[done].tolist()):
            self._finish(slot, FINISH_STOP if stop else FINISH_LENGTH)
        going = rows[~done]
        if len(going):
            self._set_logits(going, self.decoder.step(going, token[~done]))
        for group in [g for g in self.admitted if g.done]:
            self.admitted.remove(group)
            self.finished.append(group)

    def _finish(self, slot: int, reason: str) -> None:
        group, k = self.owner[slot], int(self.counts[slot])
        index = group.slots.index(slot)
        group.tokens[index] = self.tokens[slot, :k].clone().cpu()
        group.logprobs[index] = self.logprobs[slot, :k].clone().cpu()
        group.versions[index] = self.versions[slot, :k].clone().cpu()
        group.reasons[index] = reason
        self.active[slot] = False
        self.owner[slot] = None

    def _emit(self) -> None:
        """Every `groups_per_batch` finished groups make a batch, while no load
        is owed (the drain of partial_rollout=False could otherwise emit past
        a sync version and never apply it)."""
        b = self.schedule.groups_per_batch
        while len(self.finished) >= b and self.version >= self.required:
            groups, self.finished = self.finished[:b], self.finished[b:]
            self.ready.append(assemble(groups, pad=self.engine.pad_token_id,
                                       seconds=self.busy - self._busy_emitted,
                                       decode_steps=self.steps - self._steps_emitted))
            self._busy_emitted, self._steps_emitted = self.busy, self.steps
            self.emitted += 1
            self.required = max(self.required, self.schedule.required(self.emitted))

    def _set_logits(self, rows: Tensor, logits: Tensor) -> None:
        if self.logits is None:
            self.logits = torch.zeros(self.slots, logits.shape[-1], device=logits.device)
        self.logits[rows] = logits.float()
        self.logit_versions[rows] = self.version


def prompt_tokens(batch: PromptBatch, row: int) -> Tensor:
    return batch.input_ids[row][batch.attention_mask[row].bool()]


def assemble(groups: list[Group], *, pad: int, seconds: float, decode_steps: int) -> Generated:
    """The emitted batch, group by group, each group's responses in sample
    order: prompts [N, P] left-padded, responses, masks, log-probs and
    versions [N, R] right-padded (N = groups x n)."""
    n = len(groups[0].reasons)
    prompts = collate([Prompt(g.prompt.tolist(), g.sample) for g in groups], pad_token_id=pad)
    ids, mask, logprobs, versions = right_padded([t for g in groups for t in g.tokens],
                                                 [lp for g in groups for lp in g.logprobs],
                                                 [v for g in groups for v in g.versions], pad)
    continued = sum(int(len(torch.unique(v)) > 1) for g in groups for v in g.versions)
    rollouts = Rollouts(prompts.input_ids.repeat_interleave(n, 0),
                        prompts.attention_mask.repeat_interleave(n, 0), ids, mask, logprobs,
                        [reason for g in groups for reason in g.reasons],
                        torch.arange(len(groups)).repeat_interleave(n),
                        [g.sample for g in groups for _ in range(n)])
    return Generated(rollouts, versions, seconds, continued, decode_steps=decode_steps,
                     origins=[list(g.origin) for g in groups])
