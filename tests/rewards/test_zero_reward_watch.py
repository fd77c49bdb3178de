"""The all-zero-rewards warning: after exactly N all-zero steps, once per streak."""

import logging

import pytest
import torch

from thinkrl.reward_watch import ZeroRewardWatch

ZERO, SOME = torch.zeros(8), torch.tensor([0.0, 1.0, 0.0, 0.0])


def test_warns_once_per_streak(caplog):
    watch = ZeroRewardWatch(3)
    with caplog.at_level(logging.WARNING, logger="thinkrl.reward_watch"):
        fired = [watch.update(s) for s in (ZERO, ZERO, SOME, ZERO, ZERO, ZERO, ZERO, ZERO, SOME,
                                           ZERO, ZERO, ZERO)]
    # streaks: 2 (broken by SOME), then 5 (warns at its 3rd step), then 3 (warns again)
    assert fired == [False, False, False, False, False, True, False, False, False, False, False, True]
    assert len(caplog.records) == 2
    message = caplog.records[0].getMessage()
    assert "3 steps in a row" in message
    for cause in ("template", "data_source", "ground_truth", "#### N", "\\boxed"):
        assert cause in message


def test_zero_never_warns_and_negative_is_rejected():
    watch = ZeroRewardWatch(0)
    assert not any(watch.update(ZERO) for _ in range(10))
    with pytest.raises(ValueError, match="reward.zero_reward_warn_steps=-1"):
        ZeroRewardWatch(-1)


def test_negative_rewards_are_not_zero():
    watch = ZeroRewardWatch(1)
    assert not watch.update(torch.tensor([-1.0, 0.0]))
    assert watch.update(torch.zeros(2))
    assert not watch.update(torch.zeros(0))  # an empty batch breaks nothing and warns of nothing
