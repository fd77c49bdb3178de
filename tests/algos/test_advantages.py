"""GRPO advantages against hand-derived numbers."""

import math

import pytest
import torch

from thinkrl.algos.advantages import get_advantage_estimator, grpo_outcome_advantage

EPS = 1e-6


def _last_token_rewards(scores: list[float], T: int = 3) -> torch.Tensor:
    """[N, T] rewards with each score on the last token, as an outcome reward is placed."""
    rewards = torch.zeros(len(scores), T)
    rewards[:, -1] = torch.tensor(scores)
    return rewards


def test_two_groups_unbiased_std():
    # group 0: scores [1, 0]    mean 0.5, std = sqrt((0.25 + 0.25) / (2 - 1)) = sqrt(0.5) = 0.70711
    #          adv = [+0.5, -0.5] / 0.70711 = [+0.70711, -0.70711]
    # group 1: scores [1, 2, 3] mean 2,   std = sqrt((1 + 0 + 1) / (3 - 1)) = 1
    #          adv = [-1, 0, 1]
    rewards = _last_token_rewards([1.0, 0.0, 1.0, 2.0, 3.0])
    mask = torch.ones(5, 3)
    ids = torch.tensor([0, 0, 1, 1, 1])
    adv = grpo_outcome_advantage(rewards, mask, ids)
    expected = torch.tensor([0.70711, -0.70711, -1.0, 0.0, 1.0])
    assert adv.shape == (5, 3)
    assert torch.allclose(adv, expected[:, None].expand(5, 3), atol=1e-4)


def test_rewards_on_several_tokens_are_summed():
    # scores: 0.5 + 0.5 = 1 and 0 + 0 = 0 -> same as group 0 above: [+0.70711, -0.70711]
    rewards = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0]])
    adv = grpo_outcome_advantage(rewards, torch.ones(2, 3), torch.tensor([4, 4]))
    assert torch.allclose(adv[:, 0], torch.tensor([0.70711, -0.70711]), atol=1e-4)


def test_group_of_one_keeps_its_score():
    # singleton: mean := 0, std := 1  ->  adv = score / (1 + 1e-6)
    # id 9 alone with score -2 -> -2 / (1 + 1e-6) = -1.999998; group 5: [1, 3] mean 2,
    # std = sqrt((1 + 1) / 1) = 1.41421 -> adv = [-0.70711, +0.70711]
    rewards = _last_token_rewards([-2.0, 1.0, 3.0])
    adv = grpo_outcome_advantage(rewards, torch.ones(3, 3), torch.tensor([9, 5, 5]))
    assert adv[0, 0].item() == pytest.approx(-2.0 / (1 + EPS), rel=1e-6)
    assert torch.allclose(adv[1:, 0], torch.tensor([-0.70711, 0.70711]), atol=1e-4)


def test_constant_group_gives_zero():
    # scores [1, 1, 1]: every s_i - mean = 0, std = 0 -> 0 / (0 + eps) = 0 (no NaN)
    rewards = _last_token_rewards([1.0, 1.0, 1.0])
    adv = grpo_outcome_advantage(rewards, torch.ones(3, 3), torch.tensor([0, 0, 0]))
    assert torch.equal(adv, torch.zeros(3, 3))


def test_without_std_normalisation():
    # group [0, 4]: mean 2 -> adv = [-2, +2] (with std: sqrt((4 + 4) / 1) = 2.82843 -> +-0.70711)
    rewards = _last_token_rewards([0.0, 4.0])
    ids = torch.tensor([1, 1])
    adv = grpo_outcome_advantage(rewards, torch.ones(2, 3), ids, norm_adv_by_std_in_grpo=False)
    assert torch.allclose(adv[:, 0], torch.tensor([-2.0, 2.0]))
    adv_std = grpo_outcome_advantage(rewards, torch.ones(2, 3), ids)
    assert torch.allclose(adv_std[:, 0], torch.tensor([-0.70711, 0.70711]), atol=1e-4)


def test_non_contiguous_group_ids():
    # ids [7, 3, 7, 3, 3], scores [2, 1, 4, 5, 9]
    # group 7: [2, 4]    mean 3, std sqrt((1 + 1) / 1) = 1.41421 -> [-0.70711, +0.70711]
    # group 3: [1, 5, 9] mean 5, std sqrt((16 + 0 + 16) / 2) = 4 -> [-1, 0, +1]
    scores = [2.0, 1.0, 4.0, 5.0, 9.0]
    ids = torch.tensor([7, 3, 7, 3, 3])
    adv = grpo_outcome_advantage(_last_token_rewards(scores), torch.ones(5, 3), ids)
    expected = torch.tensor([-0.70711, -1.0, 0.70711, 0.0, 1.0])
    assert torch.allclose(adv[:, 0], expected, atol=1e-4)
    # Cross-check group 7 against torch.std (correction=1).
    g7 = torch.tensor([2.0, 4.0])
    assert adv[0, 0].item() == pytest.approx(((2.0 - g7.mean()) / (g7.std() + EPS)).item(), rel=1e-5)


def test_padding_tokens_are_zero():
    # scores [1, 0] -> +-0.70711 on real tokens only; mask rows have lengths 2 and 1
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = grpo_outcome_advantage(rewards, mask, torch.tensor([0, 0]))
    a = 1 / math.sqrt(2)
    expected = torch.tensor([[a, a, 0.0], [-a, 0.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-4)


def test_float32_without_grad():
    rewards = _last_token_rewards([1.0, 0.0]).double().requires_grad_()
    adv = grpo_outcome_advantage(rewards, torch.ones(2, 3), torch.tensor([0, 0]))
    assert adv.dtype == torch.float32
    assert not adv.requires_grad


def test_registry():
    assert get_advantage_estimator("grpo") is grpo_outcome_advantage
    with pytest.raises(ValueError, match="grpo"):
        get_advantage_estimator("ppo")
