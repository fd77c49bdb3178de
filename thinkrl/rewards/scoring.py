"""The reward stage's tensor side: responses decoded for the scorers
(`thinkrl.rewards.scorer`), and each score put on the last response token
(as verl does, so that token-level advantages and KL-in-reward line up)."""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.records import Rollouts


def decode_responses(rollouts: Rollouts, tokenizer) -> list[str]:
    """Each response's text; a multi-turn one whole, its tool turns included
    (as verl's reward managers decode it: the answer is in the last turn)."""
    return [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
            for ids, mask in zip(rollouts.response_ids, rollouts.trajectory_mask)]


def token_level_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Each response's score on its last token with mask 1 (the last sampled
    token: a multi-turn response has 0s inside it, at its tool turns, so the
    mask's sum is not that position). [N], [N, R] -> [N, R]."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    columns = torch.arange(response_mask.shape[-1])
    last = torch.where(response_mask.bool(), columns, -1).max(-1).values.clamp(min=0)
    rewards[torch.arange(len(scores)), last] = scores
    return rewards
