"""verl's fully-async keys read as thinkrl's (see `schema_verl_async`)."""

from __future__ import annotations

from thinkrl.config.schema import Config

ARR = "actor_rollout_ref"


def apply_verl_async_aliases(cfg: Config) -> None:
    """Copies each given top-level ``rollout.*`` key (and
    ``async_training.use_rollout_log_probs``) onto the thinkrl key it stands
    for; ValueError when that key was also set to something else."""
    top, arr, trainer = cfg.rollout, cfg.actor_rollout_ref, cfg.trainer
    _alias(top.nnodes, arr.rollout, "nnodes", "rollout.nnodes", f"{ARR}.rollout.nnodes", default=1)
    _alias(top.n_gpus_per_node, arr.rollout, "n_gpus_per_node", "rollout.n_gpus_per_node",
           f"{ARR}.rollout.n_gpus_per_node", default=1)
    _alias(top.n, arr.rollout, "n", "rollout.n", f"{ARR}.rollout.n", default=1)
    _alias(top.total_epochs, trainer, "total_epochs", "rollout.total_epochs", "trainer.total_epochs", default=30)
    if top.total_rollout_steps is not None:
        per_step = cfg.data.train_batch_size
        if per_step <= 0:
            raise ValueError(f"rollout.total_rollout_steps={top.total_rollout_steps} counts prompts; "
                             "set data.train_batch_size (async_training.require_batches x "
                             f"{ARR}.actor.ppo_mini_batch_size) to turn it into training steps")
        _alias(max(1, top.total_rollout_steps // per_step), trainer, "total_training_steps",
               f"rollout.total_rollout_steps={top.total_rollout_steps} // data.train_batch_size={per_step}",
               "trainer.total_training_steps", default=None)
    if top.test_freq is not None:
        every = cfg.async_training.trigger_parameter_sync_step
        freq = top.test_freq * every if top.test_freq > 0 else top.test_freq
        _alias(freq, trainer, "test_freq", f"rollout.test_freq={top.test_freq} x "
               f"async_training.trigger_parameter_sync_step={every}", "trainer.test_freq", default=-1)
    if cfg.async_training.use_rollout_log_probs is not None:
        _alias(cfg.async_training.use_rollout_log_probs, arr.actor, "use_rollout_log_probs",
               "async_training.use_rollout_log_probs", f"{ARR}.actor.use_rollout_log_probs", default=False)


def _alias(value, target, field: str, given: str, key: str, *, default) -> None:
    if value is None:
        return
    current = getattr(target, field)
    if current != default and current != value:
        raise ValueError(f"{given} gives {key}={value!r}, but {key}={current!r} is set too: "
                         "keep one of them")
    setattr(target, field, value)
