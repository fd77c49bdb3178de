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
