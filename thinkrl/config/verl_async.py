"""verl's fully-async keys read as thinkrl's (see `schema_verl_async`)."""

from __future__ import annotations

from typing import Mapping

from thinkrl.config.schema import Config
from thinkrl.errors import UserError

ARR = "actor_rollout_ref"


def apply_verl_async_aliases(cfg: Config, *, given: Mapping[str, int] | None = None) -> None:
    """Copies each given top-level ``rollout.*`` key (and
    ``async_training.use_rollout_log_probs``) onto the thinkrl key it stands
    for. `given`: where each dotted key was set (1: a recipe, 2: the user's
    overrides, 3: a tool's; absent: its default). Whichever name was set
    later in that order wins (an alias over a default or a recipe's value;
    the user's key over a recipe's alias); both names set with different
    values at the same level is a ValueError naming both."""
    top, arr, trainer = cfg.rollout, cfg.actor_rollout_ref, cfg.trainer
    given = given or {}

    def _alias(owner, alias: str, target, field: str, key: str, *, value=None, how: str = "") -> None:
        """`owner.alias` (verl's key `{section}.{alias}`) stands for `target.field` (`key`);
        `value` when it is derived from the alias's (`how` says how)."""
        given_value = getattr(owner, alias)
        if given_value is None:
            return
        value = given_value if value is None else value
        alias_key = f"{'rollout' if owner is top else 'async_training'}.{alias}"
        at_alias, at_other = given.get(alias_key, 2), given.get(key, 0)
        current = getattr(target, field)
        if at_other == at_alias and current != value:
            raise UserError(f"{alias_key}{how} gives {key}={value!r}, but {key}={current!r} is set too: "
                             "keep one of them")
        if at_other <= at_alias:
            setattr(target, field, value)
        else:  # the other name wins: the alias is cleared, so the saved config.yaml reloads alike
            setattr(owner, alias, None)

    _alias(top, "nnodes", arr.rollout, "nnodes", f"{ARR}.rollout.nnodes")
    _alias(top, "n_gpus_per_node", arr.rollout, "n_gpus_per_node", f"{ARR}.rollout.n_gpus_per_node")
    _alias(top, "n", arr.rollout, "n", f"{ARR}.rollout.n")
    _alias(top, "total_epochs", trainer, "total_epochs", "trainer.total_epochs")
    if top.total_rollout_steps is not None:
        per_step = cfg.data.train_batch_size
        if per_step <= 0:
            raise UserError(f"rollout.total_rollout_steps={top.total_rollout_steps} counts prompts; "
                             "set data.train_batch_size (async_training.require_batches x "
                             f"{ARR}.actor.ppo_mini_batch_size) to turn it into training steps")
        _alias(top, "total_rollout_steps", trainer, "total_training_steps", "trainer.total_training_steps",
               value=max(1, top.total_rollout_steps // per_step),
               how=f"={top.total_rollout_steps} // data.train_batch_size={per_step}")
    if top.test_freq is not None:
        every = cfg.async_training.trigger_parameter_sync_step
        _alias(top, "test_freq", trainer, "test_freq", "trainer.test_freq",
               value=top.test_freq * every if top.test_freq > 0 else top.test_freq,
               how=f"={top.test_freq} x async_training.trigger_parameter_sync_step={every}")
    _alias(cfg.async_training, "use_rollout_log_probs", arr.actor, "use_rollout_log_probs",
           f"{ARR}.actor.use_rollout_log_probs")

