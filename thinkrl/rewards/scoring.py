"""The reward stage's batch side: responses decoded for the scorers
(`thinkrl.rewards.scorer`), environments' rewards merged with the reward
function's (`score_rollouts`), what counts as correct, and each score put on
the last response token (as verl does, so that token-level advantages and
KL-in-reward line up)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor

from thinkrl.records import Rollouts, Sample, TurnStats
from thinkrl.rewards.scorer import RewardScorer, ScoreResult


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


CORRECT_SCORE = 1.0
"""A response is correct when its accuracy (the scorer's "accuracy" part, or
its score) reaches this."""


def is_correct(score: float, parts: dict[str, float] | None) -> bool:
    """The scorer's accuracy part when it reports one (r1, reasoning_gym),
    else the score, at least CORRECT_SCORE."""
    value = parts["accuracy"] if parts and "accuracy" in parts else score
    return value >= CORRECT_SCORE


def score_rollouts(reward: RewardScorer, rollouts: Rollouts, texts: list[str], *,
                   give_up: Callable[[int], bool] | None = None) -> ScoreResult:
    """One score per response. Responses of an environment that owns the
    reward (games) score the sum of its step rewards; a response whose
    environment failed scores 0; every other response goes to the run's
    reward function with verl's extra_info additions ``turn_scores`` (the
    step rewards its environment gave) and ``num_turns``."""
    turns = rollouts.turns
    if turns is None:
        return reward.score(texts, rollouts.samples, give_up=give_up)
    by_function = [i for i in range(len(rollouts))
                   if not bool(turns.env_scored[i]) and turns.failures[i] is None]
    samples = [_with_turns(rollouts.samples[i], turns, i) for i in by_function]
    part = reward.score([texts[i] for i in by_function], samples, give_up=give_up)
    scores = torch.where(turns.env_scored, turns.env_rewards, torch.zeros(len(rollouts)))
    scores[[i for i, f in enumerate(turns.failures) if f is not None]] = 0.0
    parts: list[dict[str, float]] = [{} for _ in range(len(rollouts))]
    for k, i in enumerate(by_function):
        scores[i] = part.scores[k]
        parts[i] = part.parts[k] if part.parts else {}
    return ScoreResult(scores, part.errors, part.timeouts, parts, part.unscored)


def _with_turns(sample: Sample, turns: TurnStats, i: int) -> Sample:
    """verl's additions to extra_info in a batch of conversations (every row, a
    single-turn one too: num_turns 2, no turn scores)."""
    num_turns = int(turns.assistant_turns[i] + turns.env_turns[i]) + 1  # verl counts the prompt's turn
    return dataclasses.replace(sample, extra_info={**sample.extra_info, "turn_scores": list(turns.turn_rewards[i]),
                                                   "num_turns": num_turns})
