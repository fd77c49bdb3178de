"""thinkrl: environments, the other side of multi-turn rollouts (``env.*``).

Which environment a row talks to is chosen per row (`thinkrl.envs.routing`):
verl's ``extra_info.agent_name`` and ``extra_info.interaction_kwargs.name``,
then ``env.by_data_source``, then built-in routes (``textarena/<game>``).
Named environments come from verl's interaction file
(``actor_rollout_ref.rollout.multi_turn.interaction_config_path``), which
takes thinkrl environment classes beside verl's interactions.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EnvConfig:
    """How rows pick environments and how environment calls are bounded."""

    by_data_source: dict[str, str] = field(default_factory=dict)
    """data_source (or a glob such as ``textarena/*``) -> environment name, for
    rows that name none themselves (no agent_name / interaction_kwargs)."""
    step_timeout_s: float = 60.0
    """Seconds one environment call (reset, step, close) may take; past it the
    conversation ends, scores 0 and is counted (env/<name>/errors/timeout)."""
    concurrency: int = 32
    """Environment calls of a batch running at once (threads; an environment
    served by worker processes runs its calls there)."""
