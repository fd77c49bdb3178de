"""Log-probs and entropies from logits against hand values and torch.distributions."""

import math

import torch

from thinkrl.models.logprobs import entropy_from_logits, logprobs_from_logits


def test_two_token_vocab_by_hand():
    # logits [0, ln 3] -> exp = [1, 3], sum 4 -> probs [1/4, 3/4]
    # log p = [-ln 4, ln 3/4] = [-1.386294, -0.287682]
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]])  # [1, 2, 2]
    labels = torch.tensor([[0, 1]])
    assert torch.allclose(logprobs_from_logits(logits, labels), torch.tensor([[-1.386294, -0.287682]]), atol=1e-6)
    assert torch.allclose(entropy_from_logits(logits), torch.tensor([[0.562335, 0.562335]]), atol=1e-6)


def test_three_token_uniform_and_shift_invariance():
    # logits [c, c, c] -> uniform 1/3: log p = -ln 3 = -1.098612, H = ln 3 = 1.098612, for any c
    # (c = 1000 would overflow a naive exp; logsumexp subtracts the max first). float32
    # spacing near 1000 is 6e-5, so the subtraction z - logsumexp(z) is only that exact.
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1000.0, 1000.0, 1000.0]]])
    labels = torch.tensor([[2, 0]])
    assert torch.allclose(logprobs_from_logits(logits, labels), torch.full((1, 2), -math.log(3)), atol=1e-4)
    assert torch.allclose(entropy_from_logits(logits), torch.full((1, 2), math.log(3)), atol=1e-4)


def test_matches_categorical():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 4, 7, generator=gen)
    labels = torch.randint(0, 7, (3, 4), generator=gen)
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(logprobs_from_logits(logits, labels), dist.log_prob(labels), atol=1e-5)
    assert torch.allclose(entropy_from_logits(logits), dist.entropy(), atol=1e-5)


def test_low_precision_input_is_computed_in_float32_with_grad():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 11, generator=gen).bfloat16().requires_grad_()
    labels = torch.randint(0, 11, (2, 3), generator=gen)
    logp = logprobs_from_logits(logits, labels)
    ent = entropy_from_logits(logits)
    assert logp.dtype == ent.dtype == torch.float32
    dist = torch.distributions.Categorical(logits=logits.detach().float())
    assert torch.allclose(logp, dist.log_prob(labels), atol=1e-5)
    assert torch.allclose(ent, dist.entropy(), atol=1e-5)
    # d log p_y / d z = onehot(y) - softmax(z), so each row's gradient sums to 0.
    logp.sum().backward()
    assert logits.grad is not None
    assert torch.allclose(logits.grad.float().sum(-1), torch.zeros(2, 3), atol=1e-2)
