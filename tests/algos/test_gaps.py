"""Every advantage estimator on multi-turn responses: a tool turn is a gap of
mask 0 inside the response. The gap is not an action: its advantage is 0, and
the advantages of the sampled tokens equal those of the same response with
the gap cut out. Hand-derived numbers pin GRPO, RLOO, REINFORCE++ and GAE;
the reward sits on the last sampled token, not at the mask's sum."""

from __future__ import annotations

import pytest
import torch

from thinkrl.algos.advantages import ADVANTAGE_ESTIMATORS, BoundEstimator
from thinkrl.algos.gae import gae_advantages_and_returns
from thinkrl.rewards.scoring import token_level_rewards

# Two prompts, two responses each. Row 0: turn [0, 1], tool turn [2, 3], turn [4];
# row 1: one turn of 2 tokens; row 2: turn [0], tool [1], turn [2, 3]; row 3: 3 tokens.
MASK = torch.tensor([[1, 1, 0, 0, 1],
                     [1, 1, 0, 0, 0],
                     [1, 0, 1, 1, 0],
                     [1, 1, 1, 0, 0]])
ATTENTION = torch.tensor([[1, 1, 1, 1, 1],
                          [1, 1, 0, 0, 0],
                          [1, 1, 1, 1, 0],
                          [1, 1, 1, 0, 0]])
GROUPS = torch.tensor([0, 0, 1, 1])
SCORES = torch.tensor([1.0, 0.0, 0.5, 1.5])
KEYWORDS = {"reinforce_plus_plus": {"gamma": 0.5}, "gae": {"gamma": 0.5, "lam": 0.5},
            "grpo": {"norm_adv_by_std_in_grpo": True}, "grpo_passk": {"norm_adv_by_std_in_grpo": True}}


def compact(t: torch.Tensor) -> torch.Tensor:
    """Each row's sampled tokens moved to the front (the gap cut out), right-padded with 0."""
    out = torch.zeros_like(t)
    for row in range(t.shape[0]):
        kept = t[row][MASK[row].bool()]
        out[row, :len(kept)] = kept
    return out


def test_the_reward_sits_on_the_last_sampled_token():
    rewards = token_level_rewards(SCORES, MASK)
    assert rewards.nonzero().tolist() == [[0, 4], [2, 3], [3, 2]]  # row 1's score is 0
    assert rewards[0, 4] == 1.0 and rewards[2, 3] == 0.5
    # The mask's sum (3 for row 0) would put it on the tool turn.
    assert rewards[0, 2] == 0.0


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_ignores_the_gap(name):
    rewards = token_level_rewards(SCORES, MASK)
    inputs = {}
    if name == "remax":
        inputs["reward_baselines"] = torch.tensor([0.25, 0.25, 1.0, 1.0])
    values = torch.tensor([[0.1, 0.2, 9.0, 9.0, 0.3], [0.4, 0.5, 0, 0, 0],
                           [0.6, 9.0, 0.7, 0.8, 0], [0.9, 1.0, 1.1, 0, 0]])
    if name == "gae":
        inputs["values"] = values
    estimator = BoundEstimator(ADVANTAGE_ESTIMATORS[name], KEYWORDS.get(name, {}))
    gapped = estimator(rewards, MASK, GROUPS, **inputs).advantages
    if name == "gae":
        inputs["values"] = compact(values * MASK)
    cut = estimator(compact(rewards), compact(MASK), GROUPS, **inputs).advantages
    assert (gapped[MASK == 0] == 0).all(), name
    torch.testing.assert_close(compact(gapped), cut, msg=name)


