"""The start-up trial of a custom reward function: a row per data source,
its gold answer in every format rewards read; only a function that fails on
all of them stops the run."""

from __future__ import annotations

import textwrap

import pytest

from thinkrl.records import Sample
from thinkrl.rewards.gold_answers import gold_responses
from thinkrl.rewards.reward_fn import RewardFnSpec
from thinkrl.rewards.scorer import RewardScorer

ROWS = [Sample("openai/gsm8k", "72", "Q", extra_info={"split": "train"}, index=3),
        Sample("lighteval/MATH", "1/2", "Q", index=9)]


def scorer(tmp_path, body: str, *, workers: int) -> RewardScorer:
    path = tmp_path / "my_reward.py"
    path.write_text("import re\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    + textwrap.indent(textwrap.dedent(body), "    "))
    return RewardScorer(RewardFnSpec(custom_path=str(path)), num_workers=workers, timeout_s=5)


@pytest.mark.parametrize("workers", [0, 1])
def test_a_function_that_needs_a_format_passes(tmp_path, workers):
    body = "return float(re.search(r'#### (\\S+)', solution_str).group(1) == ground_truth)\n"
    with scorer(tmp_path, body, workers=workers) as reward:
        reward.trial(ROWS, gold_responses)  # AttributeError on the plain answer, 1.0 on "#### 72"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_function_that_fails_whatever_the_response_is_named_with_its_row(tmp_path, workers):
    with scorer(tmp_path, "return float(extra_info['units'] in solution_str)\n", workers=workers) as reward:
        with pytest.raises(ValueError) as err:
            reward.trial(ROWS, gold_responses)
    message = str(err.value)
    assert "my_reward.py (compute_score) failed on every response of the start-up trial" in message
    assert "data_source openai/gsm8k, row 3, its gold answer written 5 ways" in message
    assert "KeyError: 'units'" in message and "reward.startup_trial=false" in message


def test_a_built_in_scorer_is_not_tried(tmp_path):
    with RewardScorer(RewardFnSpec(), num_workers=0) as reward:
        reward.trial(ROWS, lambda sample: pytest.fail("a built-in scorer was called"))
