"""Checks of the ``critic.*`` keys and the critic's batch sizes (PPO with a critic).

Called by ``thinkrl.config.checks.validate``; the critic's keys are checked
only when ``algorithm.adv_estimator=gae`` builds a critic (otherwise they
change nothing, and ``thinkrl.config.inactive`` says so). Where a critic key
is None it takes the actor's value, as verl's ``${actor_rollout_ref...}``
defaults do; ``critic_sizes`` resolves them once.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.config.choices import LOSS_AGG_MODES, near_divisors
from thinkrl.config.keys import ARR
from thinkrl.config.schema import Config


def uses_critic(cfg: Config) -> bool:
    """PPO with a critic: algorithm.adv_estimator=gae (verl's `need_critic`)."""
    return cfg.algorithm.adv_estimator == "gae"


@dataclass(frozen=True)
class CriticSizes:
    """How the critic's update splits one step's responses (RESPONSES unless said)."""

    prompts_per_mini_batch: int
    """critic.ppo_mini_batch_size, else the actor's."""
    responses_per_mini_batch: int
    """prompts_per_mini_batch x rollout.n."""
    responses_per_mini_batch_per_device: int
    micro_batch_size_per_device: int
    """Responses per device per forward/backward of the value loss."""
    forward_micro_batch_size_per_device: int
    """Responses per device per value forward without grad (compute_values)."""
    ppo_epochs: int
    shuffle: bool
    loss_agg_mode: str
    micro_batch_source: str = ""

    def rows(self) -> list[tuple[str, int, str]]:
        """Rows for DerivedSizes.table()."""
        return [
            ("critic responses per mini-batch", self.responses_per_mini_batch,
             f"= critic.ppo_mini_batch_size {self.prompts_per_mini_batch} x rollout.n"),
            ("critic micro-batch per device", self.micro_batch_size_per_device,
             f"= {self.micro_batch_source}"),
            ("critic value micro-batch", self.forward_micro_batch_size_per_device,
             "responses per device (critic.forward_micro_batch_size_per_gpu)"),
            ("critic ppo epochs", self.ppo_epochs, "= critic.ppo_epochs"),
        ]


def critic_sizes(cfg: Config) -> CriticSizes:
    """The critic's sizes, with None keys resolved to the actor's values.
    Call after `critic_problems` found nothing."""
    critic, actor = cfg.critic, cfg.actor_rollout_ref.actor
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    mini = critic.ppo_mini_batch_size or actor.ppo_mini_batch_size
    per_device = mini * cfg.actor_rollout_ref.rollout.n // world
    micro, source = _per_device(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size,
                                "ppo_micro_batch_size", world=world, fallback=per_device,
                                fallback_source="not set: one micro-batch per mini-batch")
    forward, _ = _per_device(critic.forward_micro_batch_size_per_gpu, critic.forward_micro_batch_size,
                             "forward_micro_batch_size", world=world, fallback=micro,
                             fallback_source="the update's micro-batch")
    return CriticSizes(
        prompts_per_mini_batch=mini, responses_per_mini_batch=mini * cfg.actor_rollout_ref.rollout.n,
        responses_per_mini_batch_per_device=per_device, micro_batch_size_per_device=micro,
        forward_micro_batch_size_per_device=forward,
        ppo_epochs=critic.ppo_epochs or actor.ppo_epochs,
        shuffle=actor.shuffle if critic.shuffle is None else critic.shuffle,
        loss_agg_mode=critic.loss_agg_mode or actor.loss_agg_mode, micro_batch_source=source)


def _per_device(per_gpu: int | None, total: int | None, name: str, *, world: int, fallback: int,
                fallback_source: str) -> tuple[int, str]:
    if per_gpu is not None:
        return per_gpu, f"critic.{name}_per_gpu"
    if total is not None:
        return max(total // world, 1), f"critic.{name} {total} / {world} devices"
    return fallback, fallback_source


Problem = tuple[str, object, str]
"""(key, its value, what to do)."""


def critic_problems(cfg: Config) -> list[str]:
    """Every problem of the critic's keys, one '  - key=value: fix' line each."""
    critic, found = cfg.critic, []
    if critic.enable is not None and critic.enable != uses_critic(cfg):
        found.append(("critic.enable", critic.enable,
                      "thinkrl builds the critic exactly when algorithm.adv_estimator=gae (PPO with a "
                      "critic); remove critic.enable (or set algorithm.adv_estimator=gae to train one)"))
    if uses_critic(cfg):
        found += _value_problems(cfg)
        if not found:  # the sizes divide by values checked above
            found += _size_problems(cfg)
    return [f"  - {key}={'null' if value is None else value}: {fix}" for key, value, fix in found]


def _value_problems(cfg: Config) -> list[Problem]:
    """Each critic (and GAE) value against its range."""
    critic, algo, found = cfg.critic, cfg.algorithm, []
    for key, value in (("algorithm.gamma", algo.gamma), ("algorithm.lam", algo.lam)):
        if not 0 <= value <= 1:
            found.append((key, value, "use a value in [0, 1] (verl's PPO examples: 1.0)"))
    if cfg.trainer.critic_warmup < 0:
        found.append(("trainer.critic_warmup", cfg.trainer.critic_warmup, "use a step count >= 0 (0: no warmup)"))
    for name in ("ppo_mini_batch_size", "ppo_epochs", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu",
                 "forward_micro_batch_size", "forward_micro_batch_size_per_gpu"):
        value = getattr(critic, name)
        if value is not None and value < 1:
            found.append((f"critic.{name}", value, "must be a whole number >= 1, or null for the default "
                          "(the actor's value for ppo_mini_batch_size and ppo_epochs)"))
    ranges = {
        "critic.cliprange_value": (critic.cliprange_value, lambda v: v > 0, "use a clip range > 0, e.g. 0.5"),
        "critic.grad_clip": (critic.grad_clip, lambda v: v > 0, "use a norm > 0, e.g. 1.0"),
        "critic.optim.lr": (critic.optim.lr, lambda v: v >= 0, "use a learning rate >= 0, e.g. 1e-5"),
        "critic.optim.weight_decay": (critic.optim.weight_decay, lambda v: v >= 0, "use a value >= 0, e.g. 0.01"),
        "critic.optim.eps": (critic.optim.eps, lambda v: v > 0, "use a value > 0, e.g. 1e-8"),
        "critic.optim.betas": (critic.optim.betas, lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
                               "give two values in [0, 1), e.g. [0.9,0.999]"),
        "critic.optim.min_lr_ratio": (critic.optim.min_lr_ratio, lambda v: 0 <= v <= 1, "use a fraction in [0, 1]"),
        "critic.optim.lr_warmup_steps_ratio": (critic.optim.lr_warmup_steps_ratio, lambda v: 0 <= v <= 1,
                                               "use a fraction in [0, 1]"),
        "critic.optim.warmup_style": (critic.optim.warmup_style, lambda v: v in ("constant", "cosine"),
                                      "use one of: constant, cosine"),
        "critic.strategy": (critic.strategy, lambda v: v in ("fsdp", "fsdp2"), "use one of: fsdp, fsdp2"),
        "critic.loss_agg_mode": (critic.loss_agg_mode, lambda v: v is None or v in LOSS_AGG_MODES,
                                 f"use one of: {', '.join(LOSS_AGG_MODES)}, or null for the actor's"),
        "critic.ppo_max_token_len_per_gpu": (critic.ppo_max_token_len_per_gpu, lambda v: v >= 1,
                                             "use a token budget >= 1 (a longer row runs alone)"),
        "critic.forward_max_token_len_per_gpu": (critic.forward_max_token_len_per_gpu, lambda v: v >= 1,
                                                 "use a token budget >= 1 (a longer row runs alone)"),
        "critic.ulysses_sequence_parallel_size": (critic.ulysses_sequence_parallel_size, lambda v: v == 1,
                                                  "sequence parallelism is not implemented; use 1"),
    }
    found += [(key, value, fix) for key, (value, ok, fix) in ranges.items() if not ok(value)]
    from thinkrl.config.lora_checks import adapter_settings_problems
    return found + adapter_settings_problems("critic.model", critic.model)


def _size_problems(cfg: Config) -> list[Problem]:
    """The critic's mini- and micro-batches against the step's responses and the devices."""
    critic, sizes = cfg.critic, critic_sizes(cfg)
    train, mini, n = cfg.data.train_batch_size, sizes.prompts_per_mini_batch, cfg.actor_rollout_ref.rollout.n
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    key = "critic.ppo_mini_batch_size"
    if train % mini:
        return [(key, critic.ppo_mini_batch_size,
                 f"data.train_batch_size={train} must split into whole critic mini-batches of {mini} prompts; "
                 f"set {key} to a divisor of {train} (e.g. {near_divisors(train, mini)})")]
    if (mini * n) % world:
        return [(key, critic.ppo_mini_batch_size, f"{mini} prompts x {ARR}.rollout.n {n} = {mini * n} responses "
                 f"do not split evenly over {world} devices; change it, rollout.n or the device count")]
    per_device, micro = sizes.responses_per_mini_batch_per_device, sizes.micro_batch_size_per_device
    if per_device % micro:
        return [("critic.ppo_micro_batch_size_per_gpu", critic.ppo_micro_batch_size_per_gpu,
                 f"the critic's {per_device} responses per mini-batch per device are not a multiple of the "
                 f"micro-batch size {micro} ({sizes.micro_batch_source}); set critic.ppo_micro_batch_size_per_gpu "
                 f"to a divisor of {per_device} (e.g. {near_divisors(per_device, micro)})")]
    return []