def test_grpo_and_rloo_by_hand():
    rewards = token_level_rewards(SCORES, MASK)
    # GRPO: group 0 scores [1, 0]: mean 0.5, std (unbiased) 0.7071 -> +-0.7071; group 1 [0.5, 1.5] the same.
    grpo = BoundEstimator(ADVANTAGE_ESTIMATORS["grpo"], KEYWORDS["grpo"])(rewards, MASK, GROUPS).advantages
    a = 0.5 / (2 ** 0.5 / 2 + 1e-6)
    torch.testing.assert_close(grpo, torch.tensor([[a, a, 0, 0, a], [-a, -a, 0, 0, 0],
                                                   [-a, 0, -a, -a, 0], [a, a, a, 0, 0]]))
    # RLOO: each against the other: 1 - 0, 0 - 1, 0.5 - 1.5, 1.5 - 0.5.
    rloo = BoundEstimator(ADVANTAGE_ESTIMATORS["rloo"], {})(rewards, MASK, GROUPS).advantages
    torch.testing.assert_close(rloo, torch.tensor([[1.0, 1, 0, 0, 1], [-1, -1, 0, 0, 0],
                                                   [-1, 0, -1, -1, 0], [1, 1, 1, 0, 0]]))


def test_gae_by_hand_carries_value_and_advantage_across_the_gap():
    # One response: tokens at 0 and 3 (1, 2 are a tool turn); reward 1 on token 3; gamma 1, lam 1.
    # t=3: delta = 1 + 0 - V3 = 1 - 0.5 = 0.5, A3 = 0.5.
    # t=0: delta = 0 + V3 - V0 = 0.5 - 0.25 = 0.25 (V3, not the gap's values 7), A0 = 0.25 + A3 = 0.75.
    rewards = torch.tensor([[0.0, 0, 0, 1]])
    values = torch.tensor([[0.25, 7.0, 7.0, 0.5]])
    mask = torch.tensor([[1, 0, 0, 1]])
    adv, returns = gae_advantages_and_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert returns[0, 0].item() == pytest.approx(1.0) and returns[0, 3].item() == pytest.approx(1.0)
    # Whitened over the two tokens: [0.75, 0.5] -> mean 0.625, unbiased std 0.1768.
    std = (2 * 0.125 ** 2) ** 0.5
    torch.testing.assert_close(adv, torch.tensor([[0.125 / std, 0, 0, -0.125 / std]]), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode", sorted(__import__("thinkrl.algos.policy_losses", fromlist=["x"]).POLICY_LOSSES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum-norm"])
def test_no_gradient_and_no_loss_come_from_tool_tokens(mode, agg):
    from thinkrl.algos.kl import get_kl_estimator
    from thinkrl.algos.losses import LossScale, agg_loss
    from thinkrl.algos.policy_losses import build_policy_loss
    from thinkrl.config.schema import ActorConfig

    cfg = ActorConfig(loss_agg_mode=agg)
    cfg.policy_loss.loss_mode = mode
    cfg.policy_loss.clip_cov_ratio = cfg.policy_loss.kl_cov_ratio = 0.5  # the covariance picks do act here
    loss_fn = build_policy_loss(cfg)
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(MASK.shape, generator=generator)
    adv = torch.randn(MASK.shape, generator=generator)
    ref = -torch.rand(MASK.shape, generator=generator)
    scale = LossScale.of(MASK)

    def loss_of(logprob, old, adv, ref):
        torch.manual_seed(0)  # clip_cov draws its random tokens
        loss, _ = loss_fn(logprob, old, adv, MASK.float(), scale=scale)
        kl = agg_loss(get_kl_estimator("low_var_kl")(logprob, ref), MASK.float(), agg, scale)
        return loss + 0.1 * kl

    logprob = (old + 0.1 * torch.randn(MASK.shape, generator=generator)).requires_grad_()
    loss = loss_of(logprob, old, adv, ref)
    loss.backward()
    assert (logprob.grad[MASK == 0] == 0).all() and logprob.grad[MASK == 1].abs().sum() > 0
    # Whatever sits at the tool tokens, the loss is the same.
    gap = MASK == 0
    noise = torch.randn(MASK.shape, generator=generator) * 5 * gap
    same = loss_of(logprob.detach() + noise, old - noise, adv + noise, ref + noise)
    torch.testing.assert_close(same, loss.detach())
