"""The rollout side of async training as a plain class (no process): its
attested weight loads, version stamps, and partial rollout's chunked decoding."""

from __future__ import annotations

import time

import pytest
import torch

from thinkrl.async_rollout.server import NO_VERSION, RolloutServer
from thinkrl.data.dataset import Prompt, collate
from thinkrl.records import Sample
from thinkrl.rollout.attest import (Ledger, WeightSyncMismatch, check_served, recording,
                                    served_by_engine)
from thinkrl.rollout.base import SamplingParams

QUESTIONS = ["What is 12 + 7?", "Tom has 3 apples and buys 5 more. How many?", "9 * 3 = ?"]


def prompts(tokenizer):
    rows = []
    for i, q in enumerate(QUESTIONS):
        ids = tokenizer(q)["input_ids"]
        rows.append(Prompt(ids=ids, sample=Sample("thinkrl/arith", "0", q, index=i)))
    return collate(rows, pad_token_id=tokenizer.pad_token_id)


def trainer_weights(server: RolloutServer, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() * scale for k, v in server.engine.model.state_dict().items()}


def attest(server: RolloutServer, weights: dict, version: int) -> None:
    sent = Ledger()
    weights = dict(recording(weights.items(), sent, dtype=torch.float32))
    check_served(sent, served_by_engine([server.load(version, weights)], sent),
                 engine="the rollout process", version=version)


def test_a_load_is_attested_and_a_corrupted_copy_is_named(spec_and_tokenizer):
    spec, _ = spec_and_tokenizer
    server = RolloutServer(spec)
    weights = trainer_weights(server, scale=1.01)
    attest(server, weights, version=2)
    assert server.version == 2
    real_load = server.engine.update_weights

    def load_then_corrupt(named):
        real_load(named)
        with torch.no_grad():
            server.engine.model.model.layers[1].mlp.up_proj.weight[0, 0] += 1e-4
    server.engine.update_weights = load_then_corrupt
    with pytest.raises(WeightSyncMismatch, match=r"policy version 3: the rollout process .*"
                                                 r"'layers\.1\.mlp\.up_proj\.weight'"):
        attest(server, weights, version=3)


def test_every_token_is_stamped_with_the_version_that_sampled_it(spec_and_tokenizer):
    spec, tokenizer = spec_and_tokenizer
    server = RolloutServer(spec)
    server.version = 5
    out = server.generate(prompts(tokenizer), SamplingParams(n=2, max_tokens=12))
    mask = out.rollouts.response_mask.bool()
    assert out.versions[mask].eq(5).all() and out.versions[~mask].eq(NO_VERSION).all()
    assert out.continued == 0 and out.seconds > 0


def test_paused_decoding_without_new_weights_gives_the_greedy_tokens_of_one_call(spec_and_tokenizer):
    spec, tokenizer = spec_and_tokenizer
    params = SamplingParams(n=2, max_tokens=20, do_sample=False)
    whole = RolloutServer(spec).generate(prompts(tokenizer), params)
    looks = iter([False, True, True, False])  # pauses at tokens 12 and 18 (a load "waits")
    chunked = RolloutServer(spec, chunk_tokens=6).generate(
        prompts(tokenizer), params, apply_pending=lambda: None, pending=lambda: next(looks, False))
    assert chunked.rollouts.response_ids.tolist() == whole.rollouts.response_ids.tolist()
    assert chunked.rollouts.response_mask.tolist() == whole.rollouts.response_mask.tolist()
    assert chunked.rollouts.finish_reasons == whole.rollouts.finish_reasons
    torch.testing.assert_close(chunked.rollouts.rollout_logprobs, whole.rollouts.rollout_logprobs,
                               atol=1e-4, rtol=0)


def test_a_load_between_chunks_switches_the_running_rows_to_the_new_version(spec_and_tokenizer):
    spec, tokenizer = spec_and_tokenizer
    server = RolloutServer(spec, chunk_tokens=4)
    server.version = 1
    new_weights = trainer_weights(server, scale=1.001)
    looks = []

    def pending():  # the second look (after 8 tokens) finds version 2's weights waiting
        looks.append(1)
        return len(looks) == 2
    out = server.generate(prompts(tokenizer), SamplingParams(n=2, max_tokens=16, ignore_eos=True),
                          apply_pending=lambda: server.load(2, new_weights), pending=pending)
    versions = out.versions
    assert versions.shape == (6, 16)
    assert versions[:, :8].eq(1).all() and versions[:, 8:].eq(2).all()  # paused after 8 tokens
    assert out.continued == 6
    assert out.rollouts.response_mask.eq(1).all() and set(out.rollouts.finish_reasons) == {"length"}


def test_a_big_load_sent_while_the_process_sends_a_big_batch_does_not_deadlock(spec_and_tokenizer):
    """Both messages exceed a pipe's buffer: with the trainer writing its
    weights while the process writes its responses, neither may wait for the
    other to read (before the client's sender and receiver threads, both did)."""
    from thinkrl.async_rollout.process import RolloutProcess
    from thinkrl.async_rollout.server import Generated

    import threading

    spec, tokenizer = spec_and_tokenizer
    weights = {k: torch.randn(v.shape) for k, v in RolloutServer(spec).engine.model.state_dict().items()}
    batch = prompts(tokenizer)
    many = type(batch)(batch.input_ids.repeat(40, 1), batch.attention_mask.repeat(40, 1),
                       batch.samples * 40)
    process = RolloutProcess(spec, chunk_tokens=0, threads=1, timeout_s=120)
    got = []

    def exchange():  # a deadlock blocks a send, where no deadline reaches: hence the thread
        generating = process.submit("generate", many, SamplingParams(n=8, max_tokens=24))
        time.sleep(3)  # the process is now writing its responses, and nobody reads them yet
        loading = process.submit("load", 1, weights)
        got.extend([process.wait(generating), process.wait(loading)])
    try:
        worker = threading.Thread(target=exchange, daemon=True)
        worker.start()
        worker.join(240)
        assert not worker.is_alive(), "the trainer and the rollout process wait for each other"
    finally:
        if worker.is_alive():
            process.process.kill()  # unblocks both
        process.close()
    assert isinstance(got[0], Generated) and isinstance(got[1], Ledger)
    assert not process.process.is_alive()


def test_a_rollout_process_that_cannot_start_says_why(spec_and_tokenizer, tmp_path):
    import dataclasses

    from thinkrl.async_rollout.process import RolloutProcess
    from thinkrl.errors import WorkerFailed

    spec, _ = spec_and_tokenizer
    missing = dataclasses.replace(spec, model_path=str(tmp_path / "no-such-model"))
    with pytest.raises(WorkerFailed, match=r"(?s)failed during start \(loading the model\):.*no-such-model"):
        RolloutProcess(missing, chunk_tokens=0, threads=1, timeout_s=120)
