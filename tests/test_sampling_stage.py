"""DAPO's dynamic sampling stage, driven by a fake engine, loader and reward.

Prompt i gets n=2 responses. Odd prompts are "mixed" (the first response
scores 1, the second 0); even prompts are "constant" (both score 1), so
every generation batch keeps only its odd prompts.
"""

from __future__ import annotations

import pytest
import torch

from thinkrl.config.schema import Config
from thinkrl.assets import generation_batch_size
from thinkrl.metrics import StageTimer
from thinkrl.records import PromptBatch, Rollouts, Sample
from thinkrl.rewards.scorer import ScoreResult
from thinkrl.rollout.base import SamplingParams
from thinkrl.stages.sampling import Draw, OverlongPenalty, build_sampler, filter_values

N_PER_PROMPT = 2


class FakeLoader:
    """Batches of `size` prompts numbered 0, 1, 2, ...; batch k has a prompt width of 2 + k."""

    def __init__(self, size: int) -> None:
        self.size, self.served = size, 0

    def next_batch(self) -> PromptBatch:
        start, width = self.served * self.size, 2 + self.served
        self.served += 1
        samples = [Sample("fake", "1", f"p{i}", index=i) for i in range(start, start + self.size)]
        ids = torch.full((self.size, width), 5)
        return PromptBatch(ids, torch.ones(self.size, width, dtype=torch.long), samples)


class FakeEngine:
    """Response j of a prompt is token 10 + j, repeated; batch k's responses are 2 + k tokens long."""

    def __init__(self) -> None:
        self.calls, self.params = 0, []

    def generate(self, prompts: PromptBatch, params) -> Rollouts:
        length = 2 + self.calls
        self.calls += 1
        self.params.append(params)
        b, g = len(prompts), params.n
        response = torch.tensor([[10 + j] * length for _ in range(b) for j in range(g)])
        return Rollouts(prompts.input_ids.repeat_interleave(g, 0), prompts.attention_mask.repeat_interleave(g, 0),
                        response, torch.ones_like(response), torch.zeros(b * g, length),
                        ["stop"] * (b * g), torch.arange(b).repeat_interleave(g),
                        [s for s in prompts.samples for _ in range(g)])


class FakeTokenizer:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return str(ids[0] - 10)  # the response's number j within its group


class FakeReward:
    def score(self, texts, samples, give_up=None) -> ScoreResult:
        scores = [1.0 if s.index % 2 == 0 else float(t == "0") for t, s in zip(texts, samples)]
        return ScoreResult(torch.tensor(scores), errors=0, timeouts=0, parts=[{} for _ in texts])


def _run(*, train: int, gen: int, max_batches: int = 0, overlong: bool = False) -> tuple[Config, Draw]:
    """A config of dynamic sampling on `acc` and the fakes it draws from."""
    cfg = Config()
    cfg.data.train_batch_size, cfg.data.gen_batch_size = train, gen
    cfg.algorithm.filter_groups.enable = True
    cfg.algorithm.filter_groups.metric = "acc"
    cfg.algorithm.filter_groups.max_num_gen_batches = max_batches
    draw = Draw(FakeEngine(), FakeLoader(generation_batch_size(cfg)), FakeReward(), FakeTokenizer(),
                SamplingParams(n=N_PER_PROMPT),
                overlong=OverlongPenalty(2, 1.0, max_response_length=4, log=True) if overlong else None)
    return cfg, draw


def test_constant_groups_are_dropped_and_more_batches_generated():
    # 4 prompts per generation batch, 2 of them mixed (1 and 3): 3 wanted -> a second batch
    # (prompts 4..7, mixed 5 and 7); the first 3 mixed prompts are kept: 1, 3, 5.
    cfg, draw = _run(train=3, gen=4)
    out = build_sampler(cfg, draw)(StageTimer())
    assert out.metrics == {"train/num_gen_batches": 2.0, "train/num_gen_prompts": 8.0,
                           "train/num_kept_prompts": 4.0}
    r = out.rollouts
    assert len(r) == 3 * N_PER_PROMPT  # train_batch_size groups
    assert [s.index for s in r.samples] == [1, 1, 3, 3, 5, 5]
    assert r.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.scored.scores.tolist() == [1.0, 0.0] * 3  # each kept group is mixed
    assert out.texts == ["0", "1"] * 3
    # Batches of different widths are re-padded: prompts on the left, responses on the right.
    assert r.prompt_ids.shape[1] == 3 and r.response_ids.shape[1] == 3
    assert r.prompt_mask[0].tolist() == [0, 1, 1] and r.prompt_mask[-1].tolist() == [1, 1, 1]
    assert r.response_mask[0].tolist() == [1, 1, 0] and r.response_mask[-1].tolist() == [1, 1, 1]
    assert r.response_ids[0].tolist() == [10, 10, 0]


def test_one_batch_is_enough_when_it_has_enough_mixed_groups():
    cfg, draw = _run(train=2, gen=4)
    out = build_sampler(cfg, draw)(StageTimer())
    assert out.metrics["train/num_gen_batches"] == 1.0
    assert [s.index for s in out.rollouts.samples] == [1, 1, 3, 3]


def test_too_few_mixed_groups_within_the_limit_is_an_error():
    cfg, draw = _run(train=3, gen=4, max_batches=1)
    with pytest.raises(RuntimeError, match="max_num_gen_batches"):
        build_sampler(cfg, draw)(StageTimer())
    assert draw.engine.calls == 1


def test_overlong_penalty_is_added_to_scores_but_acc_filters_on_the_raw_score():
    # Limit 4, buffer 2: batch 1 responses have 2 tokens (no penalty), batch 2 have 3 (-0.5).
    cfg, draw = _run(train=3, gen=4, overlong=True)
    out = build_sampler(cfg, draw)(StageTimer())
    assert out.scored.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 0.5, -0.5]
    assert out.raw_scores.tolist() == [1.0, 0.0] * 3
    assert [p["overlong"] for p in out.scored.parts] == [0.0] * 4 + [1.0] * 2
    # seq_reward would see the penalised scores.
    assert filter_values(out, "seq_reward").tolist() == out.scored.scores.tolist()


def test_unknown_metric_names_what_the_reward_reports():
    cfg, draw = _run(train=3, gen=4)
    cfg.algorithm.filter_groups.metric = "accuracy"
    with pytest.raises(ValueError, match="accuracy.*reports: none"):
        build_sampler(cfg, draw)(StageTimer())


def test_remax_scores_one_greedy_response_per_prompt_as_baseline():
    # Without dynamic sampling: one batch of 2 prompts (0 constant, 1 mixed), then a greedy
    # batch (n=1, no sampling) whose only response j=0 scores 1 for both prompts.
    cfg, draw = _run(train=2, gen=2)
    cfg.algorithm.filter_groups.enable = False
    cfg.algorithm.adv_estimator = "remax"
    timer = StageTimer()
    out = build_sampler(cfg, draw)(timer)
    greedy = draw.engine.params[1]
    assert (greedy.n, greedy.do_sample) == (1, False)
    assert out.reward_baselines.tolist() == [1.0] * 4  # one per response, repeated over its group
    assert "gen_max" in timer.seconds
