"""Advantage estimators: turn per-token rewards into per-token advantages.

Shape legend: N responses = B prompts x G samples, T response tokens.

GRPO (Shao et al. 2024, "DeepSeekMath") scores each response by its total
reward and compares it with the other responses to the same prompt: the
advantage is the score minus the group mean, divided by the group std
(unbiased, as ``torch.std``) unless ``norm_adv_by_std_in_grpo`` is off
(Dr. GRPO, Liu et al. 2025, argue the std division biases toward easy and
hard prompts). One advantage is shared by every token of a response.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["ADVANTAGE_ESTIMATORS", "get_advantage_estimator", "grpo_outcome_advantage"]


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


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Tensor]] = {
    "grpo": grpo_outcome_advantage,
}


def get_advantage_estimator(name: str) -> Callable[..., Tensor]:
    """Return the advantage estimator registered under ``name``."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(
            f"Unknown advantage estimator {name!r}; set the advantage estimator to one of: {known}."
        ) from None
