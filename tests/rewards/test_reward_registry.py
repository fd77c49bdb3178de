"""Routing rows to scorers: the data_source table, a forced reward.scorer,
settings (format_score), and the config checks of the reward.* keys."""

import pytest

from thinkrl.config import Config
from thinkrl.config.checks import validate
from thinkrl.rewards.registry import (DATA_SOURCES, SCORER_NAMES, ScorerSettings, make_scorer,
                                      scorer_name_for)
from thinkrl.rewards.reward_fn import RewardFnSpec


def test_verl_data_sources_are_routed():
    assert scorer_name_for("openai/gsm8k") == "gsm8k"
    assert scorer_name_for("thinkrl/arith") == "gsm8k"
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                   "orz/math", "orz/aime2024", "orz/gpqa_diamond", "aime2025", "numina_cn_k12"):
        assert scorer_name_for(source) == "math"
    assert set(DATA_SOURCES.values()) <= set(SCORER_NAMES)


def test_multiple_choice_letters_score_with_math():
    # orz/gpqa_diamond's ground truths are letters A-D
    scorer = make_scorer("math")
    assert [scorer(r, "A", None) for r in ("\\boxed{A}", "\\boxed{(A)}", "<answer>A</answer>",
                                           "\\boxed{B}")] == [1.0, 1.0, 1.0, 0.0]


def test_format_score_is_configurable():
    settings = ScorerSettings(format_score=0.1)
    assert make_scorer("gsm8k", settings)("#### 5", "4", None) == 0.1
    assert make_scorer("gsm8k", settings)("no answer", "4", None) == 0.0
    assert make_scorer("math", settings)("\\boxed{5}", "4", None) == 0.1
    assert make_scorer("math")("\\boxed{5}", "4", None) == 0.0


def test_a_forced_scorer_takes_every_row():
    function = RewardFnSpec(scorer="math").build()
    # an unknown data source is fine: reward.scorer decides
    assert function(data_source="my/data", solution_str="\\boxed{0.5}", ground_truth="\\frac12") == 1.0
    RewardFnSpec(scorer="r1").check_sources(["my/data"])
    r1 = RewardFnSpec(scorer="r1").build()
    assert r1(data_source="openai/gsm8k", solution_str="<think>a</think><answer>4</answer>",
              ground_truth="4")["score"] == 1.5
    with pytest.raises(ValueError, match="reward.scorer=nope"):
        RewardFnSpec(scorer="nope").build()


def test_check_sources_names_every_unknown_one():
    spec = RewardFnSpec()
    spec.check_sources(["openai/gsm8k", "lighteval/MATH", "aime2024"])
    with pytest.raises(ValueError) as err:
        spec.check_sources(["openai/gsm8k", "b/unknown", "a/unknown"])
    message = str(err.value)
    assert "'a/unknown', 'b/unknown'" in message
    assert "reward.scorer=" in message and "custom_reward_function.path" in message



@pytest.mark.parametrize("key, value, fix", [
    ("scorer", "mathh", "use one of: auto, gsm8k, math, r1"),
    ("timeout_s", 0.0, "seconds per response > 0"),
    ("num_workers", -1, "use 0"),
    ("zero_reward_warn_steps", -2, "step count >= 0"),
    ("format_score", float("nan"), "finite score"),
])
def test_validate_rejects_bad_reward_keys(key, value, fix):
    cfg = Config()
    setattr(cfg.reward, key, value)
    with pytest.raises(ValueError) as err:
        validate(cfg)
    assert f"reward.{key}=" in str(err.value) and fix in str(err.value)


def test_validate_rejects_a_custom_function_with_a_forced_scorer():
    cfg = Config()
    cfg.custom_reward_function.path = "my_reward.py"
    cfg.reward.scorer = "math"
    with pytest.raises(ValueError, match="remove one of them"):
        validate(cfg)
    cfg.reward.scorer = "auto"
    cfg.actor_rollout_ref.rollout.n = 4  # Config()'s n=1 is a problem of its own for GRPO
    validate(cfg)


def test_exact_scorer_compares_the_stripped_texts():
    from thinkrl.rewards.registry import make_scorer

    exact = make_scorer("exact")
    assert exact("  Paris\n", "Paris") == 1.0
    assert exact("paris", "Paris") == 0.0  # case-sensitive
    assert exact("The answer is Paris", "Paris") == 0.0  # no extraction
    assert exact("42", 42) == 1.0  # a numeric ground truth compares as its text
