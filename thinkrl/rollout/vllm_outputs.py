"""vLLM's completions as thinkrl's `Rollouts` record, the same layout the
native engine returns, so nothing after generation knows which engine ran."""

from __future__ import annotations

import torch

from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts
from thinkrl.rollout.base import SamplingParams


def sampled_logprobs(completion) -> list[float]:
    """The log-prob of each generated token (vLLM gives a dict per position
    holding the sampled token, plus the top ones when asked for more)."""
    return [step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs)]


def to_rollouts(prompts: PromptBatch, completions: list[list[tuple]], *, params: SamplingParams,
                pad_token_id: int) -> Rollouts:
    """The Rollouts record of an engine's completions: `completions[i]` holds
    prompt i's `params.n` (token_ids, logprobs, finish_reason). Responses are
    right-padded with the pad id to the longest; the mask covers every
    generated token, the stop token included, as in `native`."""
    flat = [c for per_prompt in completions for c in per_prompt]
    width = max(1, max(len(ids) for ids, _, _ in flat))
    n = len(flat)
    response_ids = torch.full((n, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(n, width, dtype=torch.long)
    logprobs = torch.zeros(n, width)
    reasons = []
    for row, (ids, lps, reason) in enumerate(flat):
        response_ids[row, :len(ids)] = torch.tensor(list(ids), dtype=torch.long)
        response_mask[row, :len(ids)] = 1
        logprobs[row, :len(ids)] = torch.tensor(list(lps), dtype=torch.float32)
        reasons.append(FINISH_STOP if reason == "stop" else FINISH_LENGTH)
    g = params.n
    return Rollouts(
        prompt_ids=prompts.input_ids.repeat_interleave(g, dim=0),
        prompt_mask=prompts.attention_mask.repeat_interleave(g, dim=0),
        response_ids=response_ids, response_mask=response_mask, rollout_logprobs=logprobs,
        finish_reasons=reasons, group_ids=torch.arange(len(prompts)).repeat_interleave(g),
        samples=[s for s in prompts.samples for _ in range(g)])
