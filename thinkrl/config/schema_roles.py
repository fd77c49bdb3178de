"""The `actor_rollout_ref` group of the run configuration (verl's keys and
defaults): the model, the actor's update and optimizer, the reference, and
rollout. Part of `thinkrl.config.schema`, which re-exports every class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thinkrl.config.schema_moe import MegatronActorConfig, RouterReplayConfig
from thinkrl.config.schema_multi_turn import MultiTurnConfig


@dataclass
class OptimConfig:
    """Actor optimizer (AdamW) and learning-rate schedule."""
    lr: float = 1e-6
    """Peak learning rate."""
    lr_warmup_steps: int = -1
    """Warmup length in optimizer steps; -1 uses ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup length as a fraction of ``total_training_steps`` (used when ``lr_warmup_steps`` is -1)."""
    total_training_steps: int = -1
    """Schedule length; -1 means the trainer fills it in from the data and epochs."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_style: str = "constant"
    """LR after warmup: "constant" or "cosine" (decay to ``min_lr_ratio * lr``)."""
    min_lr_ratio: float = 0.0
    """Cosine schedule floor as a fraction of ``lr``."""
    num_cycles: float = 0.5
    """Number of cosine half-waves; 0.5 decays once from ``lr`` to the floor."""


@dataclass
class FSDPConfig:
    """How a role's model is sharded when the ``ray`` backend runs it with FSDP."""
    param_offload: bool = False
    """Keep parameters on the host between uses."""
    optimizer_offload: bool = False
    """Keep optimizer state on the host between uses."""
    offload_policy: bool = False
    """FSDP2 CPUOffloadPolicy (parameters, gradients and optimizer on the host)."""
    reshard_after_forward: bool = True
    """FSDP2: free gathered parameters after forward (ZeRO-3 style)."""
    fsdp_size: int = -1
    """Devices per FSDP shard group; -1 shards over all devices."""
    forward_prefetch: bool = False
    """Prefetch the next layer's all-gather during forward."""
    wrap_policy: dict[str, Any] = field(default_factory=lambda: {"min_num_params": 0})
    """Which modules become FSDP units (free-form mapping, as verl)."""

    @property
    def offloads(self) -> bool:
        """Any of verl's three offload switches: thinkrl maps each onto FSDP2's
        CPUOffloadPolicy, which keeps parameters, gradients and optimizer state
        on the host together (on an accelerator; moot on a CPU device)."""
        return self.param_offload or self.optimizer_offload or self.offload_policy


@dataclass
class ModelLoraConfig:
    """verl's `model.lora` group; thinkrl reads `merge` from it (the adapter's
    rank, alpha and targets are model.lora_rank, lora_alpha, target_modules)."""
    merge: bool = False
    """With rollout.name=vllm: send the engine the base with the adapter merged in
    (W + s B A, every weight) after each update, instead of the adapter alone for
    vLLM to serve. Some set-ups always merge (`thinkrl.rollout.vllm_lora.adapter_serving`)."""


