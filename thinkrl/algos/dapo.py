"""DAPO's two reward-side pieces as pure functions (Yu et al. 2025, "DAPO: An
Open-Source LLM Reinforcement Learning System at Scale", arXiv:2503.14476).

Shape legend: N responses = B prompts x G samples.

- The soft overlong penalty (``reward_model.overlong_buffer.*``, verl's DAPO
  recipe): responses that run into the last ``len`` tokens of the response
  limit lose up to ``penalty_factor``, linearly.
- Dynamic sampling's group filter (``algorithm.filter_groups.*``): a group
  whose responses all have the same metric value has zero GRPO advantage and
  teaches nothing, so it is dropped and more prompts are generated.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mixed_groups", "overlong_penalty"]


def overlong_penalty(response_lengths: Tensor, *, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> Tensor:
    """Soft overlong penalty, added to each response's score.

        exceed_i  = |y_i| - (max_response_length - buffer_len)
        penalty_i = min(-exceed_i / buffer_len * penalty_factor, 0)

    0 up to ``max_response_length - buffer_len`` tokens, then falling linearly to
    ``-penalty_factor`` at ``max_response_length``.

    Args:
        response_lengths: [N] response tokens of each response (EOS included, as verl counts).
        max_response_length: the response limit (``data.max_response_length``).
        buffer_len: ``reward_model.overlong_buffer.len`` (> 0).
        penalty_factor: ``reward_model.overlong_buffer.penalty_factor``.

    Returns:
        [N] float32 penalties, each <= 0.
    """
    assert buffer_len > 0, "checks.validate rejects overlong_buffer.len <= 0"
    exceed = response_lengths.float() - (max_response_length - buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(max=0.0)


def mixed_groups(values: Tensor, group_ids: Tensor) -> Tensor:
    """Which responses belong to a group worth training on.

        keep_i = (max_{j in g(i)} v_j > min_{j in g(i)} v_j)  or  |g(i)| = 1

    (verl keeps groups with a non-zero std, and groups of one.)

    Args:
        values: [N] the filter metric of each response.
        group_ids: [N] long, equal for responses to the same prompt.

    Returns:
        [N] bool.
    """
    _, index = torch.unique(group_ids, return_inverse=True)
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    values = values.double()
    high = torch.full((num_groups,), -torch.inf, dtype=values.dtype).scatter_reduce(0, index, values, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=values.dtype).scatter_reduce(0, index, values, "amin")
    sizes = torch.zeros(num_groups, dtype=torch.long).index_add_(0, index, torch.ones_like(index))
    return ((high > low) | (sizes == 1))[index]
