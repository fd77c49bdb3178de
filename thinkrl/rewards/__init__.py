from thinkrl.rewards.registry import SCORERS, compute_score, get_scorer

__all__ = ["SCORERS", "compute_score", "get_scorer"]
