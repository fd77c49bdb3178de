"""The shared-prompt pass (model.use_remove_padding) against the padded forward."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.models.forward import batched_response_logprobs, response_logprobs
from thinkrl.models.loading import prepare_for_training
from thinkrl.models.shared_prompt import distinct_prompts, response_mask_for_shared

G, P, R, V = 3, 5, 6, 40


def test_distinct_prompts_by_hand():
    ids = torch.tensor([[0, 7], [0, 7], [5, 6], [0, 7], [9, 9]])
    mask = torch.tensor([[0, 1], [0, 1], [1, 1], [0, 1], [1, 1]])
    first, inverse = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 2, 4] and inverse.tolist() == [0, 0, 1, 0, 2]
    # The same ids under another mask are another prompt.
    first, inverse = distinct_prompts(ids[:2], torch.tensor([[0, 1], [1, 1]]))
    assert first.tolist() == [0, 1] and inverse.tolist() == [0, 1]


def test_response_mask_by_hand():
    # prompt [pad, p], response [a, b, pad]: a sees p, a; b sees p, a, b; the pad query
    # sees what b sees and itself (never read, but no softmax row may be empty).
    mask = response_mask_for_shared(torch.tensor([[0, 1]]), torch.tensor([[1, 1, 0]]))[0, 0]
    assert mask.int().tolist() == [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 1, 1, 1, 1]]


def _model():
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3)
    return Qwen2ForCausalLM(cfg)


def _grouped_batch():
    """Two prompts (one left-padded) x G responses of lengths 6, 2, 4 | 1, 3, 2 (right-padded)."""
    gen = torch.Generator().manual_seed(3)
    prompts = torch.randint(3, V, (2, P), generator=gen)
    prompt_mask = torch.ones(2, P, dtype=torch.long)
    prompt_mask[1, :2] = 0
    lengths = torch.tensor([6, 2, 4, 1, 3, 2])
    response_mask = (torch.arange(R)[None] < lengths[:, None]).long()
    responses = torch.randint(3, V, (2 * G, R), generator=gen) * response_mask
    ids = torch.cat((prompts.repeat_interleave(G, 0) * prompt_mask.repeat_interleave(G, 0),
                     responses), 1)
    mask = torch.cat((prompt_mask.repeat_interleave(G, 0), response_mask), 1)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_mask.bool()


def _logprobs_entropies_grads(model, batch, **forward):
    """Log-probs, entropies and parameter gradients of (logp - 0.1 H) over the real tokens."""
    ids, mask, pos, real = batch
    model.zero_grad()
    logp, ent = response_logprobs(model, ids, mask, pos, response_length=R, temperature=0.8,
                                  with_entropy=True, entropy_grad=True, **forward)
    ((logp - 0.1 * ent) * real).sum().backward()
    return logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


def _assert_grads_close(got, want):
    # float32 sums in another order; relative to each gradient's norm (observed <= 1e-6).
    for a, b in zip(got, want):
        assert (a - b).norm() <= 1e-5 * b.norm(), ((a - b).norm() / b.norm()).item()


def test_logprobs_entropies_and_gradients_equal_the_padded_forward():
    model, batch = _model(), _grouped_batch()
    real = batch[3]
    lp0, e0, g0 = _logprobs_entropies_grads(model, batch)
    lp1, e1, g1 = _logprobs_entropies_grads(model, batch, remove_padding=True)
    assert lp1.shape == (2 * G, R)
    torch.testing.assert_close(lp1[real], lp0[real], rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(e1[real], e0[real], rtol=1e-6, atol=2e-6)
    # The gradient through each shared prompt is the sum over its G responses, as padded.
    _assert_grads_close(g1, g0)


def test_trailing_padding_columns_are_cut_and_zero():
    # Rows 3-5 alone: their longest response is 3, so columns 3.. are not computed.
    model = _model()
    ids, mask, pos, real = _grouped_batch()
    rows = slice(3, 6)
    cut = batched_response_logprobs(model, ids[rows], mask[rows], pos[rows], response_length=R,
                                    temperature=1.0, micro_batch_size=8, remove_padding=True)
    full = batched_response_logprobs(model, ids[rows], mask[rows], pos[rows], response_length=R,
                                     temperature=1.0, micro_batch_size=8)
    assert (cut[:, 3:] == 0).all()
    torch.testing.assert_close(cut[real[rows]], full[real[rows]], rtol=1e-6, atol=2e-6)


def test_one_token_responses():
    # R = 1: only the prompt runs; the logit is its last position's.
    model = _model()
    ids, mask, pos, real = _grouped_batch()
    ids, mask, pos = ids[:, :P + 1], mask[:, :P + 1], pos[:, :P + 1]
    with torch.no_grad():
        cut, _ = response_logprobs(model, ids, mask, pos, response_length=1, temperature=1.0,
                                   remove_padding=True)
        full, _ = response_logprobs(model, ids, mask, pos, response_length=1, temperature=1.0)
    torch.testing.assert_close(cut, full, rtol=1e-6, atol=2e-6)


def test_fused_head_equals_the_shared_prompt_pass_with_whole_logits(monkeypatch):
    from thinkrl.models import fused_head

    monkeypatch.setattr(fused_head, "CHUNK_LOGITS", 5 * V)  # chunks of 5 tokens, not all at once
    model, batch = _model(), _grouped_batch()
    lp0, e0, g0 = _logprobs_entropies_grads(model, batch, remove_padding=True)
    lp1, e1, g1 = _logprobs_entropies_grads(model, batch, remove_padding=True, fused_head=True)
    torch.testing.assert_close(lp1, lp0, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(e1, e0, rtol=1e-6, atol=2e-6)
    _assert_grads_close(g1, g0)


def _saved_tensor_count(model, batch) -> int:
    """How many tensors the forward of the shared-prompt pass keeps for backward."""
    ids, mask, pos, _ = batch
    count = 0

    def pack(t):
        nonlocal count
        count += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        response_logprobs(model, ids, mask, pos, response_length=R, temperature=1.0,
                          remove_padding=True)
    return count


def test_under_activation_checkpointing_layers_recompute_and_gradients_stay():
    model, batch = _model(), _grouped_batch()
    _, _, want = _logprobs_entropies_grads(model, batch)
    kept_plain = _saved_tensor_count(model, batch)
    prepare_for_training(model, device=None, gradient_checkpointing=True)  # as loading does
    kept_checkpointed = _saved_tensor_count(model, batch)
    # each layer keeps only its inputs; the rest is recomputed in backward
    assert kept_checkpointed < kept_plain / 2, (kept_checkpointed, kept_plain)
    lp, ent, got = _logprobs_entropies_grads(model, batch, remove_padding=True)
    _assert_grads_close(got, want)
