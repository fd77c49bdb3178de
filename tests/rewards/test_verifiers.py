"""MindSpeed-RL's rule verifiers (`format`, `strict_format`, `base_acc`, `acc`) on
hand-written responses, their weighted sum, and the config keys that choose them.
Expected scores are read off MindSpeed-RL's rule_verifier.py by hand."""

from __future__ import annotations

import pytest

from thinkrl.config import Config
from thinkrl.config.checks import validate
from thinkrl.config.verifier_checks import VERIFIER_NAMES
from thinkrl.rewards.reward_fn import RewardFnSpec, Task, score_one
from thinkrl.rewards.verifiers import (VERIFIERS, WeightedVerifiers, after_last_boxed,
                                       last_boxed_braced)

GOOD = "<think>2+2 is 4</think> <answer>The answer is \\boxed{4}</answer>"

# response, label, then the expected format, strict_format, base_acc, acc
CASES = [
    (GOOD, "4", 1.0, 1.0, 1.0, 1.0),
    (GOOD, "5", 1.0, 1.0, 0.0, -0.5),  # well formed, wrong: acc's -0.5
    ("<think>hmm</think><answer>4</answer>", "4", 1.0, -0.5, 0.0, -1.0),  # no box: -1
    ("Sure. <think>x</think><answer>\\boxed{4}</answer>", "4", 0.0, -0.5, 0.0, 1.0),  # text before
    # MULTILINE `$`: text on a later line after </answer> keeps format's 1 ...
    ("<think>x</think><answer>\\boxed{4}</answer>\nextra", "4", 1.0, -0.5, 0.0, 1.0),
    # ... on the same line it does not
    ("<think>x</think><answer>\\boxed{4}</answer> extra", "4", 0.0, -0.5, 0.0, 1.0),
    # two boxes: strict wants one; base_acc and acc read the last
    ("<think>\\boxed{3}</think><answer>\\boxed{4}</answer>", "4", 1.0, -0.5, 1.0, 1.0),
    ("<think>x</think><answer>\\boxed{}</answer>", "4", 1.0, 1.0, 0.0, -1.0),  # empty box: -1
    ("<think>x</think><answer>\\boxed{4}</answer><|im_end|>\\boxed{5}", "4", 0.0, -0.5, 0.0, 1.0),
    ("<answer>\\boxed{4}</answer><think>x</think>", "4", 0.0, -0.5, 0.0, 1.0),  # wrong order
    ("<think>a<think>b</think><answer>\\boxed{4}</answer>", "4", 1.0, -0.5, 1.0, 1.0),  # 2 <think>
    ("", "4", 0.0, -0.5, 0.0, -1.0),
]


@pytest.mark.parametrize("response, label, form, strict, base, acc", CASES)
def test_each_verifier_scores_as_mindspeed_rl(response, label, form, strict, base, acc):
    scores = {name: VERIFIERS[name](response, label) for name in VERIFIER_NAMES}
    assert scores == {"format": form, "strict_format": strict, "base_acc": base, "acc": acc}


def test_the_reward_is_the_weighted_sum_with_parts():
    reward = WeightedVerifiers(("base_acc", "strict_format"), (1.0, 0.5))
    # no box: base_acc 0, strict_format -0.5 -> 1.0 * 0 + 0.5 * -0.5 = -0.25
    assert reward("orz/math", "<think>hmm</think><answer>4</answer>", "4") == {
        "score": -0.25, "base_acc": 0.0, "strict_format": -0.5}
    assert reward("orz/math", GOOD, "4") == {"score": 1.5, "base_acc": 1.0, "strict_format": 1.0}
    acc_twice = WeightedVerifiers(("acc", "acc"), (1.0, 2.0))  # MindSpeed-RL adds each entry
    assert acc_twice("x", GOOD, "5")["score"] == -0.5 * 3


def test_graders_math_verify_accepts_what_mathruler_refuses():
    # mathruler's grade_answer (MindSpeed-RL's base_acc) says 0 for these three,
    # by its rules: unreduced fractions must match as written; an integer label
    # needs an integer-looking answer; tuples and sets compare element by element.
    # math-verify compares values, so thinkrl scores them 1 (docs/mindspeed_rl.md).
    base_acc = VERIFIERS["base_acc"]
    for box, label in [("\\frac{2}{4}", "\\frac{1}{2}"), ("\\sqrt{4}", "2"),
                       ("\\{2,1\\}", "\\{1,2\\}")]:
        assert base_acc(f"<think>x</think><answer>\\boxed{{{box}}}</answer>", label) == 1.0
    # where both say the same: a wrong value, an ordered pair in another order
    assert base_acc("<think>x</think><answer>\\boxed{\\pi}</answer>", "3.14159") == 0.0
    assert base_acc("<think>x</think><answer>\\boxed{(2,1)}</answer>", "(1,2)") == 0.0
    assert base_acc("<think>x</think><answer>\\boxed{0.5}</answer>", "\\frac{1}{2}") == 1.0


def test_box_readers():
    assert last_boxed_braced("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed_braced("\\boxed{ 4 }") == "4"  # stripped, as mathruler does
    assert last_boxed_braced("\\boxed{4") is None and last_boxed_braced("4") is None
    assert after_last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert after_last_boxed("so \\boxed 5$ done") == "5"
    assert after_last_boxed("\\boxed{x\n   + 1.}") == "x+ 1"  # newline+indent gone, one '.' dropped


def test_config_keys_build_the_verifier_reward():
    cfg = Config()
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.reward.verifiers, cfg.reward.verifier_weights = ["base_acc"], [1.0]
    validate(cfg)
    spec = RewardFnSpec.from_config(cfg)
    spec.check_sources(["any/source"])  # the verifiers take every row
    outcome = score_one(spec.build(), Task(0, GOOD, "any/source", "4", None, 0))
    assert (outcome.score, outcome.parts, outcome.error) == (1.0, {"base_acc": 1.0}, None)


@pytest.mark.parametrize("names, weights, message", [
    (["base_ac"], [1.0], "unknown verifier 'base_ac'; did you mean base_acc"),
    (["step"], [1.0], "'step' \\(a MindSpeed-RL verifier thinkrl does not implement"),
    (["acc", "format"], [1.0], "2 name\\(s\\) but reward.verifier_weights has 1 weight"),
])
def test_bad_verifier_keys_are_refused(names, weights, message):
    cfg = Config()
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.reward.verifiers, cfg.reward.verifier_weights = names, weights
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_verifiers_and_a_forced_scorer_conflict():
    cfg = Config()
    cfg.actor_rollout_ref.rollout.n = 2
    cfg.reward.verifiers, cfg.reward.verifier_weights, cfg.reward.scorer = ["acc"], [1.0], "r1"
    with pytest.raises(ValueError, match="verifiers score every row; remove one"):
        validate(cfg)


def test_names_in_the_config_checks_match_the_functions():
    assert VERIFIER_NAMES == tuple(VERIFIERS)
