"""Scoring in worker processes: a raising, hanging or crashing scorer costs
only its own sample (counted), the others keep their scores, and the pool
gives exactly the inline scores."""

import logging
import textwrap

import pytest

from thinkrl.records import Sample
from thinkrl.rewards.reward_fn import RewardFnSpec
from thinkrl.rewards.scorer import RewardScorer

BEHAVIOURS = '''
import os
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "raise":
        raise RuntimeError("user bug")
    if solution_str == "sleep":
        time.sleep(1e9)
    if solution_str == "spin":
        while True:
            pass
    if solution_str == "exit":
        os._exit(3)
    return float(solution_str == ground_truth)
'''
TIMEOUT_S = 1.5  # generous: a busy 2-core CI machine must not time out a trivial score


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "behaviours.py"
    path.write_text(textwrap.dedent(BEHAVIOURS))
    with RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=2, timeout_s=TIMEOUT_S) as scorer:
        yield scorer


def _samples(n, source="my/data", truth="4"):
    return [Sample(data_source=source, ground_truth=truth, prompt_text="q", index=100 + i)
            for i in range(n)]


def test_failures_cost_only_their_own_sample(pooled, caplog):
    texts = ["4", "raise", "sleep", "4", "5", "spin", "exit", "4"] + ["4", "3"] * 10
    with caplog.at_level(logging.WARNING, logger="thinkrl.rewards.scorer"):
        result = pooled.score(texts, _samples(len(texts)))
    assert result.scores.tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0] + [1.0, 0.0] * 10
    assert result.timeouts == 2  # sleep and spin: stopped, their workers replaced
    assert result.errors == 2  # raise, and the worker that exited
    assert pooled.pool.restarts >= 3
    messages = " | ".join(r.getMessage() for r in caplog.records)
    assert "row 102" in messages and f"reward.timeout_s={TIMEOUT_S:g} s" in messages and "'sleep'" in messages
    assert "row 101" in messages and "RuntimeError: user bug" in messages
    assert "WorkerDied" in messages
    # the pool still works at full size on the next step
    again = pooled.score(["4", "5", "4"], _samples(3))
    assert again.scores.tolist() == [1.0, 0.0, 1.0] and (again.errors, again.timeouts) == (0, 0)


def test_an_empty_batch(pooled):
    result = pooled.score([], [])
    assert result.scores.shape == (0,) and (result.errors, result.timeouts) == (0, 0)


def test_pool_and_inline_give_identical_scores():
    samples, texts = [], []
    for i in range(12):
        samples.append(Sample(data_source="openai/gsm8k", ground_truth="72", prompt_text="q", index=i))
        texts.append(f"so #### {70 + i % 4}")
        samples.append(Sample(data_source="HuggingFaceH4/MATH-500", ground_truth="\\frac{1}{2}",
                              prompt_text="q", index=i))
        texts.append(["\\boxed{0.5}", "\\boxed{\\dfrac{2}{4}}", "\\boxed{1/3}", "no box"][i % 4])
    spec = RewardFnSpec(scorer="auto")
    with RewardScorer(spec, num_workers=0) as inline, \
            RewardScorer(spec, num_workers=2, timeout_s=30) as pooled:
        expected = inline.score(texts, samples)
        got = pooled.score(texts, samples)
    assert got.scores.tolist() == expected.scores.tolist()
    assert sum(expected.scores.tolist()) == 3 + 6  # gsm8k: 72 in 3 of 12; math: 2 of 4 forms
    r1 = RewardFnSpec(scorer="r1")
    with RewardScorer(r1, num_workers=0) as inline, RewardScorer(r1, num_workers=1, timeout_s=30) as pooled:
        r1_texts = ["<think>a</think><answer>0.5</answer>", "<answer>0.5</answer>"]
        assert pooled.score(r1_texts, samples[1:4:2]).parts == inline.score(r1_texts, samples[1:4:2]).parts


def test_a_builtin_scorer_that_hangs_is_stopped():
    # sympy evaluates 9^(9^(9^9)) for as long as it is allowed to: the math
    # scorer's own guards (length, brace depth) do not catch it, the pool does.
    samples = _samples(2, source="HuggingFaceH4/MATH-500", truth="1")
    with RewardScorer(RewardFnSpec(), num_workers=1, timeout_s=TIMEOUT_S) as scorer:
        result = scorer.score(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{1}"], samples)
    assert result.scores.tolist() == [0.0, 1.0] and result.timeouts == 1
