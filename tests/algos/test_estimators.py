"""The advantage estimators beyond GRPO, on numbers derived by hand, and their registry."""

import math

import pytest
import torch

from thinkrl.algos.advantages import (build_advantage_estimator, discounted_returns, gpg_outcome_advantage,
                                      grpo_outcome_advantage, grpo_passk_outcome_advantage, masked_whiten,
                                      opo_outcome_advantage, reinforce_plus_plus_advantage,
                                      reinforce_plus_plus_baseline_advantage, remax_outcome_advantage,
                                      rloo_outcome_advantage)
from thinkrl.config.schema import AlgorithmConfig

# Two groups: prompt 0 scored [1, 0, 0], prompt 1 scored [3, 1]; one token per response.
SCORES = [1.0, 0.0, 0.0, 3.0, 1.0]
GROUPS = torch.tensor([0, 0, 0, 1, 1])


def _one_token(scores):
    return torch.tensor(scores).unsqueeze(-1), torch.ones(len(scores), 1)


def _flat(adv):
    return adv.squeeze(-1).tolist()


def test_rloo_leaves_each_response_out_of_its_baseline():
    # prompt 0: 1 - (0+0)/2 = 1;  0 - (1+0)/2 = -0.5 (twice).  prompt 1: 3 - 1 = 2;  1 - 3 = -2.
    # A group of one keeps its score (id 7: 5).
    rewards, mask = _one_token(SCORES + [5.0])
    adv = rloo_outcome_advantage(rewards, mask, torch.tensor([0, 0, 0, 1, 1, 7]))
    assert _flat(adv) == pytest.approx([1.0, -0.5, -0.5, 2.0, -2.0, 5.0])


def test_opo_baseline_is_the_length_weighted_group_mean():
    # prompt 0: lengths [2, 1, 3] -> b = (2*1 + 1*0 + 3*0) / 6 = 1/3; A = [2/3, -1/3, -1/3] on real tokens.
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    adv = opo_outcome_advantage(rewards, mask, torch.tensor([4, 4, 4]))
    t = 1 / 3
    expected = torch.tensor([[2 * t, 2 * t, 0.0], [-t, 0.0, 0.0], [-t, -t, -t]])
    torch.testing.assert_close(adv, expected)


def test_gpg_scales_group_centred_scores_by_the_nonzero_share():
    # 5 responses, 3 with a non-zero score: alpha = 5/3.
    # prompt 0 mean 1/3: 5/3 * [2/3, -1/3, -1/3] = [10/9, -5/9, -5/9]; prompt 1 mean 2: 5/3 * [1, -1].
    rewards, mask = _one_token(SCORES)
    adv = gpg_outcome_advantage(rewards, mask, GROUPS)
    assert _flat(adv) == pytest.approx([10 / 9, -5 / 9, -5 / 9, 5 / 3, -5 / 3])


def test_grpo_passk_rewards_only_the_best_response():
    # prompt 0: lead 1 - 0 = 1, unbiased std of [1, 0, 0] = sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3);
    # prompt 1: lead 3 - 1 = 2, std = sqrt(2). Everyone else 0.
    rewards, mask = _one_token(SCORES)
    adv = grpo_passk_outcome_advantage(rewards, mask, GROUPS, norm_adv_by_std_in_grpo=True)
    assert _flat(adv) == pytest.approx([1 / (math.sqrt(1 / 3) + 1e-6), 0, 0, 2 / (math.sqrt(2) + 1e-6), 0])
    raw = grpo_passk_outcome_advantage(rewards, mask, GROUPS, norm_adv_by_std_in_grpo=False)
    assert _flat(raw) == pytest.approx([1.0, 0, 0, 2.0, 0])


