"""Advantage estimators: turn per-token rewards into per-token advantages.

Shape legend: N responses = B prompts x G samples, T response tokens.

Every estimator is a pure function ``(token_level_rewards [N, T],
response_mask [N, T], group_ids [N], *, settings) -> advantages [N, T]``,
registered under its verl name (``algorithm.adv_estimator``). Its settings
are bound once when the run is built (``build_advantage_estimator``), so the
trainer calls every estimator the same way. The formulas follow verl's
``core_algos.py``; each docstring names the paper.

GRPO (Shao et al. 2024, "DeepSeekMath") scores each response by its total
reward and compares it with the other responses to the same prompt: the
advantage is the score minus the group mean, divided by the group std
(unbiased, as ``torch.std``) unless ``norm_adv_by_std_in_grpo`` is off
(Dr. GRPO, Liu et al. 2025, argue the std division biases toward easy and
hard prompts). One advantage is shared by every token of a response.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from thinkrl.algos.gae import AdvantageResult, gae_advantage
from thinkrl.algos.whiten import masked_whiten
from thinkrl.config.schema import AlgorithmConfig
from thinkrl.errors import UserError

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageFn",
    "AdvantageResult",
    "BoundEstimator",
    "build_advantage_estimator",
    "get_advantage_estimator",
    "gae_advantage",
    "gpg_outcome_advantage",
    "grpo_outcome_advantage",
    "grpo_passk_outcome_advantage",
    "masked_whiten",
    "opo_outcome_advantage",
    "reinforce_plus_plus_advantage",
    "reinforce_plus_plus_baseline_advantage",
    "remax_outcome_advantage",
    "rloo_outcome_advantage",
]

AdvantageFn = Callable[[Tensor, Tensor, Tensor], Tensor]
"""An estimator: (token_level_rewards [N, T], response_mask [N, T], group_ids [N], *,
settings) -> [N, T] (GAE: an `AdvantageResult` with its returns)."""


@torch.no_grad()
def grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    group_ids: Tensor,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> Tensor:
    """GRPO outcome advantage, one value per response broadcast over its tokens.

        s_i   = sum_t r_{i,t}
        mu_g  = mean_{j in g} s_j,   sigma_g = sqrt(sum_{j in g} (s_j - mu_g)^2 / (|g| - 1))
        A_i   = (s_i - mu_g) / (sigma_g + epsilon)   if norm_adv_by_std_in_grpo
        A_i   =  s_i - mu_g                          otherwise
        A_{i,t} = A_i * mask_{i,t}

    A group of one response has no peers to compare with; like verl we give it
    mu = 0 and sigma = 1, so its advantage is its own score (/ (1 + epsilon)).
    A group whose scores are all equal gets advantage 0: nothing to learn.

    Args:
        token_level_rewards: [N, T] reward of each response token (usually
            the outcome reward placed on the last token, zeros elsewhere).
        response_mask: [N, T] 1 for real response tokens, 0 for padding.
        group_ids: [N] long; responses with equal ids were sampled from the
            same prompt. Ids may be any integers in any order.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr. GRPO).
        epsilon: added to the std so a near-constant group does not blow up.

    Returns:
        [N, T] float32 advantages, zero on padding; no grad.
    """
    rewards = token_level_rewards.float()
    mask = response_mask.float()
    scores = rewards.sum(dim=-1)  # [N]

    # Map arbitrary ids to 0..num_groups-1 so per-group sums are one scatter.
    _, group_index = torch.unique(group_ids, return_inverse=True)  # [N]
    num_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    counts = torch.zeros(num_groups, device=scores.device).index_add_(0, group_index, torch.ones_like(scores))
    sums = torch.zeros(num_groups, device=scores.device).index_add_(0, group_index, scores)
    group_mean = sums / counts  # [num_groups]
    sq_dev = (scores - group_mean[group_index]) ** 2  # [N]
    sq_dev_sums = torch.zeros(num_groups, device=scores.device).index_add_(0, group_index, sq_dev)
    # Bessel correction (|g| - 1) matches torch.std; clamp avoids 0/0 for singletons,
    # which are overwritten just below anyway.
    group_std = (sq_dev_sums / (counts - 1).clamp(min=1)).sqrt()

    singleton = counts == 1
    group_mean = torch.where(singleton, torch.zeros_like(group_mean), group_mean)
    group_std = torch.where(singleton, torch.ones_like(group_std), group_std)

    adv = scores - group_mean[group_index]  # [N]
    if norm_adv_by_std_in_grpo:
        adv = adv / (group_std[group_index] + epsilon)
    return adv.unsqueeze(-1) * mask  # [N, T]


def _groups(group_ids: Tensor) -> tuple[Tensor, int]:
    """(index [N] in 0..num_groups-1, num_groups) for arbitrary integer ids."""
    _, index = torch.unique(group_ids, return_inverse=True)
    return index, (int(index.max().item()) + 1 if index.numel() else 0)


def _group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Per-group sums of ``values`` [N] -> [num_groups]."""
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def _scores_and_groups(token_level_rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(scores [N], group index [N], group size per response [N])."""
    scores = token_level_rewards.float().sum(dim=-1)
    index, num_groups = _groups(group_ids)
    counts = _group_sum(torch.ones_like(scores), index, num_groups)
    return scores, index, counts[index]


def _group_mean(scores: Tensor, index: Tensor, sizes: Tensor) -> Tensor:
    """Mean score of each response's group [N]; 0 for a group of one (verl's convention)."""
    sums = _group_sum(scores, index, int(index.max().item()) + 1)[index]
    return torch.where(sizes > 1, sums / sizes, torch.zeros_like(scores))


@torch.no_grad()
def rloo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: each response against the mean of the OTHER responses to its prompt.

        A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1) = (n_g s_i - sum_g s) / (n_g - 1)

    A group of one keeps its own score (verl). Ahmadian et al. 2024, "Back to Basics:
    Revisiting REINFORCE Style Optimization for Learning from Human Feedback in LLMs"
    (arXiv:2402.14740). Shapes: rewards, mask [N, T]; group_ids [N]; returns [N, T].
    """
    scores, index, sizes = _scores_and_groups(token_level_rewards, group_ids)
    sums = _group_sum(scores, index, int(index.max().item()) + 1)[index]
    adv = torch.where(sizes > 1, (sizes * scores - sums) / (sizes - 1).clamp(min=1), scores)
    return adv.unsqueeze(-1) * response_mask.float()


