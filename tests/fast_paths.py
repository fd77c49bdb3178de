"""What the fast-path tests of several model families share: the lean
forward checked against transformers' (logits and gradients), a left-padded
prompt batch, transformers' own greedy decode, and the check that the native
engine's fast loop decodes what it does."""

from __future__ import annotations

import torch

from thinkrl.records import PromptBatch, Sample
from thinkrl.rollout.base import SamplingParams

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14], [15, 16]]


def prompt_batch(prompts: list[list[int]] = PROMPTS) -> PromptBatch:
    """The prompts left-padded with 0 into one batch."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):], mask[row, width - len(p):] = torch.tensor(p), 1
    return PromptBatch(input_ids=ids, attention_mask=mask,
                       samples=[Sample(data_source="s", ground_truth="0", prompt_text="p", index=i)
                                for i in range(len(prompts))])


@torch.no_grad()
def greedy(model, prompt: list[int], steps: int, eos: int = 1) -> list[int]:
    """transformers' forward, one token at a time, argmax, until `eos`."""
    seq, out = list(prompt), []
    for _ in range(steps):
        token = int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax())
        out.append(token)
        seq.append(token)
        if token == eos:
            break
    return out


def assert_fast_loop_decodes_greedily(model, steps: int = 10) -> None:
    """The native engine takes its lean loop on `model` and decodes PROMPTS as `greedy` does."""
    from thinkrl.rollout.native import NativeEngine

    engine = NativeEngine(model, eos_token_ids=[1], pad_token_id=0)
    assert engine._lean is not None  # the fast loop, not the padded one
    out = engine.generate(prompt_batch(), SamplingParams(n=1, max_tokens=steps, temperature=0.0, do_sample=False))
    for row, p in enumerate(PROMPTS):
        got = out.response_ids[row][out.response_mask[row].bool()].tolist()
        assert got == greedy(model, p, steps), row


def lean_forward_gradients(model, ids, mask, pos, *, keep: int = 5) -> dict:
    """The lean forward's logits of the last `keep` positions and every
    parameter's gradient of their log-sum-exp equal transformers' (float32
    rounding); returns transformers' gradients by name."""
    from thinkrl.models.lean_decoder import decoder_logits, lean_spec, padding_attention_mask

    hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -keep:]
    real = mask[:, -keep:].bool()
    hf[real].logsumexp(-1).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lean = decoder_logits(lean_spec(model), ids, pos, padding_attention_mask(mask, ids.shape[1]), keep=keep)
    lean[real].logsumexp(-1).sum().backward()
    assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4), name
    return want


@torch.no_grad()
def assert_slots_give_transformers_logits(model, vocab: int) -> None:
    """Continuous batching's slot decoder: three sequences prefilled, then 3
    greedy steps, each slot's logits transformers' for its whole sequence."""
    from thinkrl.models.lean_decoder import lean_spec
    from thinkrl.rollout.continuous import SlotDecoder

    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(3, vocab, (n,), generator=generator) for n in (7, 12, 5)]
    decoder = SlotDecoder(lean_spec(model), slots=3, device=torch.device("cpu"))
    rows = torch.tensor([0, 1, 2])
    logits = decoder.prefill(rows, sequences)
    for step in range(3):
        token = logits.argmax(-1)
        sequences = [torch.cat([s, token[i:i + 1]]) for i, s in enumerate(sequences)]
        logits = decoder.step(rows, token)
        for i, s in enumerate(sequences):
            assert torch.allclose(logits[i], model(input_ids=s[None]).logits[0, -1], atol=1e-4), (step, i)
