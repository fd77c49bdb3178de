"""KL estimators against hand-derived numbers."""

import math

import pytest
import torch

from thinkrl.algos.kl import get_kl_estimator

# logprob - ref_logprob = [-1 - (-2), -2 - (-0.5)] = [1, -1.5]
LOGPROB = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-2.0, -0.5]])


@pytest.mark.parametrize(
    "names, expected",
    [
        # k1 = lp - ref = [1, -1.5]
        (("kl", "k1"), [1.0, -1.5]),
        # |lp - ref| = [1, 1.5]
        (("abs",), [1.0, 1.5]),
        # 0.5 * [1^2, 1.5^2] = [0.5, 1.125]
        (("mse", "k2"), [0.5, 1.125]),
        # d = ref - lp = [-1, 1.5]; exp(-1) + 1 - 1 = 0.367879; exp(1.5) - 1.5 - 1 = 4.481689 - 2.5 = 1.981689
        (("low_var_kl", "k3"), [0.367879, 1.981689]),
    ],
)
def test_estimators_and_aliases(names, expected):
    for name in names:
        out = get_kl_estimator(name)(LOGPROB, REF)
        assert out.shape == (1, 2)
        assert torch.allclose(out, torch.tensor([expected]), atol=1e-5), name


def test_aliases_resolve_to_same_function():
    assert get_kl_estimator("kl") is get_kl_estimator("k1")
    assert get_kl_estimator("mse") is get_kl_estimator("k2")
    assert get_kl_estimator("low_var_kl") is get_kl_estimator("k3")


def test_low_var_kl_unclamped_values():
    k3 = get_kl_estimator("low_var_kl")
    # d = 0 -> e^0 - 0 - 1 = 0 ;  d = 2.5 -> e^2.5 - 3.5 = 12.182494 - 3.5 = 8.682494 (< 10, not clamped)
    out = k3(torch.tensor([0.0, -2.5]), torch.tensor([0.0, 0.0]))
    assert torch.allclose(out, torch.tensor([0.0, 8.682494]), atol=1e-5)


def test_low_var_kl_clamps():
    k3 = get_kl_estimator("low_var_kl")
    ref = torch.zeros(3)
    # d = ref - lp:
    #   d = 30   -> clamped to 20  -> e^20 - 20 - 1 = 4.85e8 - 21 > 10 -> 10
    #   d = -30  -> clamped to -20 -> e^-20 + 20 - 1 = 19.000000002 > 10 -> 10
    #   d = 1e4  -> clamped to 20 (exp(1e4) would be inf) -> 10
    logprob = torch.tensor([-30.0, 30.0, -1e4], requires_grad=True)
    out = k3(logprob, ref)
    assert torch.equal(out, torch.full((3,), 10.0))
    assert math.exp(20) - 21 > 10 and math.exp(-20) + 19 > 10
    # Saturated clamps pass no gradient, and never a NaN.
    out.sum().backward()
    assert torch.equal(logprob.grad, torch.zeros(3))


def test_unknown_estimator_lists_known():
    with pytest.raises(ValueError, match="low_var_kl"):
        get_kl_estimator("k4")
