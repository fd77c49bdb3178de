"""Typed run configuration: every key, its type and its default live here.

Keys and defaults follow verl's ``ppo_trainer.yaml`` so that a verl launch line
(``python3 -m verl.trainer.main_ppo key=value ...``) runs as
``thinkrl train key=value ...``. Sizes count PROMPTS unless the name says
responses or tokens. ``loading.py`` fills these classes from a YAML recipe and
command-line overrides; ``checks.py`` validates them and derives per-device sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


ADV_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo",
                  "grpo_passk", "gpg", "remax")
"""``algorithm.adv_estimator`` choices; ``thinkrl.algos.advantages`` registers one function per name."""
POLICY_LOSS_MODES = ("vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo")
"""``actor.policy_loss.loss_mode`` choices; ``thinkrl.algos.policy_losses`` registers one function per name."""
FILTER_GROUPS_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
"""``algorithm.filter_groups.metric`` names with a fixed meaning; any other name is a part the
reward function reports beside its score (e.g. r1's "accuracy")."""


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
    """verl: pack sequences without padding for the forward pass."""
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
    """LoRA rank; 0 trains all weights."""
    lora_alpha: int = 16
    """LoRA scaling numerator."""
    target_modules: str | list[str] = "all-linear"
    """Modules that receive LoRA adapters."""
    use_liger: bool = False
    """verl: use Liger kernels."""
    use_fused_kernels: bool = False
    """verl: fused log-prob/entropy kernels."""
    dtype: str = "auto"
    """Compute dtype of forward passes: "auto" (float32 on CPU, bfloat16 on accelerators), "float32",
    "bfloat16", "float16". Weights and optimizer states stay float32 (mixed precision)."""


@dataclass
class PolicyLossConfig:
    """Which policy loss the actor minimises, and the settings of the covariance-based ones."""
    loss_mode: str = "vanilla"
    """One of ``POLICY_LOSS_MODES``: vanilla (PPO clip + dual clip), gspo, sapo, gpg, clip_cov, kl_cov,
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
    """Pack micro-batches by token count instead of response count (not implemented)."""
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
    tau_pos: float = 1.0
    """SAPO: temperature of the soft gate for tokens with a positive advantage."""
    tau_neg: float = 1.05
    """SAPO: temperature of the soft gate for tokens with a zero or negative advantage."""


@dataclass
class RefConfig:
    """The frozen reference policy used for the KL term."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated: responses per forward summed over all devices."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Responses per device per forward; None uses the actor's micro-batch size."""
    log_prob_use_dynamic_bsz: bool = False
    """Pack by token count (not implemented)."""
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
    do_sample: bool = True
    """Sample (True) or decode greedily (False)."""
    prompt_length: int | None = None
    """Longest prompt in tokens; None uses ``data.max_prompt_length``."""
    response_length: int | None = None
    """Longest response in tokens; None uses ``data.max_response_length``."""
    dtype: str = "bfloat16"
    """Engine weight dtype (vLLM/SGLang)."""
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
    """Pack by token count (not implemented)."""
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
    engine_kwargs: dict[str, Any] = field(default_factory=lambda: {"vllm": {}, "sglang": {}})
    """Extra keyword arguments per engine (free-form; add keys with ``+...engine_kwargs.vllm.key=value``)."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling for validation."""
    seed: int = 0
    """Base random seed of the sampler."""


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


@dataclass
class DataConfig:
    """Prompt data sets and how prompts become token ids."""
    train_files: str | list[str] = "builtin:arith/train"
    """Parquet file(s) or ``builtin:<source>/<split>``."""
    val_files: str | list[str] = "builtin:arith/test"
    """Parquet file(s) or ``builtin:<source>/<split>`` for validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt, a list of chat messages ``{"role", "content"}``."""
    reward_fn_key: str = "data_source"
    """Column that selects the reward function."""
    max_prompt_length: int = 512
    """Longest prompt in tokens."""
    max_response_length: int = 512
    """Longest response in tokens."""
    train_batch_size: int = 1024
    """PROMPTS per training step."""
    val_batch_size: int | None = None
    """Prompts per validation generate call; None fills ``rollout.max_num_seqs`` sequences."""
    shuffle: bool = True
    """Shuffle training prompts each epoch."""
    seed: int = 1
    """Seed of the training-prompt shuffle."""
    validation_shuffle: bool = False
    """Shuffle validation prompts."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than ``max_prompt_length`` when loading."""
    filter_overlong_prompts_workers: int = 1
    """Processes used for that filtering."""
    truncation: str = "error"
    """Overlong prompts: "error", or cut on the "left", "right" or in the "middle"."""
    image_key: str = "images"
    """Column holding images (multimodal data only)."""
    video_key: str = "videos"
    """Column holding videos (multimodal data only)."""
    return_raw_chat: bool = False
    """verl: keep the unrendered chat messages in the batch."""
    return_raw_input_ids: bool = False
    """verl: keep prompt ids without the chat template."""
    return_full_prompt: bool = False
    """verl: keep the rendered prompt text in the batch."""
    dataloader_num_workers: int = 8
    """verl: worker processes of the prompt data loader."""
    trust_remote_code: bool = False
    """Allow tokenizer code shipped with the checkpoint to run."""
    tokenizer: str | None = None
    """Tokenizer location for data processing; None uses the model's."""
    use_shm: bool = False
    """verl: copy data to shared memory."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments to ``tokenizer.apply_chat_template``."""
    template: str = "chat"
    """thinkrl: how prompts are rendered: "chat" (the tokenizer's chat template),
    "qwen_r1" (MindSpeed-RL's R1-Zero prompt, byte for byte: the "A conversation between
    User and Assistant ..." instruction in the user turn), "r1_system" (that instruction as
    the system turn of the tokenizer's own chat template; see thinkrl/data/templates.py)
    or "raw" (the prompt text as is, after BOS when the tokenizer adds one: base models)."""
    val_template: str | None = None
    """thinkrl: the template of the validation set; None uses ``data.template``."""
    gen_batch_size: int | None = None
    """PROMPTS per generation batch of DAPO's dynamic sampling (``algorithm.filter_groups``);
    None uses ``train_batch_size``. Used only when ``algorithm.filter_groups.enable``."""


@dataclass
class KLControlConfig:
    """KL-in-reward coefficient controller (used when ``algorithm.use_kl_in_reward``)."""
    type: str = "fixed"
    """"fixed" or "adaptive"."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon."""
    target_kl: float = 0.1
    """Adaptive controller target."""


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: drop groups whose responses all score the same."""
    enable: bool = False
    """Drop groups whose ``metric`` is constant and generate more until
    ``data.train_batch_size`` groups remain."""
    metric: str | None = None
    """Per-response value compared within a group: acc, score, seq_reward (score with the
    overlong penalty), seq_final_reward (after the KL penalty), or a part the reward reports."""
    max_num_gen_batches: int = 0
    """Stop with an error after this many generation batches in one step; <= 0: no limit."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and KL-in-reward."""
    adv_estimator: str = "grpo"
    """Advantage estimator, one of ``ADV_ESTIMATORS`` (see the README's algorithm table)."""
    gamma: float = 1.0
    """Discount factor (GRPO scores whole responses; kept for verl)."""
    lam: float = 1.0
    """GAE lambda (GRPO does not use it; kept for verl)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide group-centred scores by the group std (False: Dr. GRPO)."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty from the reward instead of adding a KL loss."""
    kl_penalty: str = "kl"
    """KL estimator for the in-reward penalty: kl/k1, abs, mse/k2, low_var_kl/k3."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO's dynamic sampling."""


@dataclass
class TrainerConfig:
    """Run length, devices, logging, validation and checkpoints."""
    total_epochs: int = 30
    """Passes over the training prompts."""
    total_training_steps: int | None = None
    """Stop after this many steps; None runs ``total_epochs``."""
    project_name: str = "thinkrl"
    """Project name for loggers and the run directory."""
    experiment_name: str = "run"
    """Experiment name for loggers and the run directory."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Metric sinks, e.g. ``[console,jsonl]``; a single name is accepted."""
    log_val_generations: int = 0
    """Validation generations to log each validation."""
    nnodes: int = 1
    """Machines."""
    n_gpus_per_node: int = 1
    """Devices per machine (processes per machine on CPU)."""
    device: str = "auto"
    """"auto", "cpu", "cuda" or "npu"."""
    backend: str = "auto"
    """thinkrl: "local" (roles in this process), "ray" (one Ray actor per device,
    FSDP2-sharded models) or "auto": local for one device, ray for more."""
    ray_address: str | None = None
    """thinkrl: a running Ray cluster to join ("auto", or "HOST:PORT"); None joins
    the one RAY_ADDRESS names, else starts a local cluster bound to 127.0.0.1."""
    ray_tmpdir: str | None = None
    """thinkrl: Ray's session, log and object-spill files (a large disk); None
    uses RAY_TMPDIR, else Ray's default (/tmp/ray)."""
    ray_wait_timeout_s: float = 1800.0
    """thinkrl: the longest wait for one stage on the Ray workers (loading a
    model included); past it the run stops naming the ranks still busy."""
    dist_init_method: str = "auto"
    """thinkrl: how ranks meet for torch.distributed: "file" (a file in the run
    directory; one node, or nodes sharing that disk; nothing listens on the
    network), "tcp" (a store on rank 0's node address, for several nodes) or
    "auto" (file on one node, tcp on several)."""
    save_freq: int = -1
    """Checkpoint every this many steps and at the last step; <= 0 disables."""
    test_freq: int = -1
    """Validate every this many steps; <= 0 disables."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and exit."""
    critic_warmup: int = 0
    """verl: steps that train only the critic (GRPO has none)."""
    default_local_dir: str = "runs/${trainer.project_name}/${trainer.experiment_name}"
    """Run directory (checkpoints, config, metrics); ``${a.b}`` refers to other keys."""
    resume_mode: str = "auto"
    """"auto" (latest checkpoint in the run directory), "disable" or "resume_path"."""
    resume_from_path: str | None = None
    """Checkpoint to resume from when ``resume_mode`` is "resume_path"."""
    max_actor_ckpt_to_keep: int | None = None
    """Keep only this many latest checkpoints; None keeps all."""
    balance_batch: bool = True
    """Reorder responses so devices get similar token counts."""
    seed: int = 1
    """Global seed (model init, dropout, sampling)."""
    progress_bar: bool = True
    """Show a progress bar."""
    log_train_generations: int = 4
    """thinkrl: training generations (prompt, response, reward) saved to the run
    directory every ``generations_log_freq`` steps; 0 saves none."""
    generations_log_freq: int = 10
    """thinkrl: steps between two saves of training generations."""
    divergence_guard: bool = True
    """thinkrl: stop, before the next checkpoint, a run whose policy is destroyed
    (non-finite or exploding weights, entropy at the uniform limit, a loss
    spike); see thinkrl.guard."""


@dataclass
class CustomRewardFunctionConfig:
    """A user reward function loaded from a Python file."""
    path: str | None = None
    """Python file that defines the function; None uses the built-in rewards."""
    name: str = "compute_score"
    """Function name in that file."""


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong penalty (verl's DAPO recipe keys)."""
    enable: bool = False
    """Penalise responses longer than ``data.max_response_length - len``."""
    len: int = 0
    """Buffer length in tokens: the penalty grows linearly over its last ``len`` tokens."""
    penalty_factor: float = 0.0
    """Penalty at the full ``data.max_response_length``."""
    log: bool = False
    """Log ``reward/overlong_reward/mean`` and ``reward/overlong/mean`` (share penalised)."""


@dataclass
class RewardModelConfig:
    """Model-based reward (not implemented) and the reward manager."""
    enable: bool = False
    """Score with a reward model (not implemented; rewards are rule-based)."""
    reward_manager: str = "naive"
    """How reward functions are applied to a batch."""
    launch_reward_fn_async: bool = False
    """verl: compute rewards concurrently with the old-log-prob pass."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO's soft overlong penalty, added to each response's score."""


@dataclass
class RewardConfig:
    """thinkrl: rule-based rewards (verl has no such group; its keys are thinkrl's own)."""
    scorer: str = "auto"
    """"auto": each row's data_source picks its scorer (as in verl); or one
    scorer for every row: "gsm8k", "math", "r1" or "exact" (the stripped
    response equals the stripped ground truth)."""
    format_score: float = 0.0
    """gsm8k and math: score of a response with a well-formed but wrong answer."""
    r1_format_weight: float = 0.5
    """r1: weight of the format reward (one <think>...</think> then <answer>...</answer>)."""
    r1_accuracy_weight: float = 1.0
    """r1: weight of the accuracy reward (the answer checked with math-verify)."""
    timeout_s: float = 10.0
    """Seconds one response may take to score; past it, it scores 0 and is counted."""
    num_workers: int = 2
    """Scoring processes; 0 scores in the main process (then a hang cannot be stopped)."""
    zero_reward_warn_steps: int = 5
    """Warn when every reward of this many steps in a row is 0; 0 never warns."""
    verifiers: list[str] = field(default_factory=list)
    """MindSpeed-RL rule verifiers that score every row instead of ``scorer``: any of
    "format", "strict_format", "base_acc", "acc" (its ``rl_config.verifier_function``;
    see thinkrl/rewards/verifiers.py); empty: not used."""
    verifier_weights: list[float] = field(default_factory=list)
    """One weight per verifier; the reward is the weighted sum (``verifier_weight``)."""
    max_failure_rate: float = 0.5
    """Stop the run when more than this share of the responses of the last
    ``failure_window_steps`` steps failed to score (raised or timed out); 1.0 never stops."""
    failure_window_steps: int = 3
    """Steps over which ``max_failure_rate`` is judged (from the first step on)."""


@dataclass
class Config:
    """A whole run."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompt data."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Model, policy update, generation and reference."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantages and KL-in-reward."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run control."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User reward function."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Reward model and manager."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """thinkrl: rule-based reward settings."""
