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

# The actor_rollout_ref group lives in its own module; re-exported here.
from thinkrl.config.schema_roles import (  # noqa: F401
    ActorConfig, ActorRolloutRefConfig, FSDPConfig, ModelConfig, ModelLoraConfig, OptimConfig, PolicyLossConfig,
    RefConfig, RolloutConfig, SamplingConfig)
from thinkrl.config.schema_async import AsyncTrainingConfig  # noqa: F401
from thinkrl.config.schema_verl_async import FullyAsyncRolloutConfig  # noqa: F401
from thinkrl.config.schema_critic import (  # noqa: F401
    CriticConfig, CriticModelConfig, CriticOptimConfig)
from thinkrl.config.schema_env import EnvConfig  # noqa: F401
from thinkrl.config.schema_distill import DistillationConfig, DistillationLossConfig  # noqa: F401


FILTER_GROUPS_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")
"""``algorithm.filter_groups.metric`` names with a fixed meaning; any other name is a part the
reward function reports beside its score (e.g. r1's "accuracy")."""


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
    min_pixels: int | None = None
    """Smallest image area in pixels after resizing (Qwen-VL processor's ``min_pixels``);
    None keeps the model's preprocessor_config.json value."""
    max_pixels: int | None = None
    """Largest image area in pixels after resizing (``max_pixels``): bounds the vision
    tokens of one image (area / 28**2); None keeps the model's preprocessor_config.json value."""
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
    mixture: dict[str, float] = field(default_factory=dict)
    """thinkrl: sampling weight per data_source (or glob, e.g. ``reasoning_gym/*``) of the
    training prompts: each batch holds the sources in these proportions (rounded per batch,
    exact over steps); a source matched by no entry is left out. Empty: every prompt alike."""


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
    """Advantage estimator, one of ``thinkrl.config.choices.ADV_ESTIMATORS`` (see the README's algorithm table)."""
    gamma: float = 1.0
    """Discount factor per token (gae, reinforce_plus_plus; GRPO scores whole responses)."""
    lam: float = 1.0
    """GAE lambda (gae only): 1 is the Monte-Carlo return, 0 the one-step TD target."""
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
    rollout_is: bool = False
    """Correct the policy gradient for the rollout engine's drift from the trainer:
    weight each token by the truncated ratio pi_trainer / pi_rollout (TIS)."""
    rollout_is_threshold: float = 2.0
    """Upper bound of the importance weight (truncate) or the weight above which a
    token is dropped (mask)."""
    rollout_is_level: str = "token"
    """"token": one weight per token; "sequence": the product over the response."""
    rollout_is_mode: str = "truncate"
    """"truncate": min(w, threshold); "mask": weight 0 where w > threshold."""


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
    directory, which every node must see anyway for the checkpoint shards;
    nothing listens on the network), "tcp" (a store on rank 0's node address,
    listening on every interface: for a file system whose locks do not work
    across nodes) or "auto" (file)."""
    save_freq: int = -1
    """Checkpoint every this many steps and at the last step; <= 0 disables."""
    test_freq: int = -1
    """Validate every this many steps and at the last step; <= 0 never
    validates during training (as in verl; val_before_train is apart)."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and exit."""
    critic_warmup: int = 0
    """PPO with a critic (``algorithm.adv_estimator=gae``): the actor is first updated at step
    ``critic_warmup`` (verl's test ``critic_warmup <= step``, steps counted from 1), so
    steps 1 .. critic_warmup - 1 train only the critic."""
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
    scorer for every row: "gsm8k", "math", "r1", "exact" (the stripped
    response equals the stripped ground truth) or "geo3k" (verl's: 0.9 boxed answer +
    0.1 think-then-boxed format)."""
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
    startup_trial: bool = True
    """Call a custom reward function at start on a row per data source, with
    the gold answer written the ways rewards read it (plain, ``#### 72``,
    ``\\boxed{72}``, ``<answer>`` tags), and stop when every call fails; false
    for a function that reads only a format of its own."""


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
    critic: CriticConfig = field(default_factory=CriticConfig)
    """The value model of PPO with a critic (``algorithm.adv_estimator=gae``)."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Rollout on its own process, overlapping the update (verl's async recipes)."""
    rollout: FullyAsyncRolloutConfig = field(default_factory=FullyAsyncRolloutConfig)
    """verl's fully-async top-level ``rollout.*``: aliases of thinkrl's keys."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """thinkrl: environments of multi-turn rollouts (games, simulated users, tools)."""
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    """On-policy distillation from frozen teachers (verl's ``distillation.*``)."""
