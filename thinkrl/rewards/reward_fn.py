"""Which function scores a row, and scoring one response with it.

`RewardFnSpec` is the picklable recipe for a run's reward function (built-in
by data_source, one built-in for every row, or the user's file); the main
process and every reward worker build the same function from it, so scores
are identical wherever they are computed. `score_one` calls that function
and turns whatever it returns or raises into an `Outcome`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from thinkrl.errors import UserError
from thinkrl.rewards.custom import RewardFunction, load_reward_function
from thinkrl.rewards.registry import SCORER_NAMES, ScorerSettings, make_scorer, scorer_name_for
from thinkrl.rewards.verifiers import WeightedVerifiers


class Task(NamedTuple):
    """One response to score, as sent to a worker."""

    position: int
    """Its place in the batch being scored."""
    text: str
    data_source: str
    ground_truth: str
    extra_info: dict | None
    index: int
    """Row number in its data file (for messages)."""


class Outcome(NamedTuple):
    score: float
    parts: dict[str, float]
    """Named parts a scorer reported beside "score" (r1: format, accuracy)."""
    error: str | None
    """`"ExceptionType: message"` when the scorer failed; then score is 0."""


@dataclass(frozen=True)
class RewardFnSpec:
    """How to build the run's reward function (picklable: sent to workers)."""

    scorer: str = "auto"
    """"auto" (by data_source) or one of SCORER_NAMES for every row (unless verifiers are set)."""
    settings: ScorerSettings = field(default_factory=ScorerSettings)
    custom_path: str | None = None
    """A user's Python file; when set it scores every row (as in verl)."""
    custom_name: str = "compute_score"
    verifiers: tuple[str, ...] = ()
    """MindSpeed-RL verifier names (`reward.verifiers`); when set they score every row."""
    verifier_weights: tuple[float, ...] = ()

    @classmethod
    def from_config(cls, cfg: Any) -> "RewardFnSpec":
        reward, custom = cfg.reward, cfg.custom_reward_function
        settings = ScorerSettings(format_score=reward.format_score,
                                  r1_format_weight=reward.r1_format_weight,
                                  r1_accuracy_weight=reward.r1_accuracy_weight)
        return cls(scorer=reward.scorer, settings=settings, custom_path=custom.path or None,
                   custom_name=custom.name, verifiers=tuple(reward.verifiers),
                   verifier_weights=tuple(float(w) for w in reward.verifier_weights))

    def build(self) -> RewardFunction:
        """A function with verl's signature; ValueError for a bad choice or file."""
        if self.custom_path:
            return load_reward_function(self.custom_path, self.custom_name)
        if self.verifiers:
            return WeightedVerifiers(self.verifiers, self.verifier_weights)
        if self.scorer == "auto":
            return _ByDataSource(self.settings)
        if self.scorer not in SCORER_NAMES:
            raise UserError(f"reward.scorer={self.scorer}: use auto (by each row's data_source) "
                             f"or one of {', '.join(SCORER_NAMES)}")
        return _OneScorer(self.scorer, self.settings)

    def check_sources(self, data_sources: Iterable[str]) -> None:
        """ValueError naming every data source that has no scorer (auto only:
        a forced scorer or a user function takes every row)."""
        if self.custom_path or self.verifiers or self.scorer != "auto":
            return
        unknown = []
        for source in sorted(set(data_sources)):
            try:
                scorer_name_for(source)
            except ValueError as err:
                unknown.append((source, err))
        if unknown:
            names = ", ".join(repr(source) for source, _ in unknown)
            raise UserError(f"data sources without a reward function: {names}. "
                             f"{unknown[0][1]}") from None


@dataclass(frozen=True)
class _ByDataSource:
    settings: ScorerSettings

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None, **kwargs: Any) -> float | dict[str, float]:
        scorer = make_scorer(scorer_name_for(data_source), self.settings)
        return scorer(solution_str, ground_truth, extra_info)


@dataclass(frozen=True)
class _OneScorer:
    name: str
    settings: ScorerSettings

    def __call__(self, data_source: str, solution_str: str, ground_truth: str,
                 extra_info: dict | None = None, **kwargs: Any) -> float | dict[str, float]:
        return make_scorer(self.name, self.settings)(solution_str, ground_truth, extra_info)


def score_one(function: RewardFunction, task: Task) -> Outcome:
    """Call `function` by keyword as verl does; never raises.

    A float (or int/bool) is the score; a dict must hold "score", its other
    numeric entries become parts. Anything else, a non-finite score, or an
    exception is an error scoring 0.
    """
    try:
        result = function(data_source=task.data_source, solution_str=task.text,
                          ground_truth=task.ground_truth, extra_info=task.extra_info)
        return _as_outcome(result)
    except Exception as err:  # a user function may raise anything
        return Outcome(0.0, {}, f"{type(err).__name__}: {err}")


def _as_outcome(result: Any) -> Outcome:
    parts: dict[str, float] = {}
    if isinstance(result, dict):
        if "score" not in result:
            return Outcome(0.0, {}, f"ResultError: returned a dict without a 'score' key "
                                    f"(keys: {', '.join(map(str, result))[:200]})")
        parts = {str(k): float(v) for k, v in result.items()
                 if k != "score" and isinstance(v, (int, float))}
        result = result["score"]
    if not isinstance(result, (int, float)):  # bool is an int; numpy scalars have __float__
        if not hasattr(result, "__float__") or isinstance(result, str):
            return Outcome(0.0, {}, f"ResultError: returned a {type(result).__name__}, not a number")
    score = float(result)
    if not math.isfinite(score):
        return Outcome(0.0, {}, f"ResultError: returned a non-finite score {score}")
    return Outcome(score, parts, None)
