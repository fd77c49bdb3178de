"""The reward stage: decode responses, score each with its data source's
function, put the score on the last response token (as verl does, so that
token-level advantages and KL-in-reward line up)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from thinkrl.records import Rollouts, Sample
from thinkrl.rewards.registry import Scorer

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Scores:
    scores: Tensor  # [N] float32
    errors: int
    """Responses whose scorer raised; they score 0."""
    texts: list[str]  # [N] decoded responses


def score_texts(texts: list[str], samples: list[Sample], *,
                scorer_for: Callable[[str], Scorer]) -> tuple[Tensor, int]:
    """One float per text; a scorer that raises scores 0 and is counted (and
    logged once with its sample), so a bad reward never stops a run."""
    scores, errors = [], 0
    for text, sample in zip(texts, samples, strict=True):
        try:
            value = float(scorer_for(sample.data_source)(text, sample.ground_truth,
                                                         sample.extra_info))
        except Exception as err:  # a user scorer may raise anything
            if errors == 0:
                log.warning("reward function for %s raised %r on row %d; scoring 0. Response: %.200r",
                            sample.data_source, err, sample.index, text)
            errors += 1
            value = 0.0
        scores.append(value)
    return torch.tensor(scores, dtype=torch.float32), errors


def score_rollouts(rollouts: Rollouts, tokenizer, *, scorer_for: Callable[[str], Scorer]) -> Scores:
    texts = decode_responses(rollouts, tokenizer)
    scores, errors = score_texts(texts, rollouts.samples, scorer_for=scorer_for)
    return Scores(scores=scores, errors=errors, texts=texts)


def decode_responses(rollouts: Rollouts, tokenizer) -> list[str]:
    return [tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
            for ids, mask in zip(rollouts.response_ids, rollouts.response_mask)]


def token_level_rewards(scores: Tensor, response_mask: Tensor) -> Tensor:
    """Each response's score on its last token. [N], [N, R] -> [N, R]."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores
    return rewards
