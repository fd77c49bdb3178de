"""GAE advantages and returns, the clipped value loss and explained variance, on numbers
worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from thinkrl.algos.advantages import build_advantage_estimator
from thinkrl.algos.gae import explained_variance, gae_advantage, gae_advantages_and_returns, value_loss
from thinkrl.algos.losses import LOSS_AGG_MODES, LossScale
from thinkrl.config.schema import AlgorithmConfig


def _whiten(values: list[float]) -> list[float]:
    """(x - mean) / sqrt(unbiased var + 1e-8), written out for the expected numbers."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_gae_one_response_by_hand():
    # T = 3, reward 1 on the last token; gamma = 0.5, lam = 0.5 (gamma * lam = 0.25)
    # V = [0.5, 0.25, 0.75]
    # t=2: delta = 1 + 0.5*0 - 0.75 = 0.25;          A2 = 0.25
    # t=1: delta = 0 + 0.5*0.75 - 0.25 = 0.125;      A1 = 0.125 + 0.25*0.25 = 0.1875
    # t=0: delta = 0 + 0.5*0.25 - 0.5 = -0.375;      A0 = -0.375 + 0.25*0.1875 = -0.328125
    # returns = A + V = [0.171875, 0.4375, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.75]])
    mask = torch.ones(1, 3)
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.171875, 0.4375, 1.0]]))
    raw = [-0.328125, 0.1875, 0.25]
    torch.testing.assert_close(adv, torch.tensor([_whiten(raw)]))


def test_gae_with_gamma_and_lam_one_is_the_return_minus_the_value():
    # gamma = lam = 1: A_t = sum_{t' >= t} r_t' - V_t (the deltas telescope), so returns are the
    # Monte-Carlo return-to-go: 2 on every token of row 0, 3 on the real tokens of row 1.
    rewards = torch.tensor([[0.0, 2.0], [0.0, 3.0]])
    values = torch.tensor([[0.5, 1.5], [1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # row 1: one token, then padding
    rewards[1, 0], rewards[1, 1] = 3.0, 0.0  # the outcome sits on the last real token
    _, returns = gae_advantages_and_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert returns[0].tolist() == [2.0, 2.0]
    assert returns[1, 0].item() == 3.0


def test_padding_passes_the_next_real_tokens_value_and_advantage_through():
    # mask [1, 0, 1]: token 1 is not an action (a tool output, say). gamma = 1, lam = 1.
    # t=2: A2 = 1 - 0.5 = 0.5, next V = 0.5, next A = 0.5
    # t=1 (masked): carries V = 0.5, A = 0.5 (its own delta 0 + 0.5 - 9 is ignored)
    # t=0: delta = 0 + 1*0.5 - 0.25 = 0.25; A0 = 0.25 + 0.5 = 0.75
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.25, 9.0, 0.5]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert returns[0, 0].item() == 1.0 and returns[0, 2].item() == 1.0  # 0.75 + 0.25, 0.5 + 0.5
    # whitened over the two real tokens [0.75, 0.5]: mean 0.625, unbiased var 0.03125
    s = math.sqrt(0.03125 + 1e-8)
    torch.testing.assert_close(adv, torch.tensor([[0.125 / s, 0.0, -0.125 / s]]))


def test_the_registered_estimator_binds_gamma_and_lam():
    fn = build_advantage_estimator(AlgorithmConfig(adv_estimator="gae", gamma=0.5, lam=0.5))
    assert fn.keywords == {"gamma": 0.5, "lam": 0.5}
    rewards, values, mask = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.25, 0.75]]), torch.ones(1, 3)
    result = fn(rewards, mask, torch.tensor([0]), values=values)
    advantages, returns = gae_advantages_and_returns(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(result.advantages, advantages)
    torch.testing.assert_close(result.returns, returns)  # from the same pass: the critic's target
    assert gae_advantage(rewards, mask, torch.tensor([0]), values=values, gamma=0.5,
                         lam=0.5).returns is not None


def test_value_loss_clips_by_hand():
    # c = 0.5, token-mean over 3 tokens.
    # token 0: v = 1.0, V_old = 0.0, R = 2.0 -> v_clip = 0.5; (1-2)^2 = 1, (0.5-2)^2 = 2.25 -> 2.25, clipped
    # token 1: v = 1.0, V_old = 0.8, R = 0.0 -> v_clip = 1.0; 1, 1 -> 1, not clipped (equal)
    # token 2: v = 0.2, V_old = 0.0, R = 0.0 -> v_clip = 0.2; 0.04, 0.04 -> 0.04
    # loss = 0.5 * (2.25 + 1 + 0.04) / 3 = 0.548333...
    vpreds = torch.tensor([[1.0, 1.0, 0.2]], requires_grad=True)
    returns, values, mask = torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.8, 0.0]]), torch.ones(1, 3)
    loss, metrics = value_loss(vpreds, returns, values, mask, cliprange_value=0.5,
                               loss_agg_mode="token-mean", scale=LossScale.of(mask))
    assert loss.item() == pytest.approx(0.5 * 3.29 / 3)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    assert metrics["critic/vpred_mean"] == pytest.approx(2.2 / 3)
    loss.backward()
    # d/dv: token 0 is clipped (its loss does not move with v): 0; token 1: 0.5*2*(1-0)/3; token 2: 0.5*2*0.2/3
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 1 / 3, 0.2 / 3]]))


