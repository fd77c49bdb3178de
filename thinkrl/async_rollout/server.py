"""The rollout side of asynchronous training as a plain class: its own copy
of the policy, the weight version it serves, and generation that stamps every
token with the version that sampled it.

Partial rollout (`async_training.partial_rollout`): every `chunk_tokens`
decoded tokens the server looks for a weight load that has arrived; if one
has, decoding pauses, the load is applied (`apply_pending`), and the rows
still running continue with the new weights, their prompt and tokens so far
prefilled again (the KV cache of the old weights is not reused, as verl's
resume recomputes it). Without a load, decoding never pauses. Each token
keeps the version it was sampled with. Without partial rollout (chunk_tokens
0) a batch is decoded in one call and a load waits for the batch's end.

Shapes: N responses, R response tokens.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from thinkrl.models.loading import load_causal_lm
from thinkrl.parallel.device import autocast, compute_dtype, resolve_device
from thinkrl.records import FINISH_STOP, PromptBatch, Rollouts
from thinkrl.rollout.attest import Ledger, unit_of
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.workers.policy_rank import RankSpec

NO_VERSION = -1
"""The version of a server that has not been given the trainer's weights yet."""


@dataclass
class Generated:
    """One generate call's responses, with the policy version of every token."""

    rollouts: Rollouts
    versions: Tensor
    """[N, R] long: the version that sampled each response token (NO_VERSION past a row's end)."""
    seconds: float
    """Time spent generating (the rollout side's busy time)."""
    continued: int = 0
    """Rows that went on across at least one weight load (partial rollout)."""
    decode_steps: int = 0
    """Decoding forwards it took (every running response one token each):
    the longest response for a batch decoded alone; for a streamed batch,
    the engine's steps since the batch before."""
    origins: list[list[int]] | None = None
    """Streaming rollout: per group, (epoch, position, row) of the loader draw
    its prompt came from (a batch mixes draws); None: the batch is one draw."""


class RolloutServer:
    """Generates with its own copy of the policy (a native engine on it)."""

    def __init__(self, spec: RankSpec, *, chunk_tokens: int = 0) -> None:
        cfg, model_cfg = spec.cfg, spec.cfg.actor_rollout_ref.model
        device = resolve_device(spec.device or cfg.trainer.device)
        model = load_causal_lm(spec.model_path, dtype=torch.float32, device=device,
                               trust_remote_code=model_cfg.trust_remote_code,
                               override_config=model_cfg.override_config)
        model.eval().requires_grad_(False)
        self.engine = NativeEngine(
            model, eos_token_ids=list(spec.eos_token_ids), pad_token_id=spec.pad_token_id,
            seed=spec.sampling_seed, device=device,
            autocast=autocast(device, compute_dtype(device, model_cfg.dtype)))
        self.chunk_tokens = chunk_tokens
        self.version = NO_VERSION

    def load(self, version: int, weights: dict[str, Tensor]) -> Ledger:
        """Take the trainer's weights of policy `version`; the digests of what
        this copy now holds, for the trainer to attest (`thinkrl.rollout.attest`)."""
        self.engine.update_weights(weights.items())
        self.version = version
        return self.served()

    def served(self) -> Ledger:
        """The digests of the weights this copy holds now."""
        served = Ledger()
        started = time.perf_counter()
        for name, tensor in self.engine.model.state_dict().items():
            served.add(unit_of(name), tensor)
        served.seconds = time.perf_counter() - started
        return served

    def generator_state(self) -> Tensor:
        return self.engine.generator_state()

    def set_generator_state(self, state: Tensor) -> None:
        self.engine.set_generator_state(state)

    def generate(self, prompts: PromptBatch, params: SamplingParams,
                 apply_pending: Callable[[], None] | None = None,
                 pending: Callable[[], bool] | None = None) -> Generated:
        """`params.n` responses per prompt. With `chunk_tokens`, `pending` (is
        a weight load waiting?) and `apply_pending` (load it), decoding looks
        every `chunk_tokens` tokens and, when a load waits, pauses, loads it
        and goes on with the new weights (the module's docstring)."""
        started = time.perf_counter()
        if not self.chunk_tokens or apply_pending is None or pending is None:
            rollouts = self.engine.generate(prompts, params)
            versions = torch.where(rollouts.response_mask.bool(), self.version, NO_VERSION)
            return Generated(rollouts, versions, time.perf_counter() - started,
                             decode_steps=rollouts.response_ids.shape[1])

        def pause(tokens: int) -> bool:
            return tokens % self.chunk_tokens == 0 and pending()
        first = self.engine.generate(prompts, params, pause=pause)
        pieces = [_Piece.of(first, self.version)]
        done = _finished(first, params.max_tokens)
        produced, continued = first.response_ids.shape[1], torch.zeros(len(first), dtype=torch.bool)
        while not bool(done.all()) and produced < params.max_tokens:
            before = self.version
            apply_pending()
            rows = (~done).nonzero()[:, 0]
            continued[rows] |= self.version != before
            step = dataclasses.replace(params, n=1, max_tokens=params.max_tokens - produced)
            part = self.engine.generate(_continuation(first, pieces, rows, self.engine.pad_token_id),
                                        step, pause=pause)
            pieces.append(_Piece.of(part, self.version, rows=rows, total=len(first)))
            produced += part.response_ids.shape[1]
            done[rows] = _finished(part, step.max_tokens)
        return _assemble(first, pieces, self.engine.pad_token_id, started, int(continued.sum()))