def test_grpo_passk_needs_two_responses_per_prompt():
    rewards, mask = _one_token([1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="rollout.n>=2"):
        grpo_passk_outcome_advantage(rewards, mask, torch.tensor([0, 0, 1]), norm_adv_by_std_in_grpo=True)


def test_reinforce_plus_plus_baseline_centres_per_group_then_whitens_the_batch():
    # centred: [2/3, -1/3, -1/3, 1, -1]; batch mean 0; unbiased var = (6/9 + 2) / 4 = 2/3.
    rewards, mask = _one_token(SCORES)
    adv = reinforce_plus_plus_baseline_advantage(rewards, mask, GROUPS)
    std = math.sqrt(2 / 3 + 1e-8)
    assert _flat(adv) == pytest.approx([v / std for v in (2 / 3, -1 / 3, -1 / 3, 1.0, -1.0)], rel=1e-5)


def test_reinforce_plus_plus_baseline_weighs_responses_by_tokens():
    # scores [1, 0], lengths [2, 1]: centred tokens [0.5, 0.5, -0.5], mean 1/6,
    # deviations [1/3, 1/3, -2/3], unbiased var = (6/9) / 2 = 1/3.
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = reinforce_plus_plus_baseline_advantage(rewards, mask, torch.tensor([0, 0]))
    s = math.sqrt(1 / 3)
    torch.testing.assert_close(adv, torch.tensor([[1 / 3 / s, 1 / 3 / s], [-2 / 3 / s, 0.0]]))


def test_reinforce_plus_plus_discounts_then_whitens():
    # gamma 0.5. row 0 rewards [0, 0, 1] -> returns [0.25, 0.5, 1];
    # row 1 rewards [0, 1 | pad] -> returns [0.5, 1 | masked].
    # masked mean 3.25/5 = 0.65; deviations [-0.4, -0.15, 0.35, -0.15, 0.35];
    # unbiased var = 0.45 / 4 = 0.1125.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = reinforce_plus_plus_advantage(rewards, mask, torch.tensor([0, 0]), gamma=0.5)
    s = math.sqrt(0.1125 + 1e-8)
    expected = torch.tensor([[-0.4 / s, -0.15 / s, 0.35 / s], [-0.15 / s, 0.35 / s, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_reinforce_plus_plus_return_does_not_leak_across_padding():
    # A (malformed) reward on a padding token must not flow back into the response.
    rewards = torch.tensor([[1.0, 0.0, 7.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 0]])
    adv = reinforce_plus_plus_advantage(rewards, mask, torch.tensor([0, 1]), gamma=1.0)
    clean = reinforce_plus_plus_advantage(rewards * mask, mask, torch.tensor([0, 1]), gamma=1.0)
    torch.testing.assert_close(adv, clean)


def test_the_return_carries_across_a_gap_inside_the_response():
    # gamma 0.5, mask [1, 1, gap, 1, pad]; the gap's reward 5 and the padding's 2 are not counted.
    # t=3: 4; the gap carries 4 on undiscounted; t=1: 0 + 0.5 * 4 = 2; t=0: 1 + 0.5 * 2 = 2.
    # (Resetting at every masked position, as verl did before #7278, gives [1, 0, -, 4, -].)
    rewards = torch.tensor([[1.0, 0.0, 5.0, 4.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 1, 0]])
    returns = discounted_returns(rewards, mask, gamma=0.5)
    assert returns.tolist() == [[2.0, 2.0, 0.0, 4.0, 0.0]]
    # An outcome reward reaches the first turn whole with gamma 1 (verl's #7278 case).
    outcome = discounted_returns(torch.tensor([[0.0, 0, 0, 0, 0, 1]]),
                                 torch.tensor([[1, 1, 0, 0, 1, 1]]), gamma=1.0)
    assert outcome.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]]


def test_remax_subtracts_the_greedy_baseline_from_the_return_to_go():
    # row 0: reward 1 on its last token (3 tokens), greedy baseline 0.25 -> 0.75 on each token.
    # row 1: reward 0, baseline 1 -> -1 on its 2 tokens, 0 on padding.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = remax_outcome_advantage(rewards, mask, torch.tensor([0, 1]), reward_baselines=torch.tensor([0.25, 1.0]))
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.75], [-1.0, -1.0, 0.0]]))


def test_masked_whiten_needs_two_tokens():
    with pytest.raises(ValueError, match="at least 2"):
        masked_whiten(torch.ones(1, 2), torch.tensor([[1, 0]]))


def test_build_binds_each_estimators_own_settings():
    rewards, mask = _one_token(SCORES)
    dr_grpo = build_advantage_estimator(AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    result = dr_grpo(rewards, mask, GROUPS)
    torch.testing.assert_close(result.advantages,
                               grpo_outcome_advantage(rewards, mask, GROUPS, norm_adv_by_std_in_grpo=False))
    assert result.returns is None  # only an estimator with a critic has returns
    rpp = build_advantage_estimator(AlgorithmConfig(adv_estimator="reinforce_plus_plus", gamma=0.5))
    assert rpp.keywords == {"gamma": 0.5}
    # An estimator without settings gets no GRPO keyword.
    assert build_advantage_estimator(AlgorithmConfig(adv_estimator="rloo")).keywords == {}
