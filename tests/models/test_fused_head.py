"""The chunked output head (model.use_fused_kernels) against materialized logits."""

import pytest
import torch

from thinkrl.models.fused_head import chunk_tokens, head_logprobs
from thinkrl.models.logprobs import entropy_from_logits, logprobs_from_logits

T, E, V = 10, 6, 11


def _inputs(bias=True):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, T // 2, E, generator=g, requires_grad=True)
    weight = torch.randn(V, E, generator=g, requires_grad=True)
    b = torch.randn(V, generator=g, requires_grad=True) if bias else None
    labels = torch.randint(0, V, (2, T // 2), generator=g)
    return hidden, weight, b, labels


def _materialized(hidden, weight, bias, labels, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias) / temperature
    return logprobs_from_logits(logits, labels), entropy_from_logits(logits)


def _grads(*tensors):
    return [None if t is None else t.grad.clone() for t in tensors]


@pytest.mark.parametrize("chunk", [1, 3, 100])  # one token, uneven chunks, all at once
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_logprobs_entropies_and_gradients_equal_materialized_logits(chunk, entropy_grad):
    hidden, weight, bias, labels = _inputs()
    w_lp, w_ent = _materialized(hidden, weight, bias, labels, 0.7)
    (w_lp * 1.3 - 0.2 * (w_ent if entropy_grad else w_ent.detach())).sum().backward()
    want = _grads(hidden, weight, bias)
    for t in (hidden, weight, bias):
        t.grad = None
    lp, ent = head_logprobs(hidden, weight, bias, labels, temperature=0.7, with_entropy=True,
                            entropy_grad=entropy_grad, chunk=chunk)
    assert lp.shape == ent.shape == labels.shape and lp.dtype == torch.float32
    assert ent.requires_grad == entropy_grad
    (lp * 1.3 - 0.2 * ent).sum().backward()
    torch.testing.assert_close(lp, w_lp, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ent, w_ent, rtol=1e-5, atol=5e-6)  # float32 rounding
    for got, exp in zip(_grads(hidden, weight, bias), want):
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-6)


def test_without_bias_or_entropy_and_without_grad():
    hidden, weight, _, labels = _inputs(bias=False)
    lp, ent = head_logprobs(hidden, weight, None, labels, chunk=4)
    assert ent is None
    lp.sum().backward()
    w_lp, _ = _materialized(hidden.detach(), weight.detach(), None, labels, 1.0)
    torch.testing.assert_close(lp.detach(), w_lp)
    assert hidden.grad is not None and weight.grad is not None
    with torch.no_grad():
        lp2, _ = head_logprobs(hidden, weight, None, labels, chunk=4)
    torch.testing.assert_close(lp2, lp.detach())


def test_under_bfloat16_autocast_the_product_is_bfloat16_like_the_model_head():
    hidden, weight, bias, labels = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = logprobs_from_logits(torch.nn.functional.linear(hidden, weight, bias), labels)
    want.sum().backward()
    want_grads = _grads(hidden, weight, bias)
    for t in (hidden, weight, bias):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = head_logprobs(hidden, weight, bias, labels, chunk=3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    got.sum().backward()
    assert weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    for g, w in zip(_grads(hidden, weight, bias), want_grads):
        # Both take their products in bfloat16; gradients agree to its precision.
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


def test_chunk_size_caps_the_logits_held_at_once():
    assert chunk_tokens(151_936) == (1 << 24) // 151_936 == 110
    assert chunk_tokens(48) > 64 * 512  # a small vocabulary: the whole batch in one chunk