@dataclass
class ModelConfig:
    """The policy model (the reference model is a frozen copy of it)."""
    path: str = "builtin:tiny-qwen2"
    """Hugging Face model id, local directory, or ``builtin:<name>`` for a bundled tiny model."""
    tokenizer_path: str | None = None
    """Tokenizer location; None uses ``path``."""
    custom_chat_template: str | None = None
    """Jinja chat template that replaces the tokenizer's own."""
    trust_remote_code: bool = False
    """Allow model code shipped with the checkpoint to run."""
    use_remove_padding: bool = False
    """verl's key; in thinkrl the reference, old-log-prob and update forwards of a
    Llama/Qwen2/Qwen3 model compute each distinct prompt once (its G responses attend
    to it) and skip response columns that are padding in every row of a micro-batch.
    Same math as the padded forward up to float32 rounding; other models ignore it."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    enable_activation_offload: bool = False
    """verl: move activations to the host during forward."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's Hugging Face config."""
    external_lib: str | None = None
    """Python module to import before loading the model (registers custom architectures)."""
    use_shm: bool = False
    """verl: copy the checkpoint to shared memory before loading."""
    lora_rank: int = 0
    """LoRA rank r; 0 trains all weights. Above 0 only the adapters train (PEFT),
    and the reference policy is the base with the adapter switched off."""
    lora_alpha: float = 16
    """LoRA scaling numerator: the update is (lora_alpha / lora_rank) B A."""
    target_modules: str | list[str] = "all-linear"
    """Modules that receive LoRA adapters: "all-linear" (every linear layer but
    the output head) or names such as [q_proj, v_proj] (PEFT's matching)."""
    exclude_modules: str | list[str] | None = None
    """Modules kept without adapters although target_modules matches them."""
    lora_adapter_path: str | None = None
    """A saved PEFT adapter folder to start training from (its targets are used)."""
    lora: ModelLoraConfig = field(default_factory=ModelLoraConfig)
    """How a vLLM engine gets the adapter (`lora.merge`)."""
    layered_summon: bool = False
    """verl: gather FSDP shards one layer at a time for the weight sync; thinkrl
    always gathers one tensor at a time."""
    use_liger: bool = False
    """verl: use Liger kernels."""
    use_fused_kernels: bool = False
    """verl's key; in thinkrl the shared-prompt pass (``use_remove_padding``) applies
    the output head a chunk of tokens at a time and computes log-probs and
    entropies from each chunk, so the [tokens, vocabulary] logits never exist
    whole (at Qwen2.5's 152k vocabulary they outweigh the model); the backward
    recomputes each chunk. Same math up to float32 rounding."""
    dtype: str = "auto"
    """Compute dtype of forward passes: "auto" (float32 on CPU, bfloat16 on accelerators), "float32",
    "bfloat16", "float16". Weights and optimizer states stay float32 (mixed precision)."""
    freeze_vision_tower: bool = False
    """thinkrl (vision-language models): train the language model only; the vision tower and
    its merger get no gradient and no optimizer state."""


@dataclass
class PolicyLossConfig:
    """Which policy loss the actor minimises, and the settings of the covariance-based ones."""
    loss_mode: str = "vanilla"
    """One of ``thinkrl.config.choices.POLICY_LOSS_MODES``: vanilla (PPO clip + dual clip), gspo, sapo, gpg, clip_cov, kl_cov,
    geo_mean (GMPO), cispo. See the README's algorithm table."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: fraction of response tokens whose gradient is dropped."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower bound of the covariance of the tokens that may be dropped."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper bound of the covariance of the tokens that may be dropped."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: fraction of response tokens (largest covariance) that get the |log-ratio| penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: weight of that penalty."""


SAVE_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class CheckpointConfig:
    """What a checkpoint holds (verl's ``checkpoint.save_contents``)."""
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """"model": the weights (a Hugging Face folder, or shards); "optimizer":
    AdamW's moments; "extra": the LR schedule, data position and RNG states.
    A checkpoint resumes only with all three; ``[model]`` alone is a
    weights-only save, a third of the size in float32 (AdamW keeps two more
    float32 copies), that ``thinkrl export`` / ``thinkrl eval --model`` take.
    "hf_model" is accepted as verl spells it: the weights are always saved as
    a Hugging Face folder (sharded runs: ``thinkrl export`` gathers them)."""


