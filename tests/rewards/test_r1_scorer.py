"""R1-Zero reward: format (one think block, then one answer block, nothing
else) and accuracy (the answer checked with math-verify), weighted."""

import pytest

from thinkrl.rewards import r1
from thinkrl.rewards.registry import ScorerSettings, make_scorer


@pytest.mark.parametrize("response, formatted", [
    ("<think>2+2=4</think><answer>4</answer>", True),
    ("  <think>\nhmm\n</think>\n\n<answer> 4 </answer>\n", True),  # whitespace around and between
    ("<think></think><answer></answer>", True),  # empty blocks still have the format
    ("<think>a</think>b<answer>4</answer>", False),  # text between
    ("Sure! <think>a</think><answer>4</answer>", False),  # text before
    ("<think>a</think><answer>4</answer> done", False),  # text after
    ("<answer>4</answer><think>a</think>", False),  # wrong order
    ("<think>a</think>", False),
    ("<answer>4</answer>", False),
    ("<think>a<think>b</think><answer>4</answer>", False),  # two opening think tags
    ("<think>a</think><answer>4</answer><answer>5</answer>", False),  # two answers
    ("<think>a</answer></think><answer>4</answer>", False),  # a closing tag out of place
    ("<think>a</think><answer>4", False),  # cut off
    ("", False),
])
def test_format(response, formatted):
    assert r1.has_r1_format(response) is formatted


@pytest.mark.parametrize("response, truth, expected", [
    # (format 0.5) + (accuracy 1.0), by hand
    ("<think>x</think><answer>4</answer>", "4", (1.5, 1.0, 1.0)),
    ("<think>x</think><answer>\\boxed{\\frac12}</answer>", "0.5", (1.5, 1.0, 1.0)),  # box inside
    ("<think>x</think><answer>The answer is \\boxed{4}.</answer>", "4", (1.5, 1.0, 1.0)),
    ("<think>x</think><answer>5</answer>", "4", (0.5, 1.0, 0.0)),  # formatted, wrong
    ("I think 4. <answer>4</answer>", "4", (1.0, 0.0, 1.0)),  # right, not formatted
    ("\\boxed{4}", "4", (0.0, 0.0, 0.0)),  # no answer tag: accuracy reads only <answer>
    ("<think>\\boxed{4}</think><answer>5</answer>", "4", (0.5, 1.0, 0.0)),
    ("", "4", (0.0, 0.0, 0.0)),
])
def test_score_parts(response, truth, expected):
    parts = r1.score_parts(response, truth)
    assert (parts.score, parts.format, parts.accuracy) == expected
    assert r1.compute_score(response, truth) == {"score": expected[0], "format": expected[1],
                                                 "accuracy": expected[2]}


def test_weights_come_from_the_settings():
    scorer = make_scorer("r1", ScorerSettings(r1_format_weight=0.2, r1_accuracy_weight=2.0))
    assert scorer("<think>x</think><answer>4</answer>", "4", None)["score"] == pytest.approx(2.2)
    assert scorer("<think>x</think><answer>3</answer>", "4", None)["score"] == pytest.approx(0.2)


def test_huge_and_unicode_responses():
    long_think = "<think>" + "x" * 1_000_000 + "</think><answer>5</answer>"
    assert r1.compute_score(long_think, "5")["score"] == 1.5
    assert r1.compute_score("<think><answer>" * 100_000, "5")["score"] == 0.0
    assert r1.compute_score("<think>Думаю… 🤔</think><answer>４</answer>", "4")["accuracy"] == 0.0
    assert r1.compute_score("<think>Думаю… 🤔</think><answer>4</answer>", "4")["score"] == 1.5
