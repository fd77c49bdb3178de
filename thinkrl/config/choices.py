"""The values a config key may take, each list taken from the registry that
implements the names, so a name is declared once: where its function is
registered. Used by the checks of every role (`thinkrl.config.checks`,
`.critic_checks`); and, for a size that must divide another, the nearest
ones that do.

The registries import torch (and the scorers sympy), so the config package
itself does not import this module: reward workers import the schema only.
"""

from __future__ import annotations

from thinkrl.algos.advantages import ADVANTAGE_ESTIMATORS
from thinkrl.algos.kl import KL_ESTIMATORS as _KL_ESTIMATORS
from thinkrl.algos.losses import LOSS_AGG_MODES as _LOSS_AGG_MODES
from thinkrl.algos.policy_losses import POLICY_LOSSES
from thinkrl.data.templates import TEMPLATES
from thinkrl.rewards.registry import SCORER_NAMES

ADV_ESTIMATORS = tuple(ADVANTAGE_ESTIMATORS)
"""algorithm.adv_estimator (`thinkrl.algos.advantages`)."""
POLICY_LOSS_MODES = tuple(POLICY_LOSSES)
"""actor.policy_loss.loss_mode (`thinkrl.algos.policy_losses`)."""
LOSS_AGG_MODES = tuple(_LOSS_AGG_MODES)
"""actor.loss_agg_mode, critic.loss_agg_mode (`thinkrl.algos.losses`)."""
KL_ESTIMATORS = tuple(_KL_ESTIMATORS)
"""algorithm.kl_penalty, actor.kl_loss_type (`thinkrl.algos.kl`, aliases included)."""
REWARD_SCORERS = ("auto", *SCORER_NAMES)
"""reward.scorer: by data_source, or one built-in scorer (`thinkrl.rewards.registry`)."""
__all__ = ["ADV_ESTIMATORS", "KL_ESTIMATORS", "LOSS_AGG_MODES", "POLICY_LOSS_MODES",
           "REWARD_SCORERS", "TEMPLATES", "divisors", "near_divisors"]


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def near_divisors(n: int, around: int) -> str:
    """The divisors of ``n`` nearest to ``around``, as 'a or b'."""
    below = [d for d in divisors(n) if d < around][-1:]
    above = [d for d in divisors(n) if d > around][:1]
    return " or ".join(str(d) for d in below + above)
