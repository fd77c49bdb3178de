"""The generate-and-score stage of a step, with DAPO's dynamic sampling.

Plain runs generate one batch of ``data.train_batch_size`` prompts and score
it. With ``algorithm.filter_groups.enable`` (DAPO, arXiv:2503.14476), each
generation batch has ``data.gen_batch_size`` prompts; groups whose
``filter_groups.metric`` is the same for every response are dropped, and
batches are generated until ``data.train_batch_size`` mixed groups remain
(the first ones are kept, as verl does), or ``max_num_gen_batches`` is spent.
Scores carry DAPO's soft overlong penalty when ``reward_model.overlong_buffer``
is on. With ``algorithm.adv_estimator=remax`` each generation batch also gets
one greedy response per prompt, whose score is ReMax's baseline
(``timing_s/gen_max``, as verl names it).

Shapes: B prompts, G responses per prompt, N = B*G, P prompt tokens
(left-padded), R response tokens (right-padded).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from thinkrl.algos.dapo import mixed_groups, overlong_penalty
from thinkrl.config import Config
from thinkrl.data.dataset import PromptLoader
from thinkrl.errors import UserError
from thinkrl.metrics import StageTimer
from thinkrl.records import ModelInputs, PromptBatch, Rollouts, concat_turns
from thinkrl.reward_watch import FailureBreaker
from thinkrl.rewards.scorer import RewardScorer, ScoreResult
from thinkrl.rewards.scoring import decode_responses, score_rollouts
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import RolloutRole

__all__ = ["Draw", "GroupFilter", "OverlongPenalty", "Sampler", "ScoredRollouts", "build_sampler", "score"]


@dataclass(slots=True)
class ScoredRollouts:
    rollouts: Rollouts
    texts: list[str]  # [N] decoded responses
    scored: ScoreResult  # scores [N] include the overlong penalty
    raw_scores: Tensor  # [N] the reward function's scores, before the overlong penalty
    metrics: dict[str, float]  # train/num_gen_batches etc. under dynamic sampling
    reward_baselines: Tensor | None = None  # [N] ReMax: score of the prompt's greedy response
    versions: Tensor | None = None
    """[N, R] the policy version that sampled each token (async training; -1 past
    a row's end); None: every token is of the policy being updated."""
    behind_trainer: bool = False
    """Some token was sampled by weights older than the trainer's (async
    training, read from `versions`): the update is off-policy and corrected."""


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong penalty (reward_model.overlong_buffer.*)."""

    buffer_len: int
    penalty_factor: float
    max_response_length: int
    log: bool
    """Report reward/overlong_reward and reward/overlong per response."""


@dataclass(frozen=True)
class GroupFilter:
    """DAPO's dynamic sampling (algorithm.filter_groups.*, data.train_batch_size)."""

    metric: str
    max_num_gen_batches: int
    wanted: int
    """Prompts per training step (data.train_batch_size)."""


@dataclass(frozen=True)
class Draw:
    """What generating and scoring one batch of prompts needs."""

    engine: RolloutRole
    loader: PromptLoader
    reward: RewardScorer
    tokenizer: object
    sampling: SamplingParams
    overlong: OverlongPenalty | None = None
    breaker: FailureBreaker | None = None
    """Scoring stops once this breaker is certain to stop the run."""


Sampler = Callable[[StageTimer], ScoredRollouts]
"""The generate-and-score stage: this step's scored responses."""


def build_sampler(cfg: Config, draw: Draw) -> Sampler:
    """The stage for `cfg`, chosen once at build: one batch per step, with
    ReMax's greedy baselines when algorithm.adv_estimator=remax, and under
    DAPO's dynamic sampling (algorithm.filter_groups.enable) as many batches
    as it takes."""
    pick = one_batch_with_greedy_baseline if cfg.algorithm.adv_estimator == "remax" else one_batch
    pick = functools.partial(pick, draw)
    groups = cfg.algorithm.filter_groups
    if not groups.enable:
        return pick
    return functools.partial(dynamic_sampling, pick=pick, pad_token_id=draw.tokenizer.pad_token_id,
                             groups=GroupFilter(groups.metric, groups.max_num_gen_batches,
                                                cfg.data.train_batch_size))


def dynamic_sampling(timer: StageTimer, *, pick: Sampler, groups: GroupFilter,
                     pad_token_id: int) -> ScoredRollouts:
    """DAPO: batches from `pick` until groups.wanted prompts remain whose
    responses differ in groups.metric; the first ones kept."""
    wanted = groups.wanted
    kept: list[ScoredRollouts] = []
    num_kept = num_generated = batches = 0
    while num_kept < wanted:
        limit = groups.max_num_gen_batches
        if 0 < limit <= batches:
            raise RuntimeError(
                f"dynamic sampling: {batches} generation batches gave {num_kept} prompts whose "
                f"responses differ in {groups.metric!r}, fewer than data.train_batch_size={wanted}. "
                "The prompts are too easy or too hard for the model; raise "
                "algorithm.filter_groups.max_num_gen_batches (0: no limit) or data.gen_batch_size, "
                "or use other data")
        part = pick(timer)
        batches += 1
        values = filter_values(part, groups.metric)
        keep = mixed_groups(values, part.rollouts.group_ids)
        num_generated += int(part.rollouts.group_ids.unique().numel())
        num_kept += int(part.rollouts.group_ids[keep].unique().numel())
        kept.append(_select(part, keep.nonzero(as_tuple=True)[0]))
    merged = _concat(kept, pad_token_id=pad_token_id)
    # _concat numbers groups 0, 1, ... in the order they were generated: keep the first ones.
    result = _select(merged, (merged.rollouts.group_ids < wanted).nonzero(as_tuple=True)[0])
    result.metrics = {"train/num_gen_batches": float(batches),
                      "train/num_gen_prompts": float(num_generated),
                      "train/num_kept_prompts": float(num_kept)}
    return result


def filter_values(part: ScoredRollouts, metric: str) -> Tensor:
    """[N] per-response value of ``algorithm.filter_groups.metric``:
    acc (the reward's "acc" part, else its score, as verl's reward managers record it),
    score (before the overlong penalty), seq_reward and seq_final_reward (the score with
    it; no KL-in-reward penalty is applied before filtering), or any part the reward reports."""
    scored = part.scored
    if metric in ("seq_reward", "seq_final_reward"):
        return scored.scores
    if metric in ("acc", "score") and not (scored.parts and all(metric in p for p in scored.parts)):
        return part.raw_scores
    missing = sum(metric not in p for p in scored.parts)
    if missing:
        reported = sorted({k for p in scored.parts for k in p}) or ["none"]
        raise UserError(
            f"algorithm.filter_groups.metric={metric}: {missing} of {len(scored.parts)} responses have no "
            f"such value; the reward reports: {', '.join(reported)} (or use acc, score, seq_reward)")
    return torch.tensor([p[metric] for p in scored.parts], dtype=torch.float32)


def one_batch(draw: Draw, timer: StageTimer) -> ScoredRollouts:
    """One batch of prompts, generated and scored (the overlong penalty added)."""
    return _draw(draw, timer)[1]


def one_batch_with_greedy_baseline(draw: Draw, timer: StageTimer) -> ScoredRollouts:
    """`one_batch` and ReMax's baseline for each response: the score of its
    prompt's greedy response (`greedy_baseline`)."""
    prompts, part = _draw(draw, timer)
    with timer("gen_max"):
        part.reward_baselines = greedy_baseline(draw, prompts).repeat_interleave(draw.sampling.n)
    return part


def _draw(draw: Draw, timer: StageTimer) -> tuple[PromptBatch, ScoredRollouts]:
    prompts = draw.loader.next_batch()
    with timer("gen"):
        rollouts = draw.engine.generate(prompts, draw.sampling)
    return prompts, score(draw, rollouts, timer)


def score(draw: Draw, rollouts: Rollouts, timer: StageTimer) -> ScoredRollouts:
    """`rollouts` decoded and scored (DAPO's overlong penalty added)."""
    give_up = (None if draw.breaker is None else
               functools.partial(draw.breaker.certain, responses=len(rollouts)))
    with timer("reward"):
        texts = decode_responses(rollouts, draw.tokenizer)
        scored = score_rollouts(draw.reward, rollouts, texts, give_up=give_up)
    raw_scores = scored.scores
    scored.scores = raw_scores + _penalty(draw.overlong, rollouts)
    if draw.overlong is not None and draw.overlong.log:
        # reported as reward/overlong_reward/mean and reward/overlong/mean
        for parts, p in zip(scored.parts, (scored.scores - raw_scores).tolist()):
            parts.update(overlong_reward=p, overlong=float(p < 0))
    return ScoredRollouts(rollouts, texts, scored, raw_scores, {})


def _penalty(overlong: OverlongPenalty | None, rollouts: Rollouts) -> Tensor:
    """[N] DAPO's overlong penalty, zeros when reward_model.overlong_buffer is off."""
    if overlong is None:
        return torch.zeros(len(rollouts))
    return overlong_penalty(rollouts.response_lengths, max_response_length=overlong.max_response_length,
                            buffer_len=overlong.buffer_len, penalty_factor=overlong.penalty_factor)


def greedy_baseline(draw: Draw, prompts: PromptBatch) -> Tensor:
    """ReMax's baseline: the score (with any overlong penalty) of one greedy response per prompt. [B]."""
    greedy = draw.engine.generate(prompts, dataclasses.replace(draw.sampling, n=1, do_sample=False))
    scored = score_rollouts(draw.reward, greedy, decode_responses(greedy, draw.tokenizer))
    return scored.scores + _penalty(draw.overlong, greedy)


def _select(part: ScoredRollouts, rows: Tensor) -> ScoredRollouts:
    rollouts, s, picks = part.rollouts.select(rows), part.scored, rows.tolist()
    scored = ScoreResult(s.scores[rows], s.errors, s.timeouts, [s.parts[i] for i in picks] if s.parts else [],
                         s.unscored)
    baselines = None if part.reward_baselines is None else part.reward_baselines[rows]
    return ScoredRollouts(rollouts, [part.texts[i] for i in picks], scored, part.raw_scores[rows],
                          dict(part.metrics), baselines)


def _concat_images(parts: list[Rollouts], width: int) -> ModelInputs | None:
    """The batches' images and M-RoPE prompt positions, re-padded like the prompts
    (a batch without images gets plain positions); None when no batch has images."""
    if all(r.model_inputs is None for r in parts):
        return None
    return ModelInputs.concat([
        (r.model_inputs or ModelInputs.text_only(r.prompt_mask)).left_padded(width) for r in parts])


def _concat(parts: list[ScoredRollouts], *, pad_token_id: int) -> ScoredRollouts:
    """One record of several generation batches: prompts re-padded on the left,
    responses on the right, group ids renumbered so groups of different batches differ."""
    width_p = max(p.rollouts.prompt_ids.shape[1] for p in parts)
    width_r = max(p.rollouts.response_ids.shape[1] for p in parts)
    fields: dict[str, list[Tensor]] = {k: [] for k in ("pi", "pm", "ri", "rm", "lp", "g", "ra")}
    offset = 0
    for p in parts:
        r = p.rollouts
        fields["pi"].append(_pad(r.prompt_ids, width_p, pad_token_id, left=True))
        fields["pm"].append(_pad(r.prompt_mask, width_p, 0, left=True))
        fields["ri"].append(_pad(r.response_ids, width_r, pad_token_id, left=False))
        fields["rm"].append(_pad(r.response_mask, width_r, 0, left=False))
        fields["lp"].append(_pad(r.rollout_logprobs, width_r, 0.0, left=False))
        fields["ra"].append(_pad(r.trajectory_mask, width_r, 0, left=False))
        _, index = torch.unique(r.group_ids, return_inverse=True)
        fields["g"].append(index + offset)
        offset += int(index.max().item()) + 1 if index.numel() else 0
    _, group_ids = torch.unique(torch.cat(fields["g"]), return_inverse=True)  # 0..B-1 again
    rollouts = Rollouts(torch.cat(fields["pi"]), torch.cat(fields["pm"]), torch.cat(fields["ri"]),
                        torch.cat(fields["rm"]), torch.cat(fields["lp"]),
                        [f for p in parts for f in p.rollouts.finish_reasons], group_ids,
                        [s for p in parts for s in p.rollouts.samples],
                        _concat_images([p.rollouts for p in parts], width_p),
                        (torch.cat(fields["ra"]) if any(p.rollouts.response_attention is not None
                                                        for p in parts) else None),
                        concat_turns([p.rollouts for p in parts]))
    scored = ScoreResult(torch.cat([p.scored.scores for p in parts]),
                         sum(p.scored.errors for p in parts), sum(p.scored.timeouts for p in parts),
                         [x for p in parts for x in p.scored.parts], sum(p.scored.unscored for p in parts))
    baselines = None if parts[0].reward_baselines is None else torch.cat([p.reward_baselines for p in parts])
    return ScoredRollouts(rollouts, [t for p in parts for t in p.texts], scored,
                          torch.cat([p.raw_scores for p in parts]), {}, baselines)


def _pad(t: Tensor, width: int, value: float, *, left: bool) -> Tensor:
    missing = width - t.shape[1]
    if missing == 0:
        return t
    fill = torch.full((t.shape[0], missing), value, dtype=t.dtype)
    return torch.cat([fill, t] if left else [t, fill], dim=1)
