"""The engine-vs-trainer gap metrics and truncated importance sampling, on
numbers worked by hand."""

import math

import pytest
import torch

from thinkrl.algos.rollout_correction import logprob_gap_metrics, rollout_is_weights

LN2 = math.log(2.0)


def close(actual, expected):
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_gap_metrics_over_response_tokens_only():
    rollout = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -3.0, -3.0]])
    trainer = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, -2.0, -3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    m = logprob_gap_metrics(rollout, trainer, mask)
    # |diffs| on the 5 response tokens: 0.5, 0, 0, 1.0, 0 (the masked 9.0 is ignored)
    assert m["rollout/logprob_diff_mean"] == pytest.approx(1.5 / 5)
    assert m["rollout/logprob_diff_max"] == pytest.approx(1.0)
    p = torch.tensor([-1.0, -2.0, -0.5, -3.0, -3.0]).double().exp()
    q = torch.tensor([-1.5, -2.0, -0.5, -2.0, -3.0]).double().exp()
    expected = torch.corrcoef(torch.stack([p, q]))[0, 1].item()
    assert m["rollout/probs_corr"] == pytest.approx(expected, abs=1e-12)
    same = logprob_gap_metrics(rollout, rollout, mask)
    assert same["rollout/logprob_diff_max"] == 0.0 and same["rollout/probs_corr"] == pytest.approx(1.0)
    # verl's names, on probabilities: |e^-1 - e^-1.5|, 0, 0, |e^-3 - e^-2|, 0
    gaps = [math.exp(-1) - math.exp(-1.5), 0.0, 0.0, math.exp(-2) - math.exp(-3), 0.0]
    mean = sum(gaps) / 5
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(mean, abs=1e-12)
    assert m["training/rollout_probs_diff_max"] == pytest.approx(max(gaps), abs=1e-12)
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / 4)  # unbiased, as torch.std
    assert m["training/rollout_probs_diff_std"] == pytest.approx(std, abs=1e-12)
    assert m["training/rollout_actor_probs_pearson_corr"] == m["rollout/probs_corr"]
    assert m["training/rollout_probs_diff_valid"] == 1
    one = logprob_gap_metrics(rollout, trainer, torch.tensor([[1, 0, 0], [0, 0, 0]]))
    assert one["training/rollout_probs_diff_std"] == 0.0  # one token: no spread, not NaN


def test_token_level_truncated_weights():
    # log-ratios trainer - rollout: ln 3, 0, -ln 2 | ln 1.5, (masked)
    trainer3 = torch.tensor([[math.log(3.0), 0.0, -LN2], [math.log(1.5), 5.0, 0.0]])
    rollout3 = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w, m = rollout_is_weights(trainer3, rollout3, mask, threshold=2.0)
    close(w, [[2.0, 1.0, 0.5], [1.5, 0.0, 0.0]])
    assert m["rollout_is/max"] == pytest.approx(3.0) and m["rollout_is/min"] == pytest.approx(0.5)
    assert m["rollout_is/mean"] == pytest.approx((3.0 + 1.0 + 0.5 + 1.5) / 4)
    assert m["rollout_is/clip_frac"] == pytest.approx(1 / 4)


def test_mask_mode_drops_tokens_over_the_threshold():
    trainer = torch.tensor([[math.log(3.0), 0.0, -LN2]])
    w, _ = rollout_is_weights(trainer, torch.zeros(1, 3), torch.ones(1, 3), threshold=2.0,
                              mode="mask")
    close(w, [[0.0, 1.0, 0.5]])


def test_sequence_level_weight_is_the_product_over_the_response():
    # row 0: ratios 1.5 * 1.2 = 1.8 (under 2); row 1: 2 * 1.5 = 3 -> truncated to 2
    trainer = torch.log(torch.tensor([[1.5, 1.2, 7.0], [2.0, 1.5, 1.0]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    w, m = rollout_is_weights(trainer, torch.zeros(2, 3), mask, threshold=2.0, level="sequence")
    close(w, [[1.8, 1.8, 0.0], [2.0, 2.0, 2.0]])
    assert m["rollout_is/clip_frac"] == pytest.approx(3 / 5)  # row 1's three tokens


def test_weights_carry_no_gradient():
    trainer = torch.zeros(1, 2, requires_grad=True)
    w, _ = rollout_is_weights(trainer, torch.zeros(1, 2), torch.ones(1, 2), threshold=2.0)
    assert not w.requires_grad