@dataclass
class ActorConfig:
    """The policy update: batching, clipped loss, KL and entropy terms."""
    strategy: str = "fsdp"
    """Sharding strategy: "fsdp" or "fsdp2"."""
    ppo_mini_batch_size: int = 256
    """PROMPTS per optimizer step; each brings ``rollout.n`` responses."""
    ppo_micro_batch_size: int | None = None
    """Deprecated: RESPONSES per forward summed over all devices; prefer ``ppo_micro_batch_size_per_gpu``."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """RESPONSES per device per forward/backward (gradient accumulation unit)."""
    use_dynamic_bsz: bool = False
    """Cut micro-batches by token count instead of response count: consecutive
    responses while their prompt + response tokens fit ``ppo_max_token_len_per_gpu``
    (a longer one goes alone). The gradient does not depend on the cut."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget per device per micro-batch when ``use_dynamic_bsz`` is set."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value."""
    clip_ratio: float = 0.2
    """PPO clip epsilon, used for both sides unless ``clip_ratio_low``/``clip_ratio_high`` are set."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon (ratio >= 1 - low); None uses ``clip_ratio``."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon (ratio <= 1 + high; DAPO's clip-higher); None uses ``clip_ratio``."""
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages; must be > 1."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses are averaged: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    use_kl_loss: bool = False
    """Add a KL(policy || reference) term to the loss (GRPO's way)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator for the loss: kl/k1, abs, mse/k2, low_var_kl/k3."""
    ppo_epochs: int = 1
    """Passes over each step's responses."""
    shuffle: bool = False
    """Shuffle responses before splitting into mini-batches."""
    use_torch_compile: bool = True
    """verl: compile the log-prob computation."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence parallel degree (only 1 is implemented)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the actor."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """The policy loss (``policy_loss.loss_mode``) and its settings."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """What the actor's checkpoints hold (``save_contents``)."""
    tau_pos: float = 1.0
    """SAPO: temperature of the soft gate for tokens with a positive advantage."""
    tau_neg: float = 1.05
    """SAPO: temperature of the soft gate for tokens with a zero or negative advantage."""
    use_rollout_log_probs: bool = False
    """Take pi_old from the rollout engine's log-probs of the sampled tokens
    (verl's bypass mode) instead of a trainer forward: the clipped ratio is then
    taken against the behaviour policy itself, and the old-log-prob pass is skipped.
    Off (the default in async modes too), pi_old is the trainer's policy before the
    update and ``algorithm.rollout_is`` corrects for the behaviour policy."""
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)
    """Mixture-of-experts policies: replay the experts of another pass (R2, R3)."""
    megatron: MegatronActorConfig = field(default_factory=MegatronActorConfig)
    """verl's Megatron spelling of ``router_replay`` (its other keys are not taken)."""


@dataclass
class RefConfig:
    """The frozen reference policy used for the KL term."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated: responses per forward summed over all devices."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Responses per device per forward; None uses the actor's micro-batch size."""
    log_prob_use_dynamic_bsz: bool = False
    """Cut reference forwards by token count (``log_prob_max_token_len_per_gpu``)."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget per device when ``log_prob_use_dynamic_bsz`` is set."""
    use_torch_compile: bool = True
    """verl: compile the log-prob computation."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """Sharding of the reference model."""


@dataclass
class SamplingConfig:
    """Sampling settings for validation generations (``rollout.val_kwargs``)."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 keeps all."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    temperature: float = 0.0
    """Sampling temperature; 0 with ``do_sample=False`` is greedy."""
    n: int = 1
    """Responses per validation prompt."""
    do_sample: bool = False
    """Sample (True) or decode greedily (False)."""