@dataclass
class _Piece:
    """One chunk's tokens for every row of the batch (rows that did not run: empty)."""

    ids: Tensor  # [N, c]
    mask: Tensor  # [N, c]
    logprobs: Tensor  # [N, c]
    versions: Tensor  # [N, c]
    reasons: dict[int, str]

    @classmethod
    def of(cls, part: Rollouts, version: int, *, rows: Tensor | None = None, total: int = 0) -> "_Piece":
        if rows is None:
            rows, total = torch.arange(len(part)), len(part)
        c = part.response_ids.shape[1]
        ids = torch.zeros(total, c, dtype=torch.long)
        mask, logprobs = torch.zeros_like(ids), torch.zeros(total, c)
        ids[rows], mask[rows], logprobs[rows] = part.response_ids, part.response_mask, part.rollout_logprobs
        versions = torch.where(mask.bool(), version, NO_VERSION)
        return cls(ids, mask, logprobs, versions, dict(zip(rows.tolist(), part.finish_reasons)))


def _finished(part: Rollouts, budget: int) -> Tensor:
    """[n] bool: the row stopped (EOS) or used up its `budget` tokens."""
    stopped = torch.tensor([r == FINISH_STOP for r in part.finish_reasons], dtype=torch.bool)
    return stopped | (part.response_mask.sum(-1) >= budget)


def _continuation(first: Rollouts, pieces: list[_Piece], rows: Tensor, pad: int) -> PromptBatch:
    """The running `rows` as prompts: their prompt and every token so far, left-padded."""
    sequences = []
    for r in rows.tolist():
        prompt = first.prompt_ids[r][first.prompt_mask[r].bool()]
        tokens = [p.ids[r][p.mask[r].bool()] for p in pieces]
        sequences.append(torch.cat([prompt, *tokens]))
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(sequences):
        ids[i, width - len(s):], mask[i, width - len(s):] = s, 1
    return PromptBatch(ids, mask, [first.samples[r] for r in rows.tolist()])


def _assemble(first: Rollouts, pieces: list[_Piece], pad: int, started: float,
              continued: int) -> Generated:
    """One Rollouts record of the chunks: each row's tokens in order, right-padded."""
    n = len(first)
    rows_ids, rows_lp, rows_v = [], [], []
    reasons = list(first.finish_reasons)
    for r in range(n):
        keep = [p.mask[r].bool() for p in pieces]
        rows_ids.append(torch.cat([p.ids[r][k] for p, k in zip(pieces, keep)]))
        rows_lp.append(torch.cat([p.logprobs[r][k] for p, k in zip(pieces, keep)]))
        rows_v.append(torch.cat([p.versions[r][k] for p, k in zip(pieces, keep)]))
        for p in pieces:
            reasons[r] = p.reasons.get(r, reasons[r])
    ids, mask, logprobs, versions = right_padded(rows_ids, rows_lp, rows_v, pad)
    rollouts = Rollouts(first.prompt_ids, first.prompt_mask, ids, mask, logprobs, reasons,
                        first.group_ids, first.samples)
    return Generated(rollouts, versions, time.perf_counter() - started, continued,
                     decode_steps=sum(p.ids.shape[1] for p in pieces))


def right_padded(tokens: list[Tensor], logprobs: list[Tensor], versions: list[Tensor],
                 pad: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """N responses of their own lengths as [N, R] tensors, R the longest (at
    least 1): ids (pad after the end), mask, log-probs (0), versions (NO_VERSION)."""
    n, width = len(tokens), max(1, max(len(t) for t in tokens))
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask, padded_logprobs = torch.zeros_like(ids), torch.zeros(n, width)
    padded_versions = torch.full((n, width), NO_VERSION, dtype=torch.long)
    for r, (t, lp, v) in enumerate(zip(tokens, logprobs, versions)):
        k = len(t)
        ids[r, :k], mask[r, :k], padded_logprobs[r, :k], padded_versions[r, :k] = t, 1, lp, v
    return ids, mask, padded_logprobs, padded_versions
