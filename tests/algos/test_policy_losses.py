"""The policy losses beyond PPO's clip, on numbers derived by hand, and their registry."""

import math

import pytest
import torch

from thinkrl.algos.losses import LossScale, ppo_clip_policy_loss
from thinkrl.algos.policy_losses import (build_policy_loss, cispo_policy_loss,
                                         clip_cov_policy_loss, geo_mean_policy_loss, gpg_policy_loss,
                                         gspo_policy_loss, kl_cov_policy_loss, sapo_policy_loss)
from thinkrl.config.schema import ActorConfig, PolicyLossConfig

CLIP = dict(clip_ratio_low=0.2, clip_ratio_high=0.2)


def _leaf(values):
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def test_gspo_clips_the_sequence_ratio():
    # row 0: A=+1, log-ratios [0.2, 0.0] -> s = e^0.1 = 1.10517 inside [0.8, 1.2]: l = -1.10517 per token.
    # row 1: A=+1, log-ratios [0.5, 0.5] -> s = e^0.5 = 1.6487 > 1.2: l = -1.2 per token (both clipped).
    # seq-mean-token-mean: (-1.10517 + -1.2) / 2.
    # gspo used to fix seq-mean-token-mean itself; it now takes loss_agg_mode (as verl 0.9.1), so this
    # test names the mode. Both rows have 2 tokens, so token-mean would give the same numbers here;
    # test_gspo_honours_loss_agg_mode pins the modes apart on unequal lengths.
    old = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]])
    logprob = _leaf([[-0.8, -2.0], [-0.5, -0.5]])
    mask = torch.ones(2, 2)
    loss, metrics = gspo_policy_loss(logprob, old, torch.ones(2, 2), mask, scale=LossScale.of(mask), **CLIP,
                                     loss_agg_mode="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-math.exp(0.1) - 1.2) / 2, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.5)  # 2 of 4 tokens
    assert metrics["actor/ppo_kl"] == pytest.approx(-(0.2 + 0.5 + 0.5) / 4)
    loss.backward()
    # Each unclipped token's gradient is -A s / |y| / num_seqs = -1.10517 / 2 / 2; clipped tokens get none.
    g = -math.exp(0.1) / 4
    torch.testing.assert_close(logprob.grad, torch.tensor([[g, g], [0.0, 0.0]]))


# Two responses of unequal length for gspo's aggregation (T = 3, CLIP: trust region [0.8, 1.2]):
#   row 0: mask [1, 1, 1], A = +1, log pi - log pi_old = [0.3, 0.0, -0.3]
#          log s_0 = (0.3 + 0 - 0.3) / 3 = 0 -> s_0 = 1, inside: l = -A s_0 = -1 on each of 3 tokens.
#   row 1: mask [1, 0, 0], A = -2, log-ratios [0.1, 5, 5] (the padding's 5s must not count)
#          log s_1 = 0.1 / 1 -> s_1 = e^0.1 = 1.10517, inside: l = -A s_1 = 2 e^0.1 = 2.21034 on 1 token.
# Per-token gradient d l / d log pi_t = -A s_i (s_{i,t} has value s_i and d s_{i,t} / d log pi_t = s_i):
#   row 0: -1 on each token; row 1: 2 e^0.1 on token 0; padding 0. Nothing is clipped.
# token-mean:          (3 * -1 + 2 e^0.1) / 4 tokens = -0.19741;  gradients / 4.
# seq-mean-token-mean: (-3 / 3 + 2 e^0.1 / 1) / 2 seqs = 0.60517;  gradients / (|y_i| * 2).
GSPO_OLD = [[-1.3, -1.0, -0.7], [-1.1, -6.0, -6.0]]
GSPO_LOGPROB = [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
GSPO_ADV = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
GSPO_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
E01 = math.exp(0.1)


@pytest.mark.parametrize("mode, want_loss, want_grad", [
    ("token-mean", (-3 + 2 * E01) / 4, [[-1 / 4, -1 / 4, -1 / 4], [2 * E01 / 4, 0.0, 0.0]]),
    ("seq-mean-token-mean", (-1 + 2 * E01) / 2, [[-1 / 6, -1 / 6, -1 / 6], [2 * E01 / 2, 0.0, 0.0]]),
])
def test_gspo_honours_loss_agg_mode(mode, want_loss, want_grad):
    logprob = _leaf(GSPO_LOGPROB)
    loss, metrics = gspo_policy_loss(logprob, torch.tensor(GSPO_OLD), GSPO_ADV, GSPO_MASK,
                                     scale=LossScale.of(GSPO_MASK), **CLIP, loss_agg_mode=mode)
    assert loss.item() == pytest.approx(want_loss, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor(want_grad))
    # The metrics are token shares whatever the mode (verl's masked means): ppo_kl = -(0.3 + 0 - 0.3 + 0.1) / 4.
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.025, rel=1e-5)


def test_gspo_modes_differ_on_unequal_lengths_and_split_over_micro_batches():
    # token-mean -0.19741 vs seq-mean-token-mean 0.60517 (see above): the 3-token row weighs 3/4 of
    # the token mean but 1/2 of the sequence mean. Either way each row, given the whole batch's
    # LossScale, is its exact share: the two one-row micro-batch losses add up to the batch loss.
    scale = LossScale.of(GSPO_MASK)
    old, logprob = torch.tensor(GSPO_OLD), torch.tensor(GSPO_LOGPROB)
    losses = {}
    for mode in ("token-mean", "seq-mean-token-mean"):
        whole, _ = gspo_policy_loss(logprob, old, GSPO_ADV, GSPO_MASK, scale=scale, **CLIP, loss_agg_mode=mode)
        parts = [gspo_policy_loss(logprob[i:i + 1], old[i:i + 1], GSPO_ADV[i:i + 1], GSPO_MASK[i:i + 1],
                                  scale=scale, **CLIP, loss_agg_mode=mode)[0] for i in range(2)]
        assert (parts[0] + parts[1]).item() == pytest.approx(whole.item(), rel=1e-6)
        losses[mode] = whole.item()
    assert losses["token-mean"] == pytest.approx((-3 + 2 * E01) / 4, rel=1e-5)
    assert losses["seq-mean-token-mean"] == pytest.approx((-1 + 2 * E01) / 2, rel=1e-5)
    assert abs(losses["token-mean"] - losses["seq-mean-token-mean"]) > 0.5


def test_sapo_gate_by_hand():
    # A=+1, tau_pos=1, r=1: gate = sigmoid(0) * 4 = 2 -> l = -2; its gradient is -1 (plain PG at r=1).
    # A=-1, tau_neg=1.05, r=e^0.1: gate = sigmoid(1.05 (e^0.1 - 1)) * 4 / 1.05 -> l = +gate.
    old = torch.tensor([[0.0], [-1.0]])
    logprob = _leaf([[0.0], [-0.9]])
    mask = torch.ones(2, 1)
    loss, _ = sapo_policy_loss(logprob, old, torch.tensor([[1.0], [-1.0]]), mask, scale=LossScale.of(mask),
                               tau_pos=1.0, tau_neg=1.05)
    r = math.exp(0.1)
    gate_neg = 4 / 1.05 / (1 + math.exp(-1.05 * (r - 1)))
    assert loss.item() == pytest.approx((-2.0 + gate_neg) / 2, abs=1e-6)  # float32 cancellation
    loss.backward()
    assert logprob.grad[0, 0].item() == pytest.approx(-1.0 / 2)  # / 2 sequences


def test_gpg_is_plain_policy_gradient():
    # l = -A log pi: [-(1)(-1), -(-1)(-2)] = [1, -2], token-mean -0.5; d/dlogpi = -A / 2.
    logprob = _leaf([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    loss, _ = gpg_policy_loss(logprob, logprob.detach(), torch.tensor([[1.0, -1.0]]), mask,
                              scale=LossScale.of(mask), loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[-0.5, 0.5]]))


def test_cispo_weight_is_clipped_and_carries_no_gradient():
    # r = 1.5, high 0.28 -> weight 1.28; l = -1.28 * A * log pi = -1.28 * 1 * (-1) = 1.28; grad -1.28.
    logprob = _leaf([[-1.0]])
    old = torch.tensor([[-1.0 - math.log(1.5)]])
    mask = torch.ones(1, 1)
    loss, metrics = cispo_policy_loss(logprob, old, torch.ones(1, 1), mask, scale=LossScale.of(mask),
                                      clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(1.28, rel=1e-6)
    loss.backward()
    assert logprob.grad.item() == pytest.approx(-1.28, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == 1.0


def test_geo_mean_clips_token_log_ratios_then_averages_them():
    # row 0, A=+1, d=[0.1, 0.3] -> clamp [0.1, 0.2], pessimistic = min -> [0.1, 0.2]: rho = e^0.15.
    # row 1, A=-1, d=[-0.3, 0.1] -> clamp [-0.2, 0.1], pessimistic = max -> [-0.2, 0.1]: rho = e^-0.05.
    # loss = (-e^0.15 + e^-0.05) / 2 sequences.
    old = torch.zeros(2, 2)
    logprob = _leaf([[0.1, 0.3], [-0.3, 0.1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    mask = torch.ones(2, 2)
    loss, metrics = geo_mean_policy_loss(logprob, old, adv, mask, scale=LossScale.of(mask), **CLIP)
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(-0.05)) / 2, rel=1e-5)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)  # row 0, token 1
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.25)  # row 1, token 0


# Four tokens of one response for the covariance losses:
# A = [2, 1, -1, -1] (mean 0.25), log pi = [-0.5, -3, -1, -3.5] (mean -2)
# cov = (A - 0.25)(log pi + 2) = [1.75*1.5, 0.75*-1, -1.25*1, -1.25*-1.5] = [2.625, -0.75, -1.25, 1.875]
COV_ADV = torch.tensor([[2.0, 1.0, -1.0, -1.0]])
COV_LOGPROB = [[-0.5, -3.0, -1.0, -3.5]]


def test_clip_cov_drops_the_gradient_of_high_covariance_tokens():
    # On-policy (r = 1, nothing clipped). Bounds (2, 3): only token 0 (cov 2.625) is a candidate, and
    # ratio 0.25 of 4 tokens drops max(int(1), 1) = 1 token: it. l = -A * keep = [0, -1, 1, 1],
    # token-mean 0.25; the dropped token has no gradient, the others -A / 4.
    logprob = _leaf(COV_LOGPROB)
    mask = torch.ones(1, 4)
    loss, metrics = clip_cov_policy_loss(logprob, logprob.detach(), COV_ADV, mask, scale=LossScale.of(mask),
                                         **CLIP, loss_agg_mode="token-mean", clip_cov_ratio=0.25,
                                         clip_cov_lb=2.0, clip_cov_ub=3.0)
    assert loss.item() == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    loss.backward()
    torch.testing.assert_close(logprob.grad, torch.tensor([[0.0, -0.25, 0.25, 0.25]]))


def test_clip_cov_spares_tokens_the_trust_region_already_clips():
    # Token 0 has r = 1.5 > 1.2 with A > 0: PPO clips it, so it is no candidate and nothing is dropped:
    # l = [-2 * 1.2, -1, 1, 1], token-mean (-2.4 + 1) / 4 = -0.35.
    logprob = _leaf(COV_LOGPROB)
    old = logprob.detach() - torch.tensor([[math.log(1.5), 0.0, 0.0, 0.0]])
    mask = torch.ones(1, 4)
    loss, metrics = clip_cov_policy_loss(logprob, old, COV_ADV, mask, scale=LossScale.of(mask), **CLIP,
                                         loss_agg_mode="token-mean", clip_cov_ratio=0.25,
                                         clip_cov_lb=2.0, clip_cov_ub=3.0)
    assert loss.item() == pytest.approx(-0.35, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_top_covariance_tokens():
    # log r = [0.2, 0.1, -0.1, 0]; top max(1, int(4 * 0.25)) = 1 token by cov: token 0 (2.625).
    # l = [-2 e^0.2 + 0.1 * 0.2, -e^0.1, +e^-0.1, +1], token-mean.
    logprob = _leaf(COV_LOGPROB)
    old = logprob.detach() - torch.tensor([[0.2, 0.1, -0.1, 0.0]])
    mask = torch.ones(1, 4)
    loss, metrics = kl_cov_policy_loss(logprob, old, COV_ADV, mask, scale=LossScale.of(mask),
                                       loss_agg_mode="token-mean", kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    expected = (-2 * math.exp(0.2) + 0.02 - math.exp(0.1) + math.exp(-0.1) + 1.0) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx((0.2 + 0.1 + 0.1 + 0.0) / 4)  # mean |log r|


def test_vanilla_from_the_registry_is_ppo_clip_with_the_actor_settings():
    cfg = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="seq-mean-token-sum")
    bound = build_policy_loss(cfg)
    assert bound.func is ppo_clip_policy_loss
    assert bound.keywords == dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                                  loss_agg_mode="seq-mean-token-sum")


def test_build_binds_only_the_settings_a_loss_uses():
    cfg = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean",
                      policy_loss=PolicyLossConfig(loss_mode="gspo"))
    assert build_policy_loss(cfg).keywords == dict(clip_ratio_low=0.2, clip_ratio_high=0.28,
                                                   loss_agg_mode="seq-mean-token-mean")
    cfg = ActorConfig(tau_pos=2.0, policy_loss=PolicyLossConfig(loss_mode="sapo"))
    assert build_policy_loss(cfg).keywords == {"tau_pos": 2.0, "tau_neg": 1.05}
    cfg = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="kl_cov", ppo_kl_coef=0.5))
    assert build_policy_loss(cfg).keywords == {"loss_agg_mode": "token-mean", "kl_cov_ratio": 0.0002,
                                               "ppo_kl_coef": 0.5}
    with pytest.raises(ValueError, match="loss_mode=dpo"):
        build_policy_loss(ActorConfig(policy_loss=PolicyLossConfig(loss_mode="dpo")))
