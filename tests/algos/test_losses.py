"""Loss aggregation and PPO clip loss against hand-derived numbers."""

import math

import pytest
import torch

from thinkrl.algos.losses import LOSS_AGG_MODES, LossScale, agg_loss, check_loss_agg_mode, ppo_clip_policy_loss

# Masked entries: row 0 -> 1 + 2 = 3 over 2 tokens, row 1 -> 4 over 1 token.
# total 7, num_tokens 3, num_seqs 2, response_length T = 3.
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_loss_scale_of():
    scale = LossScale.of(MASK)
    assert (scale.num_tokens, scale.num_seqs, scale.response_length) == (3.0, 2.0, 3)
    # An all-padding row is not a sequence: 2 tokens, 1 sequence.
    scale = LossScale.of(torch.tensor([[1, 1, 0], [0, 0, 0]]), response_length=8)
    assert (scale.num_tokens, scale.num_seqs, scale.response_length) == (2.0, 1.0, 8)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens = 2.33333
        ("seq-mean-token-sum", 7 / 2),  # (3 + 4) / 2 seqs = 3.5
        ("seq-mean-token-mean", 2.75),  # (3/2 + 4/1) / 2 seqs = (1.5 + 4) / 2 = 2.75
        ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (2 seqs * 3 tokens) = 1.16667
    ],
)
def test_agg_modes_by_hand(mode, expected):
    out = agg_loss(LOSS, MASK, mode, LossScale.of(MASK))
    assert out.item() == pytest.approx(expected, rel=1e-6)


def test_dr_grpo_uses_given_response_length():
    # 7 / (2 seqs * 4) = 0.875
    out = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", LossScale.of(MASK, response_length=4))
    assert out.item() == pytest.approx(0.875)


def test_unknown_mode_raises():
    with pytest.raises(ValueError, match="token-mean"):
        check_loss_agg_mode("seq-mean")
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(LOSS, MASK, "mean", LossScale.of(MASK))


# ---- PPO clip: one token at a time, clip_ratio_low 0.2, clip_ratio_high 0.28, clip_ratio_c 3.
CLIP = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)


def _one_token_loss(adv: float, log_ratio: float) -> float:
    mask = torch.ones(1, 1)
    loss, _ = ppo_clip_policy_loss(
        torch.tensor([[log_ratio]]), torch.zeros(1, 1), torch.tensor([[adv]]), mask,
        **CLIP, loss_agg_mode="token-mean", scale=LossScale.of(mask),
    )
    return loss.item()


@pytest.mark.parametrize(
    "adv, log_ratio, expected",
    [
        # A=1, rho=1.1 inside [0.8, 1.28]: -A rho = -1.1
        (1.0, math.log(1.1), -1.1),
        # A=1, rho=1.5 > 1.28: max(-1.5, -1.28) = -1.28 = -A (1 + high)
        (1.0, math.log(1.5), -1.28),
        # A=-1, rho=0.5 < 0.8: max(0.5, 0.8) = 0.8 = -A (1 - low); dual bound 3 not reached
        (-1.0, math.log(0.5), 0.8),
        # A=-1, rho=e^2=7.389: max(7.389, 1.28) = 7.389 > -A c = 3 -> 3
        (-1.0, 2.0, 3.0),
        # A=-2, log-ratio 50 clamped to 20, rho=e^20: max = 2 e^20 > 6 -> -A c = 6
        (-2.0, 50.0, 6.0),
        # A=1, rho=0.5 below 1-low: clipping only binds on the pessimistic side, -A rho = -0.5
        (1.0, math.log(0.5), -0.5),
    ],
)
def test_ppo_clip_single_tokens(adv, log_ratio, expected):
    assert _one_token_loss(adv, log_ratio) == pytest.approx(expected, rel=1e-5)


