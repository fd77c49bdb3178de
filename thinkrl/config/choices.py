"""The values a config key may take, declared once for the checks of every
role (`thinkrl.config.checks`, `.critic_checks`) and the code that uses them;
and, for a size that must divide another, the nearest ones that do.

The algorithm registries (`thinkrl.algos`, `thinkrl.rewards.registry`) hold
the functions behind these names; tests pin each list equal to its registry.
"""

from __future__ import annotations

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# "auto" plus thinkrl.rewards.registry.SCORER_NAMES (not imported: it loads sympy)
REWARD_SCORERS = ("auto", "gsm8k", "math", "r1", "exact", "geo3k")
TEMPLATES = ("chat", "qwen_r1", "r1_system", "raw")
"""Prompt templates (`thinkrl.data.templates`): data.template, data.val_template."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def near_divisors(n: int, around: int) -> str:
    """The divisors of ``n`` nearest to ``around``, as 'a or b'."""
    below = [d for d in divisors(n) if d < around][-1:]
    above = [d for d in divisors(n) if d > around][:1]
    return " or ".join(str(d) for d in below + above)
