"""From a row's `data_source` to the function that scores its responses.

Scorers are pure: `(response, ground_truth, extra_info) -> float`. The table
is checked against the data before the first step, so a data source without
a scorer stops the run at start instead of silently scoring 0.
"""

from __future__ import annotations

from typing import Any, Callable

from thinkrl.rewards import gsm8k

Scorer = Callable[[str, str, dict | None], float]


def _gsm8k(response: str, ground_truth: str, extra_info: dict | None = None) -> float:
    return gsm8k.compute_score(response, ground_truth)


SCORERS: dict[str, Scorer] = {
    "openai/gsm8k": _gsm8k,
    "thinkrl/arith": _gsm8k,
}


def get_scorer(data_source: str) -> Scorer:
    try:
        return SCORERS[data_source]
    except KeyError:
        raise ValueError(
            f"no reward function for data_source {data_source!r}; known data sources: "
            f"{', '.join(sorted(SCORERS))}. Fix the data_source column of your data, or "
            "set custom_reward_function.path to a file defining your own scorer."
        ) from None


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict | None = None, **kwargs: Any) -> float:
    """Drop-in for verl's `default_compute_score`."""
    return get_scorer(data_source)(solution_str, ground_truth, extra_info)
