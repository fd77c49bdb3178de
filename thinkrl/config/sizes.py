"""The batch sizes a config implies: how one training step splits into
mini-batches, devices and micro-batches (``DerivedSizes``), printed at start.

Sizes follow verl: ``data.train_batch_size`` and ``ppo_mini_batch_size``
count PROMPTS; every micro-batch size counts RESPONSES (prompt x rollout.n).
``derive_sizes`` assumes ``thinkrl.config.checks.validate`` found nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.config.critic_checks import CriticSizes, critic_sizes, uses_critic
from thinkrl.config.keys import ARR, value_at
from thinkrl.config.schema import Config


@dataclass(frozen=True)
class DerivedSizes:
    """How one training step splits over mini-batches, devices and micro-batches."""

    world_size: int
    """Devices: trainer.n_gpus_per_node x trainer.nnodes."""
    prompts_per_step: int
    """data.train_batch_size."""
    responses_per_prompt: int
    """actor_rollout_ref.rollout.n."""
    responses_per_step: int
    """prompts_per_step x responses_per_prompt."""
    prompts_per_mini_batch: int
    """actor_rollout_ref.actor.ppo_mini_batch_size."""
    mini_batches_per_step: int
    """prompts_per_step // prompts_per_mini_batch."""
    responses_per_mini_batch: int
    """prompts_per_mini_batch x responses_per_prompt."""
    responses_per_mini_batch_per_device: int
    """responses_per_mini_batch // world_size."""
    micro_batch_size_per_device: int
    """Responses per device per forward/backward."""
    grad_accum_steps: int
    """Micro-batches accumulated per optimizer step on each device."""
    ppo_epochs: int
    """actor_rollout_ref.actor.ppo_epochs."""
    optimizer_steps_per_step: int
    """mini_batches_per_step x ppo_epochs."""
    log_prob_micro_batch_size_per_device: int
    """Responses per device per old-log-prob forward."""
    ref_log_prob_micro_batch_size_per_device: int
    """Responses per device per reference-log-prob forward."""
    prompt_length: int
    """Longest prompt in tokens (rollout.prompt_length or data.max_prompt_length)."""
    response_length: int
    """Longest response in tokens (rollout.response_length or data.max_response_length)."""
    micro_batch_source: str = ""
    """Which setting gave micro_batch_size_per_device."""
    log_prob_micro_batch_source: str = ""
    """Which setting gave log_prob_micro_batch_size_per_device."""
    ref_log_prob_micro_batch_source: str = ""
    """Which setting gave ref_log_prob_micro_batch_size_per_device."""
    critic: CriticSizes | None = None
    """The critic's update sizes (algorithm.adv_estimator=gae); None without a critic."""

    def table(self) -> str:
        """Aligned two-column table, one line of explanation per size."""
        n, mini = self.responses_per_prompt, self.prompts_per_mini_batch
        rows = [
            ("devices", self.world_size, "= trainer.n_gpus_per_node x trainer.nnodes"),
            ("prompts per step", self.prompts_per_step, "= data.train_batch_size"),
            ("responses per step", self.responses_per_step,
             f"= data.train_batch_size {self.prompts_per_step} x rollout.n {n}"),
            ("mini-batches per step", self.mini_batches_per_step,
             f"= data.train_batch_size {self.prompts_per_step} / actor.ppo_mini_batch_size {mini}"),
            ("responses per mini-batch", self.responses_per_mini_batch,
             f"= actor.ppo_mini_batch_size {mini} x rollout.n {n}"),
            ("  per device", self.responses_per_mini_batch_per_device,
             f"= {self.responses_per_mini_batch} / {self.world_size} devices"),
            ("micro-batch per device", self.micro_batch_size_per_device, f"= {self.micro_batch_source}"),
            ("grad accumulation steps", self.grad_accum_steps,
             f"= {self.responses_per_mini_batch_per_device} / {self.micro_batch_size_per_device} per micro-batch"),
            ("optimizer steps per step", self.optimizer_steps_per_step,
             f"= {self.mini_batches_per_step} mini-batches x actor.ppo_epochs {self.ppo_epochs}"),
            ("old log-prob micro-batch", self.log_prob_micro_batch_size_per_device,
             f"= {self.log_prob_micro_batch_source} (responses per device)"),
            ("ref log-prob micro-batch", self.ref_log_prob_micro_batch_size_per_device,
             f"= {self.ref_log_prob_micro_batch_source} (responses per device)"),
            ("prompt length", self.prompt_length, "tokens"),
            ("response length", self.response_length, "tokens"),
            *(self.critic.rows() if self.critic is not None else []),
        ]
        label_w = max(len(r[0]) for r in rows)
        value_w = max(len(str(r[1])) for r in rows)
        return "\n".join(f"{label:<{label_w}}  {value:>{value_w}}  {why}" for label, value, why in rows)


def derive_sizes(cfg: Config) -> DerivedSizes:
    """Sizes implied by ``cfg``; call ``validate`` first (it returns the same thing)."""
    arr, data = cfg.actor_rollout_ref, cfg.data
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    n, mini = arr.rollout.n, arr.actor.ppo_mini_batch_size
    per_device = mini * n // world
    micro, micro_source = micro_size(cfg, "actor", fallback=per_device)
    log_prob, log_prob_source = micro_size(cfg, "rollout", fallback=micro)
    ref, ref_source = micro_size(cfg, "ref", fallback=micro)
    mini_batches = data.train_batch_size // mini
    return DerivedSizes(
        world_size=world,
        prompts_per_step=data.train_batch_size,
        responses_per_prompt=n,
        responses_per_step=data.train_batch_size * n,
        prompts_per_mini_batch=mini,
        mini_batches_per_step=mini_batches,
        responses_per_mini_batch=mini * n,
        responses_per_mini_batch_per_device=per_device,
        micro_batch_size_per_device=micro,
        grad_accum_steps=per_device // micro,
        ppo_epochs=arr.actor.ppo_epochs,
        optimizer_steps_per_step=mini_batches * arr.actor.ppo_epochs,
        log_prob_micro_batch_size_per_device=log_prob,
        ref_log_prob_micro_batch_size_per_device=ref,
        prompt_length=arr.rollout.prompt_length or data.max_prompt_length,
        response_length=arr.rollout.response_length or data.max_response_length,
        micro_batch_source=micro_source,
        log_prob_micro_batch_source=log_prob_source,
        ref_log_prob_micro_batch_source=ref_source,
        critic=critic_sizes(cfg) if uses_critic(cfg) else None,
    )


def micro_size(cfg: Config, role: str, *, fallback: int) -> tuple[int, str]:
    """Per-device micro-batch size of ``role`` and the setting it came from."""
    name = "ppo_micro_batch_size" if role == "actor" else "log_prob_micro_batch_size"
    per_gpu = value_at(cfg, f"{ARR}.{role}.{name}_per_gpu")
    total = value_at(cfg, f"{ARR}.{role}.{name}")
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if per_gpu is not None:
        return per_gpu, f"{role}.{name}_per_gpu"
    if total is not None:
        return max(total // world, 1), f"{role}.{name} {total} / {world} devices"
    if role == "actor":
        return fallback, "not set: one micro-batch per mini-batch"
    return fallback, "not set: the actor's micro-batch"
