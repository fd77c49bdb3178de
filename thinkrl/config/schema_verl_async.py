"""verl's fully-async recipe puts the rollouter's resources and schedule under
a top-level ``rollout.*`` (its ``fully_async_ppo_trainer.yaml``), and a few
switches under ``async_training.*``. thinkrl reads them as aliases of its own
keys (`apply_verl_async_aliases`), so verl's fully-async launch lines run as
they are."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FullyAsyncRolloutConfig:
    """verl's top-level ``rollout.*`` (fully-async recipe); None: not given."""

    nnodes: int | None = None
    """Nodes of the rollout side: ``actor_rollout_ref.rollout.nnodes``."""
    n_gpus_per_node: int | None = None
    """Devices per node of the rollout side: ``actor_rollout_ref.rollout.n_gpus_per_node``."""
    n: int | None = None
    """Responses per prompt: ``actor_rollout_ref.rollout.n``."""
    total_rollout_steps: int | None = None
    """Prompts the rollout side generates in all (verl counts samples):
    ``trainer.total_training_steps`` = this // ``data.train_batch_size``."""
    total_epochs: int | None = None
    """``trainer.total_epochs``."""
    test_freq: int | None = None
    """Validate every this many weight syncs: ``trainer.test_freq`` = this x
    ``async_training.trigger_parameter_sync_step``."""
