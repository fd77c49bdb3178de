"""The reward on the data's own answers: the best of the gold answer's
formats against a wrong answer, row by row."""

from __future__ import annotations

from thinkrl.records import Sample
from thinkrl.rehearse.gold import WRONG_ANSWER, gold_responses, score_gold, wrong_responses
from thinkrl.rewards.scorer import RewardScorer


def _samples(source: str, answers: list[str], **extra) -> list[Sample]:
    return [Sample(data_source=source, ground_truth=a, prompt_text="q", extra_info=dict(extra), index=i)
            for i, a in enumerate(answers)]


def test_gsm8k_and_math_score_their_gold_answers_above_a_wrong_one():
    for source in ("openai/gsm8k", "HuggingFaceH4/MATH-500"):
        samples = _samples(source, ["72", "18"])
        with _builtin() as reward:
            gold = score_gold(reward, samples, ["a, row 0", "a, row 1"])
        assert gold.best == [1.0, 1.0] and gold.wrong == [0.0, 0.0], source
        assert gold.unrewarded == [] and gold.errors == 0


def _builtin() -> RewardScorer:
    from thinkrl.rewards.reward_fn import RewardFnSpec

    return RewardScorer(RewardFnSpec(), num_workers=0)


def test_a_reward_reading_the_wrong_field_rewards_no_gold_answer():
    def reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return float(solution_str.strip() == str((extra_info or {}).get("solution")))  # not there

    with RewardScorer.from_function(reward) as scorer:
        gold = score_gold(scorer, _samples("me/task", ["3", "4"]), ["f, row 0", "f, row 1"])
    assert gold.unrewarded == [0, 1] and gold.best == [0.0, 0.0]


def test_a_reward_that_raises_is_counted_with_its_first_row():
    def reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        if ground_truth == "4":
            raise KeyError("units")
        return float(ground_truth in solution_str)

    with RewardScorer.from_function(reward) as scorer:
        gold = score_gold(scorer, _samples("me/task", ["3", "4"]), ["f, row 0", "f, row 1"])
    [four] = _samples("me/task", ["4"])
    assert gold.errors == len(gold_responses(four)) + len(wrong_responses(four))
    assert "row 1" in gold.first_error and "KeyError" in gold.first_error


def test_gold_formats_include_the_worked_solution():
    [sample] = _samples("openai/gsm8k", ["72"], answer="48 + 24 = 72\n#### 72")
    written = gold_responses(sample)
    assert "#### 72" in written and "48 + 24 = 72\n#### 72" in written
    assert WRONG_ANSWER not in written


def test_a_reward_paying_the_format_alone_does_not_reward_the_gold_answer():
    # the R1 format scores 1 whatever the answer: the gold answer must beat a
    # wrong one written in the same format, not an unformatted one
    def reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return 1.0 if "<answer>" in solution_str else -1.0

    with RewardScorer.from_function(reward) as scorer:
        gold = score_gold(scorer, _samples("me/task", ["12", "x"]), ["f, row 0", "f, row 1"])
    assert gold.best == [1.0, 1.0] and gold.wrong == [1.0, 1.0] and gold.unrewarded == [0, 1]
    assert "<answer>\\boxed{13}</answer>" in wrong_responses(_samples("t", ["12"])[0])[4]


def test_the_format_the_reward_needs_is_checked_against_the_prompt():
    def reward(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
        return float(f"#### {ground_truth}" in solution_str)

    asked = Sample(data_source="t", ground_truth="5", prompt_text='answer after "####"')
    silent = Sample(data_source="t", ground_truth="5", prompt_text="What is 2 + 3?")
    with RewardScorer.from_function(reward) as scorer:
        gold = score_gold(scorer, [asked, silent], ["f, row 0", "f, row 1"])
    assert gold.unasked == [(), ("####",)]
