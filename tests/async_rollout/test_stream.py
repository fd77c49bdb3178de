"""Streaming rollout's pieces without a process: the slot cache against the
model's own forward, the sync schedule's numbers, and the engine: whole
groups in batches, the same stream twice, and a restored snapshot going on
as the straight engine did."""

from __future__ import annotations

import io

import pytest
import torch

from thinkrl.async_rollout.server import NO_VERSION, RolloutServer
from thinkrl.async_rollout.stream import StreamEngine, StreamSchedule
from thinkrl.async_rollout.stream_state import restore, snapshot
from thinkrl.data.dataset import Prompt, PromptLoader
from thinkrl.models.lean_decoder import lean_spec
from thinkrl.records import FINISH_LENGTH, Sample
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.continuous import SlotDecoder


def test_slots_give_the_model_s_own_logits_while_others_join_and_copy(spec_and_tokenizer):
    model = RolloutServer(spec_and_tokenizer[0]).engine.model
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, 300, (n,), generator=generator) for n in (7, 12, 5)]

    def reference(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids[None]).logits[0, -1]

    with torch.no_grad():
        decoder = SlotDecoder(lean_spec(model), slots=4, device=torch.device("cpu"))
        rows = torch.tensor([0, 2, 3])
        logits = decoder.prefill(rows, sequences)
        for step in range(4):
            token = logits.argmax(-1)
            sequences = [torch.cat([s, token[i:i + 1]]) for i, s in enumerate(sequences)]
            if step == 1:  # a prompt joins slot 1 while the others decode
                joined = torch.randint(3, 300, (9,), generator=generator)
                assert torch.allclose(decoder.prefill(torch.tensor([1]), [joined])[0], reference(joined),
                                      atol=1e-4)
            logits = decoder.step(rows, token)
            for i, s in enumerate(sequences):
                assert torch.allclose(logits[i], reference(s), atol=1e-4), (step, i)
        decoder.copy(torch.tensor([0]), torch.tensor([1]))  # slot 1 now continues slot 0
        both = decoder.step(torch.arange(4), torch.tensor([5, 5, 6, 7]))
        assert torch.equal(both[0], both[1])


def test_the_version_required_after_each_batch():
    one_step_off = StreamSchedule(groups_per_batch=4, cap=2, sync_every=1)
    assert [one_step_off.required(m) for m in range(6)] == [0, 0, 1, 2, 3, 4]
    # trigger_parameter_sync_step=4, staleness_threshold=0.5: cap = floor(1.5 * 4) = 6;
    # after batch m, the latest sync step at or before m + 1 - 6.
    windowed = StreamSchedule(groups_per_batch=4, cap=6, sync_every=4)
    assert [windowed.required(m) for m in (5, 8, 9, 12, 13)] == [0, 0, 4, 4, 8]
    assert [windowed.is_sync(v) for v in (0, 3, 4, 6, 8)] == [True, False, True, False, True]


def _engine(spec, tokenizer, *, partial: bool = True) -> StreamEngine:
    questions = [f"Ava has {i} apples. She buys {i % 5 + 1} more. How many apples?" for i in range(24)]
    prompts = [Prompt(ids=tokenizer(q)["input_ids"], sample=Sample("thinkrl/arith", str(i), q, index=i))
               for i, q in enumerate(questions)]
    loader = PromptLoader(prompts, batch_size=3, shuffle=True, seed=1, pad_token_id=tokenizer.pad_token_id)
    return StreamEngine(RolloutServer(spec).engine, loader, SamplingParams(n=2, max_tokens=24),
                        StreamSchedule(groups_per_batch=3, cap=2, sync_every=1),
                        slots=6, partial=partial, seed=3)


def _weights(base: dict, version: int) -> dict:
    """Policy `version` of the harness: the model's matrices scaled by 1 + version / 100."""
    return {k: w * (1 + version / 100) if w.dim() > 1 else w for k, w in base.items()}


def _stream(engine: StreamEngine, batches: int, base: dict, snapshot_at: int | None = None,
            trainer_version: int = 0):
    """Tick and collect emitted batches; the trainer's version is the number of
    batches taken, offered as soon as a batch is taken (as the trainer sends
    step m's weights after training on batch m). At the first tick from
    `snapshot_at` on that emits a batch, before it is taken: the engine's
    snapshot, the trainer's version and the batches taken by then."""
    out, taken, ticks = [], None, 0
    if engine.version == NO_VERSION and not engine.loads:
        engine.offer(0, _weights(base, 0))
    while len(out) < batches:
        assert engine.tick(), "the trainer has sent every version the engine may ask for"
        ticks += 1
        if snapshot_at is not None and ticks >= snapshot_at and taken is None and engine.ready:
            taken = (snapshot(engine, trainer_version=trainer_version), trainer_version, len(out))
        while (batch := engine.take_ready()) is not None:
            out.append(batch)
            trainer_version += 1
            engine.offer(trainer_version, _weights(base, trainer_version))
    return out, taken


