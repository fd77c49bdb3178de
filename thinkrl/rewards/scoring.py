"""The reward stage's tensor side: responses decoded for the scorers
(`thinkrl.rewards.scorer`), and each score put on the last response token
(as verl does, so that token-level advantages and KL-in-reward line up)."""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.records import Rollouts


def decode_responses(rollouts: Rollouts, tokenizer) -> list[str]:
    return [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
            for ids, mask in zip(rollouts.response_ids, rollouts.response_mask)]


def token_level_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Each response's score on its last token. [N], [N, R] -> [N, R]."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores
    return rewards
