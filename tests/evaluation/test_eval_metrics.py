"""Validation metrics on a fake engine whose responses and scores are known:
grouping of samples by prompt across batches, n > 1, clip ratio, names."""

import pytest
import torch

from thinkrl.data.dataset import Prompt
from thinkrl.evaluation import EvalResult, evaluate, summarize
from thinkrl.generations import Generation
from thinkrl.records import FINISH_LENGTH, FINISH_STOP, PromptBatch, Rollouts, Sample
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rollout.base import SamplingParams

PAD, EOS = 0, 1


class DigitTokenizer:
    """Token id t >= 2 decodes to the digit t - 2."""
    pad_token_id = PAD

    def decode(self, ids, skip_special_tokens=True):
        return "".join(str(i - 2) for i in ids if i >= 2)


class ScriptedEngine:
    """Response j of a prompt is the digit ANSWERS[prompt row index][j], then
    EOS; a row listed in CLIPPED never writes EOS (it hits max_tokens)."""

    def __init__(self, answers: dict[int, list[int]], clipped: set[tuple[int, int]]):
        self.answers, self.clipped, self.calls = answers, clipped, []

    def generate(self, prompts: PromptBatch, params: SamplingParams) -> Rollouts:
        self.calls.append(len(prompts))
        g, rows, reasons, samples, groups = params.n, [], [], [], []
        for b, sample in enumerate(prompts.samples):
            for j in range(g):
                digit = self.answers[sample.index][j]
                clipped = (sample.index, j) in self.clipped
                rows.append([digit + 2, digit + 2, digit + 2] if clipped else [digit + 2, EOS, PAD])
                reasons.append(FINISH_LENGTH if clipped else FINISH_STOP)
                samples.append(sample)
                groups.append(b)
        response_ids = torch.tensor(rows)
        mask = torch.tensor([[1, 1, 1] if r == FINISH_LENGTH else [1, 1, 0] for r in reasons])
        prompt_ids = prompts.input_ids.repeat_interleave(g, 0)
        return Rollouts(prompt_ids=prompt_ids, prompt_mask=torch.ones_like(prompt_ids),
                        response_ids=response_ids, response_mask=mask,
                        rollout_logprobs=torch.zeros(mask.shape), finish_reasons=reasons,
                        group_ids=torch.tensor(groups), samples=samples)


def exact_match(response, ground_truth, extra_info=None):
    return 1.0 if response == ground_truth else 0.1  # 0.1: a format score, never "correct"


def prompts() -> list[Prompt]:
    # rows 0, 1 from source "a" (answer 7), rows 2 from source "b" (answer 3)
    spec = [("a", "7"), ("a", "7"), ("b", "3")]
    return [Prompt(ids=[5, 6], sample=Sample(data_source=ds, ground_truth=gt,
                                             prompt_text=f"q{i}", index=i))
            for i, (ds, gt) in enumerate(spec)]


def _reward(scorer) -> RewardScorer:
    """One scorer for every data source, in this process."""
    return RewardScorer.from_function(
        lambda data_source, solution_str, ground_truth, extra_info=None, **kw:
        scorer(solution_str, ground_truth, extra_info))


def run(answers, clipped=frozenset(), *, n, batch_size):
    engine = ScriptedEngine(answers, set(clipped))
    sampling = SamplingParams(n=n, max_tokens=3, temperature=1.0, do_sample=True)
    result = evaluate(engine, prompts(), tokenizer=DigitTokenizer(), sampling=sampling,
                      reward=_reward(exact_match), batch_size=batch_size)
    return result, engine


def test_n4_metrics_by_hand():
    # a: prompt 0 right 2 of 4, prompt 1 right 0 of 4; b: prompt 2 right 3 of 4.
    answers = {0: [7, 1, 7, 2], 1: [0, 0, 0, 0], 2: [3, 3, 9, 3]}
    result, engine = run(answers, clipped={(1, 0), (2, 2)}, n=4, batch_size=2)
    assert engine.calls == [2, 1]  # two batches: prompt numbering must continue across them
    m = result.metrics()
    # a: 2 scores of 1.0 and 6 of 0.1 -> (2 + 0.6) / 8
    assert m["val-core/a/reward/mean@4"] == pytest.approx(2.6 / 8)
    assert m["val-core/a/acc/mean@4"] == pytest.approx(2 / 8)
    # pass@1 = mean of c/n; pass@2: prompt 0 -> 1 - C(2,2)/C(4,2) = 5/6, prompt 1 -> 0
    assert m["val-aux/a/reward/pass@1"] == pytest.approx(0.25)
    assert m["val-aux/a/reward/pass@2"] == pytest.approx(5 / 12)
    assert m["val-aux/a/reward/pass@4"] == pytest.approx(0.5)
    # best@2: prompt 0 -> 5/6 * 1 + 1/6 * 0.1; prompt 1 -> 0.1
    assert m["val-aux/a/reward/best@2/mean"] == pytest.approx((5 / 6 + 0.1 / 6 + 0.1) / 2)
    assert m["val-core/b/acc/mean@4"] == pytest.approx(0.75)
    assert m["val-aux/b/reward/pass@2"] == pytest.approx(1.0)  # n - c = 1 < 2
    # lengths: a stop response is digit + EOS = 2 tokens, a clipped one 3
    assert m["val-aux/a/response_length/mean"] == pytest.approx((7 * 2 + 3) / 8)
    assert m["val-aux/a/response_length/clip_ratio"] == pytest.approx(1 / 8)
    assert m["val-aux/b/response_length/clip_ratio"] == pytest.approx(1 / 4)
    assert m["val-aux/reward/errors"] == 0.0
    assert m["timing_s/testing"] >= 0.0
    assert "val-aux/a/reward/best@1/mean" not in m  # best@1 is mean@n