@torch.no_grad()
def reinforce_plus_plus_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                                  *, gamma: float) -> Tensor:
    """REINFORCE++: discounted return-to-go, whitened over every token of the batch.

        G = discounted_returns(r, mask, gamma)
        A = masked_whiten(G, mask) * mask

    No per-prompt baseline: ``group_ids`` is unused. Hu et al. 2025, "REINFORCE++"
    (arXiv:2501.03262). Shapes: rewards, mask [N, T]; returns [N, T].
    """
    mask = response_mask.float()
    return masked_whiten(discounted_returns(token_level_rewards, mask, gamma=gamma), mask) * mask


def discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, *, gamma: float) -> Tensor:
    """Return-to-go over the policy's own tokens (mask 1). [N, T], [N, T] -> [N, T].

        G_t = r_t + gamma * G_{t'}   at a token (t' its next token with mask 1; G = 0 past the last)
        G_t = 0                      at a masked position

    A masked position is not a step: its reward is not counted and it is not
    discounted over, so the return carries across a gap inside the response
    (a tool's output between two assistant turns) to the tokens before it.
    Padding after the last token is a gap with nothing after it, so it
    carries nothing back. (verl reset the return at every masked position
    before its fix of issue #7278; with no gaps both agree.)
    """
    rewards, mask = token_level_rewards.float(), response_mask.float()
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t] > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    return returns


@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(token_level_rewards: Tensor, response_mask: Tensor,
                                           group_ids: Tensor) -> Tensor:
    """REINFORCE++-baseline: the group mean as baseline, then batch whitening.

        A_i = s_i - mean_{j in g} s_j            (0 baseline for a group of one)
        A   = masked_whiten(A_i broadcast over tokens, mask) * mask

    The whitening statistics weigh each response by its token count (verl).
    Hu et al. 2025, "REINFORCE++" (arXiv:2501.03262). Shapes: [N, T], [N, T], [N] -> [N, T].
    """
    scores, index, sizes = _scores_and_groups(token_level_rewards, group_ids)
    mask = response_mask.float()
    centred = (scores - _group_mean(scores, index, sizes)).unsqueeze(-1) * mask
    return masked_whiten(centred, mask) * mask


@torch.no_grad()
def opo_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """OPO: the length-weighted group mean as baseline (optimal for on-policy REINFORCE).

        b_g = sum_{j in g} |y_j| s_j / sum_{j in g} |y_j|,   A_i = s_i - b_g   (b = 0 for a group of one)

    Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv:2505.23585).
    Shapes: [N, T], [N, T], [N] -> [N, T].
    """
    scores, index, sizes = _scores_and_groups(token_level_rewards, group_ids)
    mask = response_mask.float()
    lengths = mask.sum(dim=-1)
    num_groups = int(index.max().item()) + 1
    weighted = _group_sum(lengths * scores, index, num_groups)[index]
    total = _group_sum(lengths, index, num_groups)[index]
    baseline = torch.where(sizes > 1, weighted / total.clamp(min=1e-8), torch.zeros_like(scores))
    return (scores - baseline).unsqueeze(-1) * mask


