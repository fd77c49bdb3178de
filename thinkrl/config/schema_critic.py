"""The ``critic`` group: the value model of PPO with a critic (``algorithm.adv_estimator=gae``).

Key names and defaults follow verl's ``critic/critic.yaml`` and
``critic/dp_critic.yaml``. Where verl fills a default from the actor
(``${actor_rollout_ref.actor.ppo_mini_batch_size}`` and the like) the field
here is ``None``, meaning "the actor's value"; ``thinkrl.config.critic_checks``
resolves it once. Sizes count PROMPTS unless the name says responses.
Re-exported by ``thinkrl.config.schema``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thinkrl.config.schema_roles import CheckpointConfig, FSDPConfig, OptimConfig


@dataclass
class CriticOptimConfig(OptimConfig):
    """Critic optimizer (AdamW) and learning-rate schedule; verl's critic defaults."""
    lr: float = 1e-5
    """Peak learning rate (verl's critic default, ten times the actor's)."""


@dataclass
class CriticModelConfig:
    """The value model: the policy's architecture with a one-output head per token."""
    path: str | None = None
    """Hugging Face folder, hub id or ``builtin:<name>`` of the value model's backbone; None uses
    ``actor_rollout_ref.model.path``. A causal-LM folder gets a freshly initialised scalar head."""
    tokenizer_path: str | None = None
    """verl: the critic's tokenizer; it must be the actor's (the critic reads the actor's token ids)."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the value model's Hugging Face config."""
    external_lib: str | None = None
    """verl: module to import before loading; thinkrl imports ``actor_rollout_ref.model.external_lib``."""
    trust_remote_code: bool | None = None
    """Allow model code shipped with the checkpoint to run; None uses the actor model's setting."""
    use_remove_padding: bool = False
    """verl: pack sequences without padding for the forward pass."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory (verl's critic default: on)."""
    enable_activation_offload: bool = False
    """verl: move activations to the host during forward."""
    use_shm: bool = False
    """verl: copy the checkpoint to shared memory before loading."""
    lora_rank: int = 0
    """LoRA rank; 0 trains all weights. Above 0 the value model trains adapters
    on its decoder and its value head whole."""
    lora_alpha: float = 16
    """LoRA scaling numerator: the update is (lora_alpha / lora_rank) B A."""
    target_modules: str | list[str] = "all-linear"
    """Modules that receive LoRA adapters (all-linear: the decoder's projections)."""
    exclude_modules: str | list[str] | None = None
    """Modules kept without adapters although target_modules matches them."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the critic on the ray backend (FSDP2 over all devices, as the actor)."""


@dataclass
class CriticConfig:
    """PPO's value model and its update (used when ``algorithm.adv_estimator=gae``)."""
    enable: bool | None = None
    """verl: build the critic; None builds it exactly when ``algorithm.adv_estimator=gae``."""
    strategy: str = "fsdp"
    """Sharding strategy: "fsdp" or "fsdp2"."""
    rollout_n: int | None = None
    """verl: responses per prompt (mirrors ``actor_rollout_ref.rollout.n``, which is what is used)."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What the critic's checkpoints hold (``save_contents``; its "extra" is
    in the run's, which the actor's key decides)."""
    optim: CriticOptimConfig = field(default_factory=CriticOptimConfig)
    """Optimizer and schedule of the critic."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """The value model."""
    ppo_mini_batch_size: int | None = None
    """PROMPTS per critic optimizer step; None uses ``actor_rollout_ref.actor.ppo_mini_batch_size``."""
    ppo_micro_batch_size: int | None = None
    """Deprecated: RESPONSES per forward summed over all devices; prefer ``ppo_micro_batch_size_per_gpu``."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """RESPONSES per device per forward/backward; None: one micro-batch per mini-batch."""
    forward_micro_batch_size: int | None = None
    """Deprecated: RESPONSES per value forward (no grad) over all devices."""
    forward_micro_batch_size_per_gpu: int | None = None
    """RESPONSES per device per value forward (no grad); None uses the update's micro-batch size."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token count instead of response count (as the actor's)."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget per device per micro-batch when ``use_dynamic_bsz`` is set."""
    forward_max_token_len_per_gpu: int = 32768
    """Token budget per device per value forward when ``use_dynamic_bsz`` is set."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence parallel degree (only 1 is implemented)."""
    ppo_epochs: int | None = None
    """Passes over each step's responses; None uses ``actor_rollout_ref.actor.ppo_epochs``."""
    shuffle: bool | None = None
    """Shuffle responses before cutting mini-batches; None uses ``actor_rollout_ref.actor.shuffle``."""
    data_loader_seed: int = 42
    """Seed of the critic's mini-batch shuffle."""
    cliprange_value: float = 0.5
    """Value clip: a new prediction counts at most this far from the value it had at rollout."""
    loss_agg_mode: str | None = None
    """How per-token value losses are averaged (as the actor's); None uses
    ``actor_rollout_ref.actor.loss_agg_mode``."""
    grad_clip: float = 1.0
    """Clip the critic's global gradient norm to this value."""