def test_batch_size_does_not_change_metrics():
    answers = {0: [7, 1], 1: [7, 7], 2: [0, 3]}
    one, _ = run(answers, n=2, batch_size=1)
    all_at_once, _ = run(answers, n=2, batch_size=3)
    drop_time = lambda m: {k: v for k, v in m.items() if not k.startswith("timing_s/")}
    assert drop_time(one.metrics()) == drop_time(all_at_once.metrics())
    assert [g.prompt_index for g in one.generations] == [0, 0, 1, 1, 2, 2]


def test_greedy_n1_has_core_metrics_and_no_pass_at_k():
    result, _ = run({0: [7], 1: [2], 2: [3]}, n=1, batch_size=8)
    m = result.metrics()
    assert m["val-core/a/reward/mean@1"] == pytest.approx(1.1 / 2)
    assert m["val-core/a/acc/mean@1"] == pytest.approx(0.5)
    assert m["val-core/b/acc/mean@1"] == pytest.approx(1.0)
    assert not any("pass@" in k or "best@" in k for k in m)


def test_generations_carry_the_row_and_text():
    result, _ = run({0: [7, 1], 1: [7, 7], 2: [0, 3]}, n=2, batch_size=2)
    g = result.generations[5]
    assert (g.data_source, g.prompt, g.response, g.ground_truth, g.score, g.row) == \
        ("b", "q2", "3", "3", 1.0, 2)
    assert (g.finish_reason, g.response_length, g.prompt_index) == (FINISH_STOP, 2, 2)


def test_scorer_errors_score_zero_and_are_counted():
    def flaky(response, ground_truth, extra_info=None):
        if response == "1":
            raise RuntimeError("boom")
        return exact_match(response, ground_truth)
    engine = ScriptedEngine({0: [7, 1], 1: [1, 1], 2: [3, 3]}, set())
    result = evaluate(engine, prompts(), tokenizer=DigitTokenizer(),
                      sampling=SamplingParams(n=2, max_tokens=3), reward=_reward(flaky),
                      batch_size=3)
    m = result.metrics()
    assert m["val-aux/reward/errors"] == 3.0
    assert m["val-core/a/reward/mean@2"] == pytest.approx(1.0 / 4)


def test_summarize_refuses_a_prompt_with_missing_samples():
    g = Generation(data_source="a", prompt="q", response="r", ground_truth="r", score=1.0,
                   response_length=1, finish_reason=FINISH_STOP, prompt_index=0, row=0)
    with pytest.raises(AssertionError, match="1 responses, not 2"):
        summarize([g], n=2)
    assert EvalResult([g, g], n=2, seconds=0.0).summaries[0].pass_at == {1: 1.0, 2: 1.0}


def test_accuracy_comes_from_the_scorers_accuracy_part():
    """r1 with its format weight >= 1 gives a well-formatted wrong answer a
    score of 1; it must not count as correct. A right answer with a low
    accuracy weight still does."""
    def gen(score, accuracy, index):
        return Generation(data_source="r1", prompt="q", response="r", ground_truth="7",
                          score=score, response_length=1, finish_reason=FINISH_STOP,
                          prompt_index=index, row=index, accuracy=accuracy)
    wrong_but_formatted, right_low_weight = gen(1.0, 0.0, 0), gen(0.5, 1.0, 1)
    (summary,) = summarize([wrong_but_formatted, right_low_weight], n=1)
    assert summary.accuracy == 0.5 and summary.mean_score == 0.75
    assert EvalResult([gen(1.0, 0.0, 0)], n=1, seconds=0.0).metrics()["val-core/r1/acc/mean@1"] == 0.0
