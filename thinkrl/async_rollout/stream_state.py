"""A streaming engine's state in a checkpoint (`thinkrl.async_rollout.stream`):
tensors, numbers and strings only, as `torch.load(weights_only=True)` reads
them. Prompts are not stored: each group keeps where the loader drew it
(epoch, position, row), and a restored engine draws it again.

Taken between two ticks, wherever the engine is: the running responses keep
their cached keys and values and next-token logits (they were computed by
weights the trainer may no longer have), and the weights the engine holds
and the loads it has not applied are kept too, except those of the
trainer's own version (the checkpoint's actor weights: sent again at resume)
and the model's initial weights (a fresh engine starts from them)."""

from __future__ import annotations

import torch

from torch import Tensor

from thinkrl.async_rollout.server import NO_VERSION, Generated
from thinkrl.async_rollout.stream import StreamEngine, Group, prompt_tokens
from thinkrl.data.dataset import PromptLoader
from thinkrl.errors import UserError
from thinkrl.records import Rollouts

_RUNNING = ""  # the reason of a response still being generated


def snapshot(engine: StreamEngine, *, trainer_version: int) -> dict:
    """Everything the engine will go on from (the module's docstring).
    "held_weights" (None: the trainer's or the initial ones) and "pending"
    ({version: weights, None for the trainer's}) are the driver's to send back."""
    rows = engine.active.nonzero()[:, 0]
    omitted = (trainer_version, NO_VERSION)
    return {"loader": engine.loader.state_dict(), "generator": engine.generator.get_state(),
            "version": engine.version, "required": engine.required, "emitted": engine.emitted,
            "busy": engine.busy, "busy_emitted": engine._busy_emitted, "steps": engine.steps,
            "steps_emitted": engine._steps_emitted,
            "drawn": [list(origin) for origin, _, _ in engine.drawn],
            "admitted": [_group_state(engine, g) for g in engine.admitted],
            "finished": [_group_state(engine, g) for g in engine.finished],
            "ready": [generated_state(g) for g in engine.ready],
            "cache": engine.decoder.cache_of(rows),
            "logits": None if engine.logits is None else engine.logits[rows].cpu(),
            "logit_versions": engine.logit_versions[rows].cpu(),
            "held_weights": None if engine.version in omitted else _copied(engine.engine.model.state_dict()),
            # (loads are read, never written: no copy)
            "pending": {v: None if v == trainer_version else w for v, w in engine.loads.items()}}


def restore(engine: StreamEngine, state: dict, held_weights: dict[str, Tensor] | None) -> None:
    """`engine` as it was at `snapshot`, serving `held_weights` (None: the
    initial ones) as its version; the loads it had not applied come next,
    as loads."""
    if engine.emitted or engine.admitted or bool(engine.active.any()):
        raise AssertionError("a snapshot is restored into a fresh engine only")
    if held_weights is None and int(state["version"]) != NO_VERSION:
        raise AssertionError(f"a snapshot of an engine serving version {state['version']} needs its weights")
    used = [int(s) for g in state["admitted"] for s in g["slots"]]
    if used and max(used) >= engine.slots:
        raise UserError(f"the checkpoint's rollout ran {max(used) + 1}+ slots, this run has "
                         f"{engine.slots}: resume with the actor_rollout_ref.rollout.max_num_seqs "
                         "and data.train_batch_size it was saved with")
    redraw = Redraw(engine.loader)
    engine.loader.load_state_dict(state["loader"])
    engine.generator.set_state(state["generator"])
    if held_weights is not None:
        with torch.no_grad(), engine.engine.autocast():  # the fused copies as `tick` makes them
            engine.hold(int(state["version"]), held_weights)
    engine.version, engine.required, engine.emitted = (int(state[k]) for k in ("version", "required",
                                                                                "emitted"))
    engine.busy, engine._busy_emitted = float(state["busy"]), float(state["busy_emitted"])
    engine.steps, engine._steps_emitted = int(state["steps"]), int(state["steps_emitted"])
    engine.drawn = [(tuple(o), *redraw(o)) for o in state["drawn"]]
    engine.admitted = [_group(engine, g, redraw) for g in state["admitted"]]
    engine.finished = [_group(engine, g, redraw) for g in state["finished"]]
    engine.ready = [restored_generated(g, redraw) for g in state["ready"]]
    engine.decoder.load_cache(state["cache"])
    rows = state["cache"]["rows"].to(engine.tokens.device)
    if state["logits"] is not None:
        engine._set_logits(rows, state["logits"].to(engine.tokens.device))
    engine.logit_versions[rows] = state["logit_versions"].to(engine.tokens.device)