@torch.no_grad()
def grpo_passk_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                                 *, norm_adv_by_std_in_grpo: bool, epsilon: float = 1e-6) -> Tensor:
    """Pass@k GRPO: only the best response of each group learns, by its lead over the second.

        A_{argmax_g} = (s_max - s_second) / (std_g + epsilon)   (no division without norm_adv_by_std_in_grpo)
        A_i = 0 for every other response; std_g is unbiased (torch.std). Ties go to torch.topk's pick.

    Every group needs two responses at least. Paper: arXiv:2503.19595, as verl cites it
    for its ``grpo_passk`` estimator.
    Shapes: [N, T], [N, T], [N] -> [N, T].
    """
    scores = token_level_rewards.float().sum(dim=-1)
    adv = torch.zeros_like(scores)
    for group in torch.unique(group_ids):
        rows = (group_ids == group).nonzero(as_tuple=True)[0]
        if rows.numel() < 2:
            raise UserError(f"grpo_passk needs at least 2 responses per prompt, group {int(group)} has "
                             f"{rows.numel()}; set actor_rollout_ref.rollout.n>=2")
        group_scores = scores[rows]
        top, top_index = torch.topk(group_scores, 2)
        lead = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            lead = lead / (group_scores.std() + epsilon)
        adv[rows[top_index[0]]] = lead
    return adv.unsqueeze(-1) * response_mask.float()


@torch.no_grad()
def gpg_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                          *, f_norm: float = 1.0) -> Tensor:
    """GPG: group-centred scores, scaled up by the share of responses with a non-zero score.

        alpha = N / max(#{i : s_i != 0}, 1)
        A_i   = alpha * (s_i - mean_g s) / f_norm        (mean 0 for a group of one)

    Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for
    Model Reasoning" (arXiv:2504.02546). Shapes: [N, T], [N, T], [N] -> [N, T].
    """
    scores, index, sizes = _scores_and_groups(token_level_rewards, group_ids)
    alpha = scores.numel() / max(int(torch.count_nonzero(scores).item()), 1)
    adv = alpha * (scores - _group_mean(scores, index, sizes)) / f_norm
    return adv.unsqueeze(-1) * response_mask.float()


@torch.no_grad()
def remax_outcome_advantage(token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                            *, reward_baselines: Tensor) -> Tensor:
    """ReMax: REINFORCE with the score of the prompt's greedy response as baseline.

        G_{i,t} = sum_{t' >= t} r_{i,t'} m_{i,t'}     (return-to-go, undiscounted)
        A_{i,t} = (G_{i,t} - b_i) m_{i,t}

    ``reward_baselines`` [N] is step data, not a setting: the trainer's greedy-baseline
    stage scores one greedy response per prompt and binds it per step. ``group_ids`` is
    unused. Li et al. 2024, "ReMax: A Simple, Effective, and Efficient Reinforcement
    Learning Method for Aligning Large Language Models" (arXiv:2310.10505).
    Shapes: [N, T], [N, T], [N], [N] -> [N, T].
    """
    mask = response_mask.float()
    returns = (token_level_rewards.float() * mask).flip(-1).cumsum(-1).flip(-1)
    return (returns - reward_baselines.float().unsqueeze(-1)) * mask  # 0 at a gap, too


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor | AdvantageResult]] = {
    "grpo": grpo_outcome_advantage,
    "rloo": rloo_outcome_advantage,
    "reinforce_plus_plus": reinforce_plus_plus_advantage,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline_advantage,
    "opo": opo_outcome_advantage,
    "grpo_passk": grpo_passk_outcome_advantage,
    "gpg": gpg_outcome_advantage,
    "remax": remax_outcome_advantage,
    "gae": gae_advantage,
}

# The config settings each estimator takes, read once when the run is built.
_SETTINGS: dict[str, Callable[[AlgorithmConfig], dict[str, Any]]] = {
    "grpo": lambda c: {"norm_adv_by_std_in_grpo": c.norm_adv_by_std_in_grpo},
    "grpo_passk": lambda c: {"norm_adv_by_std_in_grpo": c.norm_adv_by_std_in_grpo},
    "reinforce_plus_plus": lambda c: {"gamma": c.gamma},
    "gae": lambda c: {"gamma": c.gamma, "lam": c.lam},
}


def get_advantage_estimator(name: str) -> Callable[..., Tensor | AdvantageResult]:
    """Return the advantage estimator registered under ``name`` (unbound)."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise UserError(
            f"Unknown advantage estimator {name!r}; set the advantage estimator to one of: {known}."
        ) from None


@dataclass(frozen=True)
class BoundEstimator:
    """``algorithm.adv_estimator`` with its settings (``keywords``) bound at
    build: ``estimator(token_level_rewards, response_mask, group_ids, **step_inputs)``
    -> `AdvantageResult` (an estimator without returns gives its tensor,
    wrapped here; GAE gives its advantages and returns from one pass)."""

    fn: Callable[..., Tensor | AdvantageResult]
    keywords: dict[str, Any]

    def __call__(self, token_level_rewards: Tensor, response_mask: Tensor, group_ids: Tensor,
                 **step_inputs: Tensor) -> AdvantageResult:
        out = self.fn(token_level_rewards, response_mask, group_ids, **self.keywords, **step_inputs)
        return out if isinstance(out, AdvantageResult) else AdvantageResult(out)


def build_advantage_estimator(cfg: AlgorithmConfig) -> BoundEstimator:
    """``algorithm.adv_estimator`` with its settings bound."""
    fn = get_advantage_estimator(cfg.adv_estimator)
    return BoundEstimator(fn, _SETTINGS.get(cfg.adv_estimator, lambda _: {})(cfg))
