"""DAPO's overlong penalty and group filter on numbers derived by hand."""

import pytest
import torch

from thinkrl.algos.dapo import mixed_groups, overlong_penalty


def test_overlong_penalty_ramps_over_the_buffer():
    # limit 20, buffer 4, factor 1: free up to 16 tokens, then -(L - 16) / 4.
    lengths = torch.tensor([10, 16, 17, 18, 20])
    penalty = overlong_penalty(lengths, max_response_length=20, buffer_len=4, penalty_factor=1.0)
    assert penalty.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0])
    # factor 0.5 halves it: at the limit -0.5.
    half = overlong_penalty(torch.tensor([20]), max_response_length=20, buffer_len=4, penalty_factor=0.5)
    assert half.item() == pytest.approx(-0.5)


def test_mixed_groups_keeps_groups_that_disagree_and_singletons():
    # group 0 [1, 1] constant -> dropped; group 1 [0, 1] mixed -> kept; group 2 [0, 0] dropped;
    # group 3 has one response -> kept (verl keeps groups of one).
    values = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.3])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    assert mixed_groups(values, groups).tolist() == [False, False, True, True, False, False, True]


def test_mixed_groups_with_unordered_ids():
    values = torch.tensor([0.5, 0.2, 0.5, 0.5])
    groups = torch.tensor([9, 4, 9, 4])
    assert mixed_groups(values, groups).tolist() == [False, True, False, True]
