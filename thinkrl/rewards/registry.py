"""From a row's `data_source` to the function that scores its responses.

Scorers are pure: `(response, ground_truth, extra_info) -> float`, or a dict
with a "score" key and named parts (r1 gives `format` and `accuracy`). The
table is checked against the data before the first step, so a data source
without a scorer stops the run at start instead of silently scoring 0.

To route a new data source to a built-in scorer, add it to `DATA_SOURCES`
(exact names) or `DATA_SOURCE_PREFIXES` (every name that starts with it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from thinkrl.errors import UserError
import thinkrl.rewards.exact as exact
import thinkrl.rewards.geo3k as geo3k
import thinkrl.rewards.gsm8k as gsm8k
import thinkrl.rewards.math as math_answer
import thinkrl.rewards.r1 as r1
import thinkrl.rewards.reasoning_gym as reasoning_gym
from thinkrl.config.schema import RewardConfig

Scorer = Callable[[str, str, dict | None], "float | dict[str, float]"]

# data_source -> scorer name. verl's default_compute_score routes the same
# names to its gsm8k and math scorers (math_dapo, numina_* and aime* to its
# other math checkers; here all math goes through math-verify).
DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "thinkrl/arith": "gsm8k",
    "thinkrl/calc": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math",
    "numina_aops_forum": "math",
    "numina_synthetic_math": "math",
    "numina_amc_aime": "math",
    "numina_synthetic_amc": "math",
    "numina_cn_k12": "math",
    "numina_olympiads": "math",
    "orz/math": "math",
    "hiyouga/geometry3k": "geo3k",
}
# prefix -> scorer name, for families of names (verl: `aime2024`, `aime2025`, ...;
# `thinkrl prep orz` names eval files `orz/<file stem>`: orz/aime2024,
# orz/math500, orz/gpqa_diamond, whose letter answers A-D math-verify matches too).
DATA_SOURCE_PREFIXES: dict[str, str] = {
    "aime": "math",
    "orz/": "math",
    reasoning_gym.DATA_SOURCE_PREFIX: "reasoning_gym",  # thinkrl prep reasoning-gym
}


@dataclass(frozen=True, slots=True)
class ScorerSettings:
    """The knobs of the built-in scorers (the `reward.*` config keys)."""

    # The defaults are the config's (thinkrl.config.schema.RewardConfig), not copies.
    format_score: float = RewardConfig.format_score
    """gsm8k and math: score of a well-formed but wrong answer."""
    r1_format_weight: float = RewardConfig.r1_format_weight
    r1_accuracy_weight: float = RewardConfig.r1_accuracy_weight


def _gsm8k(response: str, ground_truth: str, extra_info: dict | None = None, *,
           settings: ScorerSettings) -> float:
    return gsm8k.compute_score(response, ground_truth, format_score=settings.format_score)


def _math(response: str, ground_truth: str, extra_info: dict | None = None, *,
          settings: ScorerSettings) -> float:
    return math_answer.compute_score(response, ground_truth, format_score=settings.format_score)


def _r1(response: str, ground_truth: str, extra_info: dict | None = None, *,
        settings: ScorerSettings) -> dict[str, float]:
    return r1.compute_score(response, ground_truth, format_weight=settings.r1_format_weight,
                            accuracy_weight=settings.r1_accuracy_weight)


def _exact(response: str, ground_truth: str, extra_info: dict | None = None, *,
           settings: ScorerSettings) -> float:
    return exact.compute_score(response, ground_truth)


def _geo3k(response: str, ground_truth: str, extra_info: dict | None = None, *,
           settings: ScorerSettings) -> dict[str, float]:
    return geo3k.compute_score(response, ground_truth)


def _reasoning_gym(response: str, ground_truth: str, extra_info: dict | None = None, *,
                   settings: ScorerSettings) -> dict[str, float]:
    return reasoning_gym.compute_score(response, ground_truth, extra_info)


_BUILTIN = {"gsm8k": _gsm8k, "math": _math, "r1": _r1, "exact": _exact, "geo3k": _geo3k,
            "reasoning_gym": _reasoning_gym}
SCORER_NAMES = tuple(_BUILTIN)
"""The built-in scorers (reward.scorer, besides "auto")."""


@functools.lru_cache(maxsize=64)
def make_scorer(name: str, settings: ScorerSettings = ScorerSettings()) -> Scorer:
    """The built-in scorer `name` (one of SCORER_NAMES) with `settings`."""
    if name not in _BUILTIN:
        raise UserError(f"reward.scorer={name!r} is not a built-in scorer; use one of "
                         f"auto, {', '.join(SCORER_NAMES)}")
    return functools.partial(_BUILTIN[name], settings=settings)


def scorer_name_for(data_source: str) -> str:
    """The built-in scorer for `data_source`; ValueError saying how to fix it."""
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    for prefix, name in DATA_SOURCE_PREFIXES.items():
        if data_source.startswith(prefix):
            return name
    known = sorted(DATA_SOURCES) + [f"{p}*" for p in sorted(DATA_SOURCE_PREFIXES)]
    raise UserError(
        f"no reward function for data_source {data_source!r}; known data sources: "
        f"{', '.join(known)}. Fix the data_source column of your data (data.reward_fn_key "
        f"names it), or score every row with one built-in scorer (reward.scorer="
        f"{'|'.join(SCORER_NAMES)}), or set custom_reward_function.path to a Python file "
        "defining your own compute_score(data_source, solution_str, ground_truth, extra_info).")


def get_scorer(data_source: str, settings: ScorerSettings = ScorerSettings()) -> Scorer:
    return make_scorer(scorer_name_for(data_source), settings)


# data_source -> scorer with default settings (the exact names only).
SCORERS: dict[str, Scorer] = {source: make_scorer(name) for source, name in DATA_SOURCES.items()}


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, **kwargs: Any) -> float | dict[str, float]:
    """Drop-in for verl's `default_compute_score`, with default settings.

    Returns a float, except for scorers that report parts: then a dict with
    the total under "score" and the parts beside it. No built-in data source
    does that today (r1 is chosen with reward.scorer=r1, not by data source).
    Extra keyword arguments verl passes (sandbox_fusion_url, ...) are ignored.
    """
    result = get_scorer(data_source)(solution_str, ground_truth, extra_info)
    return result if isinstance(result, dict) else float(result)