def _copied(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """A host copy of the weights served: the snapshot is a value, not a view
    of parameters the next load overwrites."""
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights.items()}


class Redraw:
    """A group's prompt tokens and sample, drawn again from its origin."""

    def __init__(self, loader: PromptLoader) -> None:
        self.loader, self._batches = loader, {}

    def __call__(self, origin) -> tuple[torch.Tensor, object]:
        epoch, position, row = (int(x) for x in origin)
        if (epoch, position) not in self._batches:
            self._batches[epoch, position] = self.loader.batch_at({"epoch": epoch, "position": position})
        batch = self._batches[epoch, position]
        return prompt_tokens(batch, row), batch.samples[row]


def _group_state(engine: StreamEngine, group: Group) -> dict:
    responses = []
    for index, slot in enumerate(group.slots):
        if group.reasons[index] is not None:
            responses.append((group.tokens[index], group.logprobs[index], group.versions[index],
                              group.reasons[index]))
        else:
            k = int(engine.counts[slot])
            responses.append((engine.tokens[slot, :k].clone().cpu(), engine.logprobs[slot, :k].clone().cpu(),
                              engine.versions[slot, :k].clone().cpu(), _RUNNING))
    tokens, logprobs, versions, reasons = (list(x) for x in zip(*responses))
    return {"origin": list(group.origin), "slots": list(group.slots), "tokens": tokens,
            "logprobs": logprobs, "versions": versions, "reasons": reasons}


def _group(engine: StreamEngine, state: dict, redraw: Redraw) -> Group:
    prompt, sample = redraw(state["origin"])
    running = [r == _RUNNING for r in state["reasons"]]
    group = Group(tuple(state["origin"]), prompt, sample, [int(s) for s in state["slots"]],
                   *[[None if run else x for x, run in zip(state[key], running)]
                     for key in ("tokens", "logprobs", "versions", "reasons")])
    for slot, run, tokens, logprobs, versions in zip(group.slots, running, state["tokens"],
                                                     state["logprobs"], state["versions"]):
        if run:
            k = len(tokens)
            engine.tokens[slot, :k], engine.logprobs[slot, :k] = tokens, logprobs
            engine.versions[slot, :k] = versions
            engine.counts[slot], engine.active[slot], engine.owner[slot] = k, True, group
    return group


def generated_state(generated: Generated) -> dict:
    r = generated.rollouts
    return {"prompt_ids": r.prompt_ids, "prompt_mask": r.prompt_mask, "response_ids": r.response_ids,
            "response_mask": r.response_mask, "rollout_logprobs": r.rollout_logprobs,
            "finish_reasons": list(r.finish_reasons), "group_ids": r.group_ids,
            "versions": generated.versions, "seconds": generated.seconds,
            "continued": generated.continued, "decode_steps": generated.decode_steps,
            "origins": generated.origins}


def restored_generated(state: dict, redraw: Redraw) -> Generated:
    n = len(state["finish_reasons"]) // len(state["origins"])
    samples = [redraw(o)[1] for o in state["origins"] for _ in range(n)]
    rollouts = Rollouts(state["prompt_ids"], state["prompt_mask"], state["response_ids"],
                        state["response_mask"], state["rollout_logprobs"],
                        list(state["finish_reasons"]), state["group_ids"], samples)
    return Generated(rollouts, state["versions"], float(state["seconds"]), int(state["continued"]),
                     decode_steps=int(state["decode_steps"]), origins=[list(o) for o in state["origins"]])