@dataclass
class RolloutConfig:
    """Response generation during training."""
    name: str = "native"
    """Engine: "native" (thinkrl's PyTorch sampler), "vllm" or "sglang"."""
    mode: str = "sync"
    """verl: "sync" (only sync generation is implemented)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 keeps all."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    n: int = 1
    """Responses per prompt (GRPO group size; must be >= 2 for GRPO)."""
    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one (vLLM's min_p); 0 keeps all."""
    accept_truncated_logprobs: bool = False
    """thinkrl: with vLLM, top_p / top_k / min_p and a temperature other than 1,
    vLLM's log-probs are of the truncated distribution (renormalised over the
    kept tokens) while the trainer's are not, so their ratio carries
    log(kept mass); rollout_is, use_rollout_log_probs and async training are
    refused then unless this is True (the bias accepted). At temperature 1
    vLLM is asked for its raw log-probs, which are the trainer's distribution."""
    do_sample: bool = True
    """Sample (True) or decode greedily (False)."""
    prompt_length: int | None = None
    """Longest prompt in tokens; None uses ``data.max_prompt_length``."""
    response_length: int | None = None
    """Longest response in tokens; None uses ``data.max_response_length``."""
    dtype: str = "auto"
    """Engine dtype (vLLM): "auto" is the trainer's compute dtype (model.dtype:
    float32 on CPU, bfloat16 on accelerators), so that the engine samples from
    the distribution the trainer scores; "bfloat16", "float16", "float32" set it
    (verl's default is bfloat16: beside a float32 trainer its log-probs then
    differ by ~1e-3 nats per token, measured in docs/benchmarks.md)."""
    gpu_memory_utilization: float = 0.5
    """vLLM/SGLang: fraction of device memory for weights and KV cache."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence up to ``response_length``."""
    enforce_eager: bool = False
    """vLLM: disable CUDA graphs."""
    free_cache_engine: bool = True
    """vLLM/SGLang: free the KV cache between rollouts."""
    tensor_model_parallel_size: int = 1
    """vLLM/SGLang: devices per engine."""
    pipeline_model_parallel_size: int = 1
    """vLLM/SGLang: pipeline stages per engine."""
    max_num_batched_tokens: int = 8192
    """vLLM: token budget per engine step."""
    max_model_len: int | None = None
    """vLLM: context length; None uses prompt + response length."""
    max_num_seqs: int = 1024
    """vLLM: sequences per engine step."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated: responses per old-log-prob forward summed over all devices."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Responses per device per old-log-prob forward; None uses the actor's micro-batch size."""
    log_prob_use_dynamic_bsz: bool = False
    """Cut old-log-prob forwards by token count (``log_prob_max_token_len_per_gpu``)."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget per device when ``log_prob_use_dynamic_bsz`` is set."""
    enable_chunked_prefill: bool = True
    """vLLM: chunked prefill."""
    load_format: str = "dummy_dtensor"
    """vLLM: how initial weights are loaded before the first sync."""
    disable_log_stats: bool = True
    """vLLM: silence engine statistics."""
    calculate_log_probs: bool = False
    """Return the engine's own log-probs of sampled tokens (for diagnostics)."""
    enable_rollout_routing_replay: bool = False
    """verl: the engine returns each token's experts (router replay R3; thinkrl's
    native engine records them whenever the actor's router_replay.mode is R3)."""
    update_weights_bucket_megabytes: int = 512
    """vLLM: weights streamed into the engine per call after each actor update (MB)."""
    attest_stride: int = 1
    """vLLM: which weights each sync's attestation digests on both sides (the
    engine must serve exactly what was sent). 1: all, every sync. k > 1: a
    k-th of them (every k-th layer), a different k-th at each sync (every
    tensor checked once every k syncs). 0: none."""
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}, "sglang": {}})
    """Extra keyword arguments per engine (free-form; add keys with ``+...engine_kwargs.vllm.key=value``)."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling for validation."""
    seed: int = 0
    """Base random seed of the sampler."""
    nnodes: int = 1
    """Nodes of the rollout side when it has devices of its own
    (``async_training.mode`` other than off; verl's async recipes)."""
    n_gpus_per_node: int = 1
    """Devices per node of the rollout side (async modes): rollout processes."""
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Tool-using rollouts over several turns."""


@dataclass
class ActorRolloutRefConfig:
    """The three colocated roles that share one model: actor, rollout, reference."""
    hybrid_engine: bool = True
    """Colocate actor and rollout on the same devices (the only layout implemented)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """The policy update."""
    ref: RefConfig = field(default_factory=RefConfig)
    """The reference policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""
    nccl_timeout: int = 600
    """Seconds a collective may wait before failing."""