def test_value_loss_ignores_padding():
    vpreds = torch.tensor([[1.0, 100.0]])
    loss, metrics = value_loss(vpreds, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]),
                               cliprange_value=10.0, loss_agg_mode="token-mean",
                               scale=LossScale.of(torch.tensor([[1.0, 0.0]])))
    assert loss.item() == 0.5 and metrics["critic/vpred_mean"] == 1.0


def test_explained_variance_by_hand():
    # R = [1, 2, 3] (var 1), V = [1, 2, 2]: R - V = [0, 0, 1] (mean 1/3, var ((1/9)*2 + 4/9) / 2 = 1/3)
    # ev = 1 - (1/3) / (1 + 1e-5)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    ev = explained_variance(torch.tensor([[1.0, 2.0, 3.0, 50.0]]), torch.tensor([[1.0, 2.0, 2.0, -9.0]]), mask)
    assert ev == pytest.approx(1 - (1 / 3) / (1 + 1e-5))
    assert explained_variance(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]]), torch.ones(1, 2)) \
        == pytest.approx(1.0)


# Micro-batch invariance: shares of the mini-batch sum to the mini-batch loss and gradient.
@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
@pytest.mark.parametrize("sizes", [[1] * 6, [2] * 3, [3] * 2, [1, 2, 3]])
def test_value_loss_gradient_does_not_depend_on_the_micro_batch_size(mode, sizes):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])  # includes an all-padding row
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()  # [6, 5]
    x = torch.randn(6, 5, generator=gen)
    returns, values = torch.randn(6, 5, generator=gen), torch.randn(6, 5, generator=gen)
    w = torch.randn(5, generator=gen, requires_grad=True)
    scale = LossScale.of(mask)

    def loss_of(rows):
        vpreds = torch.tanh(x[rows] * w) * 2  # [n, 5], nonlinear in w; some tokens clip
        return value_loss(vpreds, returns[rows], values[rows], mask[rows], cliprange_value=0.5,
                          loss_agg_mode=mode, scale=scale)

    full, full_metrics = loss_of(slice(None))
    (full_grad,) = torch.autograd.grad(full, w)
    total, clipfrac, start = 0.0, 0.0, 0
    for size in sizes:
        micro, metrics = loss_of(slice(start, start + size))
        micro.backward()  # accumulates into w.grad, as gradient accumulation does
        total, clipfrac, start = total + micro.item(), clipfrac + metrics["critic/vf_clipfrac"], start + size
    assert total == pytest.approx(full.item(), abs=1e-6)
    assert clipfrac == pytest.approx(full_metrics["critic/vf_clipfrac"], abs=1e-6)
    assert 0 < full_metrics["critic/vf_clipfrac"] < 1  # the clip binds on some tokens, not all
    torch.testing.assert_close(w.grad, full_grad, atol=1e-6, rtol=0)