@pytest.mark.parametrize("partial", [True, False])
def test_batches_are_whole_groups_the_stream_repeats_and_a_restored_engine_goes_on(spec_and_tokenizer,
                                                                                  partial):
    """Weights version v: the model's scaled by 1 + v / 100, given when the
    engine asks. Without partial rollout the running responses drain before
    a load, so none spans two versions. A snapshot taken mid-stream (responses
    running over a cache of older weights, a load not applied yet), restored
    into a fresh engine, goes on bit for bit as the straight engine did."""
    spec, tokenizer = spec_and_tokenizer
    first = _engine(spec, tokenizer, partial=partial)
    base = {k: v.clone() for k, v in first.engine.model.state_dict().items()}
    straight, (state, trainer_version, out_then) = _stream(first, 7, base, snapshot_at=70)
    again, _ = _stream(_engine(spec, tokenizer, partial=partial), 7, base)
    lengths = torch.cat([b.rollouts.response_mask.sum(-1) for b in straight])
    assert lengths.min() < lengths.max()  # responses end at different steps
    for m, (batch, twin) in enumerate(zip(straight, again), start=1):
        r = batch.rollouts
        assert len(batch.origins) == 3 and r.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
        stamped = batch.versions[r.response_mask.bool()]
        assert (stamped != NO_VERSION).all() and int(stamped.max()) <= max(0, m - 1)
        assert torch.equal(r.response_ids, twin.rollouts.response_ids)
        assert torch.equal(r.rollout_logprobs, twin.rollouts.rollout_logprobs)
        short = r.response_mask.sum(-1) < 24  # a response under the budget stopped at EOS
        assert all(reason != FINISH_LENGTH for reason, s in zip(r.finish_reasons, short) if s)
    spans = [len(torch.unique(v[v != NO_VERSION])) > 1 for b in straight for v in b.versions]
    assert any(spans) == partial
    origins = [tuple(o) for b in straight for o in b.origins]
    assert len(set(origins)) == len(origins)  # no prompt trained twice

    assert 0 < out_then < 7 and state["admitted"] and state["ready"]  # mid-stream: running, not taken
    saved = io.BytesIO()
    torch.save(state, saved)  # a checkpoint reads it with weights_only=True
    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    held, pending = state.pop("held_weights"), state.pop("pending")
    version = int(state["version"])
    assert all((w is None) == (v == trainer_version) for v, w in pending.items())  # the trainer's own
    assert held is not None and version < trainer_version and pending  # held older weights, loads owed
    resumed = _engine(spec, tokenizer, partial=partial)
    restore(resumed, state, held)
    for v, w in sorted(pending.items()):
        resumed.offer(v, _weights(base, v) if w is None else w)
    rest, _ = _stream(resumed, 7 - out_then, base, trainer_version=trainer_version)
    for batch, twin in zip(straight[out_then:], rest, strict=True):
        assert batch.origins == twin.origins
        assert torch.equal(batch.rollouts.response_ids, twin.rollouts.response_ids)
        assert torch.equal(batch.versions, twin.versions)
        assert torch.equal(batch.rollouts.rollout_logprobs, twin.rollouts.rollout_logprobs)


def test_each_token_is_stamped_with_the_weights_that_computed_its_logits(spec_and_tokenizer):
    """Peer bugs of this class: a prompt's cached keys and values reused after
    a sync (stale prefix KV), and a token stamped with the version applied
    just before it was sampled although its logits came from the weights
    before that load. Weights version v: the model's matrices scaled by
    1 + v / 100. Every response's tokens up to its first change of version
    are those of one forward of the model under the version they are stamped
    with, prompt included (so the prompt was prefilled by those weights);
    the first token stamped with a newer version was not sampled from the
    older weights' logits."""
    spec, tokenizer = spec_and_tokenizer
    engine = _engine(spec, tokenizer, partial=True)
    base = {k: v.clone() for k, v in engine.engine.model.state_dict().items()}
    batches, _ = _stream(engine, 5, base)
    reference = RolloutServer(spec).engine.model

    def logprobs(version: int, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        reference.load_state_dict(_weights(base, version))
        with torch.no_grad():
            logits = reference(input_ids=torch.cat([prompt, tokens])[None]).logits[0].float()
        picked = logits[len(prompt) - 1:-1].log_softmax(-1)
        return picked.gather(-1, tokens[:, None])[:, 0]

    changes = 0
    for batch in batches:
        r = batch.rollouts
        for i in range(len(r)):
            k = int(r.response_mask[i].sum())
            tokens, versions, recorded = r.response_ids[i, :k], batch.versions[i, :k], r.rollout_logprobs[i, :k]
            prompt = r.prompt_ids[i][r.prompt_mask[i].bool()]
            first = int(versions[0])
            same = int((versions == first).sum()) if bool((versions == first).all()) else \
                int((versions != first).nonzero()[0, 0])
            assert torch.allclose(recorded[:same], logprobs(first, prompt, tokens[:same]), atol=1e-4), i
            if same < k:  # the first token of the newer version
                changes += 1
                older = logprobs(first, prompt, tokens[:same + 1])[same]
                assert abs(float(recorded[same] - older)) > 1e-4, (i, same)
    assert changes > 0  # responses did span a load
