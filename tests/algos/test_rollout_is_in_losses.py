"""Rollout importance weights (algorithm.rollout_is) are a per-token weight
inside each policy loss, as verl applies them: the per-token loss times w,
before aggregation; geo_mean weighs each sequence by the geometric mean of its
tokens' weights; clip_cov and kl_cov choose their tokens from the unweighted
statistics and weigh the penalty too. For the losses linear in A this equals
scaling the advantages (what thinkrl did before); for the others the numbers
below, derived by hand, tell the two apart."""

from __future__ import annotations

import math

import pytest
import torch

from thinkrl.algos.losses import LossScale, ppo_clip_policy_loss
from thinkrl.algos.policy_losses import (cispo_policy_loss, clip_cov_policy_loss, geo_mean_policy_loss,
                                         gpg_policy_loss, gspo_policy_loss, kl_cov_policy_loss,
                                         sapo_policy_loss)

CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}


def _scale(mask: torch.Tensor) -> LossScale:
    return LossScale.of(mask)


def test_ppo_clip_multiplies_each_tokens_clipped_loss():
    # A = [1, -1], r = [1.5, 0.5]: l1 = [-1.5, 0.5], l2 = [-1.2, 0.8], max = [-1.2, 0.8];
    # the dual clip (c = 3) leaves 0.8. Weights [2, 0.5]: [-2.4, 0.4], token mean -1.0.
    mask = torch.ones(1, 2)
    logprob, old = torch.log(torch.tensor([[1.5, 0.5]])), torch.zeros(1, 2)
    loss, _ = ppo_clip_policy_loss(logprob, old, torch.tensor([[1.0, -1.0]]), mask, clip_ratio_c=3.0,
                                   loss_agg_mode="token-mean", scale=_scale(mask), **CLIP,
                                   rollout_is_weights=torch.tensor([[2.0, 0.5]]))
    assert loss.item() == pytest.approx(-1.0, abs=1e-6)


def test_geo_mean_weighs_a_sequence_by_the_geometric_mean_of_its_weights():
    # ratio 1 everywhere (rho = 1), A = 1; weights [4, 1]: the sequence weight is
    # exp((log 4 + log 1) / 2) = 2, loss = -1 * 1 * 2 / 1 sequence = -2.
    # (Scaling the advantages would give mean(A w) = 2.5: loss -2.5.)
    mask, logprob = torch.ones(1, 2), torch.tensor([[-1.0, -2.0]])
    loss, _ = geo_mean_policy_loss(logprob, logprob.clone(), torch.ones(1, 2), mask, scale=_scale(mask),
                                   rollout_is_weights=torch.tensor([[4.0, 1.0]]), **CLIP)
    assert loss.item() == pytest.approx(-2.0, abs=1e-6)


def test_clip_cov_chooses_its_tokens_without_the_weights():
    # logp = old = [-1, -2, -3] (ratio 1, nothing clipped), A = [1, -1, 0]:
    # cov = (A - 0)(logp + 2) = [1, 0, 0]; only token 0 lies in (0.5, 5), so it is dropped.
    # Per-token loss -A r = [-1, 1, 0] kept [0, 1, 1] -> [0, 1, 0]; weights [0.1, 1, 1] -> [0, 1, 0],
    # token mean 1/3. (With A w = [0.1, -1, 0], token 0's cov would be 0.4: nothing dropped, 0.3.)
    mask, logprob = torch.ones(1, 3), torch.tensor([[-1.0, -2.0, -3.0]])
    loss, metrics = clip_cov_policy_loss(
        logprob, logprob.clone(), torch.tensor([[1.0, -1.0, 0.0]]), mask, scale=_scale(mask),
        loss_agg_mode="token-mean", clip_cov_ratio=0.2, clip_cov_lb=0.5, clip_cov_ub=5.0,
        rollout_is_weights=torch.tensor([[0.1, 1.0, 1.0]]), **CLIP)
    assert loss.item() == pytest.approx(1 / 3, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(1 / 3)


def test_kl_cov_weighs_the_penalty_and_chooses_without_the_weights():
    # logp = [-1, -2, -3], old = [-1.5, -2, -3]: log r = [0.5, 0, 0]; A = [1, -1, 0]:
    # cov = [1, 0, 0] -> token 0 penalised: -e^0.5 + 1 * 0.5; tokens 1, 2: 1, 0.
    # Weights [2, 1, 1]: [2 (0.5 - e^0.5), 1, 0], token mean (2 (0.5 - e^0.5) + 1) / 3.
    # (Scaling the advantages instead leaves the penalty unweighted: (0.5 - 2 e^0.5 + 1) / 3.)
    mask = torch.ones(1, 3)
    logprob, old = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.5, -2.0, -3.0]])
    loss, _ = kl_cov_policy_loss(logprob, old, torch.tensor([[1.0, -1.0, 0.0]]), mask, scale=_scale(mask),
                                 loss_agg_mode="token-mean", kl_cov_ratio=0.34, ppo_kl_coef=1.0,
                                 rollout_is_weights=torch.tensor([[2.0, 1.0, 1.0]]))
    expected = (2 * (0.5 - math.exp(0.5)) + 1.0 + 0.0) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)


LINEAR = {
    "gspo": (gspo_policy_loss, {**CLIP, "loss_agg_mode": "token-mean"}),
    "sapo": (sapo_policy_loss, {"tau_pos": 1.0, "tau_neg": 1.05}),
    "gpg": (gpg_policy_loss, {"loss_agg_mode": "seq-mean-token-mean"}),
    "cispo": (cispo_policy_loss, {**CLIP, "loss_agg_mode": "seq-mean-token-sum"}),
    "vanilla": (ppo_clip_policy_loss, {**CLIP, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean"}),
}


@pytest.mark.parametrize("name", sorted(LINEAR))
def test_for_losses_linear_in_a_the_weight_equals_scaling_the_advantages(name):
    fn, settings = LINEAR[name]
    g = torch.Generator().manual_seed(0)
    logprob = -torch.rand(3, 4, generator=g) - 0.5
    old = logprob + 0.3 * torch.randn(3, 4, generator=g)
    advantages = torch.randn(3, 1, generator=g).expand(3, 4).contiguous()
    weights = torch.rand(3, 4, generator=g) * 2
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    scale = _scale(mask)
    weighted, _ = fn(logprob, old, advantages, mask, scale=scale, rollout_is_weights=weights, **settings)
    scaled, _ = fn(logprob, old, advantages * weights, mask, scale=scale, **settings)
    unweighted, _ = fn(logprob, old, advantages, mask, scale=scale, **settings)
    assert weighted.item() == pytest.approx(scaled.item(), abs=1e-6)
    assert weighted.item() != pytest.approx(unweighted.item(), abs=1e-4)
