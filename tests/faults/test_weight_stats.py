"""The divergence guard's weight statistics, by hand: the sum of squares over
every parameter without a float64 copy, values whose squares overflow
float32 still counted, NaN and inf named."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from thinkrl.parallel.fsdp import parameter_stats


def _module(**tensors: torch.Tensor) -> nn.Module:
    module = nn.Module()
    for name, value in tensors.items():
        module.register_parameter(name, nn.Parameter(value, requires_grad=False))
    return module


def test_the_sum_of_squares_of_every_parameter():
    # 3^2 + 4^2 + 12^2 = 169; bfloat16 1.5^2 + 2^2 = 6.25
    stats = parameter_stats(_module(w=torch.tensor([[3.0, 4.0]]), b=torch.tensor([12.0]),
                                    h=torch.tensor([1.5, -2.0], dtype=torch.bfloat16)))
    assert stats == {"nonfinite": [], "square_sum": pytest.approx(175.25, rel=1e-7)}


def test_finite_values_whose_squares_overflow_float32_are_counted_not_named():
    stats = parameter_stats(_module(big=torch.tensor([1e20, -1e20]), small=torch.tensor([2.0])))
    assert stats["nonfinite"] == []
    assert stats["square_sum"] == pytest.approx(2e40 + 4, rel=1e-6)


def test_nan_and_inf_are_named_and_the_norm_is_not_finite():
    stats = parameter_stats(_module(ok=torch.ones(3), bad=torch.tensor([1.0, math.nan]),
                                    worse=torch.tensor([math.inf])))
    assert stats["nonfinite"] == ["bad", "worse"]
    assert not math.isfinite(stats["square_sum"])


def test_a_large_tensor_s_sum_stays_accurate_without_float64():
    """2^24 + 1000 elements of 0.01: one float32 norm over them is 2% off
    (its running sum swamps each 1e-4 square); rows of float32 norms added
    up in float64 stay within 1e-5."""
    x = torch.full(((1 << 24) + 1000,), 0.01)
    exact = x.numel() * float(x[0].double()) ** 2
    assert parameter_stats(_module(x=x))["square_sum"] == pytest.approx(exact, rel=1e-5)
    assert parameter_stats(_module(x=x.bfloat16()))["square_sum"] == pytest.approx(
        x.numel() * float(x[0].bfloat16().double()) ** 2, rel=1e-5)
