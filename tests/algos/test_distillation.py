"""On-policy distillation's loss: against verl's own function on fixed
tensors (golden/distillation_verl.json, written by verl's code), and against
numbers derived by hand."""

import json
import math
from pathlib import Path

import pytest
import torch

from thinkrl.algos.distillation import DistillSettings, distillation_loss, reverse_kl_metrics
from thinkrl.algos.losses import LossScale

GOLDEN = json.loads((Path(__file__).parent / "golden" / "distillation_verl.json").read_text())


def _settings(mode: str, pg: bool, clamp: float | None = None, *, task: bool = False) -> DistillSettings:
    return DistillSettings(loss_mode=mode, use_task_rewards=task, coef=1.0, loss_max_clamp=clamp,
                           use_policy_gradient=pg, clip_ratio_low=0.2, clip_ratio_high=0.2)


@pytest.mark.parametrize("case", GOLDEN["cases"],
                         ids=lambda c: f"{c['loss_mode']}-{'pg' if c['use_policy_gradient'] else 'sup'}-"
                                       f"{c['loss_agg_mode']}-{c['loss_max_clamp']}")
def test_matches_verls_distillation_loss(case):
    mask = torch.tensor(GOLDEN["response_mask"], dtype=torch.float64)
    student = torch.tensor(GOLDEN["student"], dtype=torch.float64, requires_grad=True)
    loss, metrics = distillation_loss(
        student, torch.tensor(GOLDEN["old"], dtype=torch.float64), torch.tensor(GOLDEN["teacher"], dtype=torch.float64),
        mask, settings=_settings(case["loss_mode"], case["use_policy_gradient"], case["loss_max_clamp"]),
        loss_agg_mode=case["loss_agg_mode"], scale=LossScale.of(mask))
    loss.backward()
    assert loss.item() == pytest.approx(case["loss"], rel=1e-7, abs=1e-12)
    # verl's seq-mean-token-mean divides by (tokens + 1e-8): a relative 1e-9 apart
    assert torch.allclose(student.grad * mask, torch.tensor(case["grad"], dtype=torch.float64), rtol=1e-7, atol=1e-12)
    assert metrics["distillation/loss"] == pytest.approx(case["loss"], rel=1e-7)


def test_k3_minimised_directly_by_hand():
    # one response, two tokens: s = log 0.5, q = log 0.25 -> d = q - s = -log 2; k3 = 0.5 + log 2 - 1
    #                            s = log 0.5, q = log 0.5  -> k3 = 0
    s = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
    q = torch.tensor([[math.log(0.25), math.log(0.5)]])
    mask = torch.ones(1, 2)
    loss, metrics = distillation_loss(s, s.detach(), q, mask, settings=_settings("k3", False),
                                      loss_agg_mode="token-mean", scale=LossScale.of(mask))
    assert loss.item() == pytest.approx((0.5 + math.log(2) - 1) / 2)
    loss.backward()
    # d k3 / d s = 1 - exp(q - s): 1 - 0.5 at token 1, 0 at token 2; token-mean halves it
    assert s.grad[0].tolist() == pytest.approx([0.25, 0.0])
    assert metrics["distillation/abs_loss"] == pytest.approx((0.5 + math.log(2) - 1) / 2)


def test_k1_policy_gradient_is_the_teacher_advantage_by_hand():
    # On-policy (ratio 1): loss = -mean(A), A = q - s; the gradient of token t is -A_t / tokens.
    s = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    q = torch.tensor([[-0.5, -3.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = distillation_loss(s, s.detach(), q, mask, settings=_settings("k1", True),
                                      loss_agg_mode="token-mean", scale=LossScale.of(mask))
    assert loss.item() == pytest.approx(-((0.5) + (-1.0)) / 2)
    loss.backward()
    assert s.grad[0].tolist() == pytest.approx([-0.25, 0.5, 0.0])
    assert metrics["distillation/pg_clipfrac"] == 0.0
    # the clamp bounds |d| at 0.25 before it becomes the advantage: A = [0.25, -0.25]
    s2 = s.detach().clone().requires_grad_(True)
    clamped, _ = distillation_loss(s2, s2.detach(), q, mask, settings=_settings("k1", True, 0.25),
                                   loss_agg_mode="token-mean", scale=LossScale.of(mask))
    assert clamped.item() == pytest.approx(0.0)


def test_weight_is_the_coefficient_beside_the_task_loss_only():
    assert _settings("k3", False, task=True).weight == 1.0
    assert DistillSettings("k3", True, 0.3, None, False, 0.2, 0.2).weight == 0.3
    assert DistillSettings("k3", False, 0.3, None, False, 0.2, 0.2).weight == 1.0  # verl: coef ignored


def test_reverse_kl_metric_per_source_by_hand():
    s = torch.tensor([[-1.0, -2.0], [-1.0, -1.0], [-0.5, 0.0]])
    q = torch.tensor([[-1.5, -2.0], [-3.0, -1.0], [-0.5, -4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    metrics = reverse_kl_metrics(s, q, mask, ["a", "b", "a"])
    # k1 on real tokens: a: 0.5, 0, 0 (3 tokens); b: 2 (1 token); all: 2.5 / 4
    assert metrics == pytest.approx({"distillation/reverse_kl": 2.5 / 4, "distillation/reverse_kl/a": 0.5 / 3,
                                     "distillation/reverse_kl/b": 2.0})