def test_ppo_clip_batch_metrics_and_grad():
    # row 0: a) A=1, rho=1.5 (clipped, -1.28)  b) A=-1, rho=0.5 (clipped, 0.8)  c) A=-1, rho=e^2 (dual, 3)
    # row 1: d) A=2, rho=1 (-2), then two padding tokens with log-ratio 5 that must not count.
    log_ratio = torch.tensor([[math.log(1.5), math.log(0.5), 2.0], [0.0, 5.0, 5.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0], [2.0, 1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    logprob = log_ratio.clone().requires_grad_()
    loss, metrics = ppo_clip_policy_loss(
        logprob, torch.zeros(2, 3), adv, mask, **CLIP, loss_agg_mode="token-mean", scale=LossScale.of(mask)
    )
    # token-mean: (-1.28 + 0.8 + 3 - 2) / 4 = 0.52 / 4 = 0.13
    assert loss.item() == pytest.approx(0.13, rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(0.13, rel=1e-5)
    # clipfrac: a and b, 2 / 4 = 0.5 ; clipfrac_lower: c, 1 / 4 = 0.25
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)
    # ppo_kl: -(ln 1.5 + ln 0.5 + 2 + 0) / 4 = -(0.405465 - 0.693147 + 2) / 4 = -0.428079
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.428079, rel=1e-5)
    # Gradient: clipped tokens and padding get 0; d gets d(-A rho)/d logprob / 4 = -2 * 1 / 4 = -0.5
    loss.backward()
    assert torch.allclose(logprob.grad, torch.tensor([[0.0, 0.0, 0.0], [-0.5, 0.0, 0.0]]))


@pytest.mark.parametrize("c", [1.0, 0.5])
def test_clip_ratio_c_must_exceed_one(c):
    mask = torch.ones(1, 1)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_policy_loss(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), mask,
            clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=c,
            loss_agg_mode="token-mean", scale=LossScale.of(mask),
        )


# ---- Micro-batch invariance: shares of the mini-batch sum to the mini-batch value.
SPLITS = [[1] * 6, [2] * 3, [3] * 2, [1, 2, 3]]


def _random_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    T = 5
    lengths = torch.tensor([5, 1, 3, 0, 4, 2])  # includes an all-padding row
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()  # [6, T]
    x = torch.randn(6, T, generator=gen)
    return x, mask


def _slices(sizes):
    start = 0
    for size in sizes:
        yield slice(start, start + size)
        start += size


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
@pytest.mark.parametrize("sizes", SPLITS)
def test_micro_batch_loss_and_grad_match_full_batch(mode, sizes):
    x, mask = _random_batch()
    scale = LossScale.of(mask)
    w = torch.randn(5, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def loss_mat(rows):
        return (x[rows] * w) ** 2 + torch.sin(x[rows] * w)  # [n, T], nonlinear in w

    full = agg_loss(loss_mat(slice(None)), mask, mode, scale)
    (full_grad,) = torch.autograd.grad(full, w)

    total = torch.zeros(())
    for rows in _slices(sizes):
        micro = agg_loss(loss_mat(rows), mask[rows], mode, scale)
        micro.backward()  # accumulates into w.grad, as gradient accumulation does
        total = total + micro.detach()
    assert torch.allclose(total, full.detach(), atol=1e-6)
    assert torch.allclose(w.grad, full_grad, atol=1e-6)


@pytest.mark.parametrize("mode", list(LOSS_AGG_MODES))
def test_micro_batch_ppo_metrics_sum_to_full_batch(mode):
    x, mask = _random_batch(seed=2)
    logprob = 0.3 * x
    old_logprob = torch.zeros_like(x)
    adv = torch.randn(6, 5, generator=torch.Generator().manual_seed(3))
    scale = LossScale.of(mask)
    kwargs = dict(**CLIP, loss_agg_mode=mode, scale=scale)
    _, full = ppo_clip_policy_loss(logprob, old_logprob, adv, mask, **kwargs)
    summed = dict.fromkeys(full, 0.0)
    for rows in _slices([1, 2, 3]):
        _, part = ppo_clip_policy_loss(logprob[rows], old_logprob[rows], adv[rows], mask[rows], **kwargs)
        for key, value in part.items():
            summed[key] += value
    for key in full:
        assert summed[key] == pytest.approx(full[key], abs=1e-6), key
