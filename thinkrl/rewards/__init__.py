"""Verifiable rewards: built-in scorers (gsm8k, math, r1), the data_source
registry, user reward functions, and the scorer that runs them safely.

`compute_score` is a drop-in for verl's `default_compute_score`. The torch-
side classes (`RewardScorer`, `ScoreResult`) load on first use so that reward
workers, which import this package, stay light.
"""

from thinkrl.rewards.registry import SCORERS, compute_score, get_scorer

__all__ = ["SCORERS", "RewardScorer", "ScoreResult", "compute_score", "get_scorer"]

_LAZY = {"RewardScorer": "thinkrl.rewards.scorer", "ScoreResult": "thinkrl.rewards.scorer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'thinkrl.rewards' has no attribute {name!r}")
