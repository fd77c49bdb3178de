"""A training batch for update tests (imported by name: tests/ is on sys.path)."""

from __future__ import annotations

import torch

from thinkrl.records import Rollouts, TrainBatch


def random_advantage_batch(rollouts: Rollouts, logprobs: torch.Tensor, *, seed: int = 0) -> TrainBatch:
    """`rollouts` as a TrainBatch with one standard-normal advantage per
    response (seeded) on its response tokens, and `logprobs` as both pi_old
    and pi_ref: an update that moves the weights the same way wherever it runs."""
    r = rollouts.response_ids.shape[1]
    advantages = torch.randn(len(rollouts), 1, generator=torch.Generator().manual_seed(seed))
    return TrainBatch(*rollouts.sequences(), response_mask=rollouts.response_mask.float(),
                      advantages=advantages.expand(-1, r) * rollouts.response_mask,
                      old_logprobs=logprobs, ref_logprobs=logprobs, model_inputs=rollouts.model_inputs)
