"""On-policy distillation (``distillation.*``), as verl spells it (its
``trainer/config/distillation/distillation.yaml``): the student samples,
frozen teachers score every sampled token, and the per-token divergence
student vs teacher is a loss (or, with ``use_policy_gradient``, a per-token
reward) beside or instead of the task's.

thinkrl runs each teacher on the reference role's machinery (a frozen
model on the training ranks, sharded like the reference, the same log-prob
pass); verl serves it from a vLLM pool of its own, so the pool and serving
keys (``n_gpus_per_node``, ``nnodes``, ``num_replicas``, ``inference.*``)
are accepted and said at start to change nothing (`thinkrl.config.inactive`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# verl's teacher serving keys (a RolloutConfig), so a verl line that sets them
# parses without "+": thinkrl's teacher is a forward pass on the training
# ranks, so none of them is read (said at start when one is set).
TEACHER_INFERENCE_KEYS = (
    "name", "dtype", "gpu_memory_utilization", "enforce_eager", "cudagraph_capture_sizes",
    "free_cache_engine", "data_parallel_size", "expert_parallel_size", "tensor_model_parallel_size",
    "max_num_batched_tokens", "max_model_len", "max_num_seqs", "load_format", "engine_kwargs",
    "limit_images", "enable_chunked_prefill", "enable_prefix_caching", "disable_log_stats",
    "skip_tokenizer_init", "prompt_length", "response_length", "temperature",
)
TEACHER_KEYS = ("key", "model_path", "num_replicas", "inference")


def default_teacher() -> dict[str, Any]:
    """One entry of ``distillation.teacher_models`` with every verl key unset."""
    return {"key": None, "model_path": None, "num_replicas": 0,
            "inference": dict.fromkeys(TEACHER_INFERENCE_KEYS)}


@dataclass
class DistillationLossConfig:
    """How the teacher's log-probs of the sampled tokens become a loss."""
    loss_mode: str = "k3"
    """Per-token divergence of log pi_student - log pi_teacher: k1/kl, abs,
    k2/mse, k3/low_var_kl (verl's KL estimators)."""
    topk: int | None = 32
    """verl: k of the top-k forward KL (loss_mode=forward_kl_topk, not in thinkrl)."""
    use_task_rewards: bool = True
    """Keep the task's policy loss (with its entropy bonus and KL loss) beside
    the distillation term; False: the distillation term alone (pure OPD)."""
    distillation_loss_coef: float = 1.0
    """Weight of the distillation term when use_task_rewards (else 1)."""
    loss_max_clamp: float | None = None
    """Clamp each token's divergence to [-c, c]; None: no clamp."""
    log_prob_min_clamp: float | None = None
    """verl: floor on top-k log-probs (forward_kl_topk only)."""
    use_policy_gradient: bool = False
    """True: minus each token's divergence is that token's advantage in a PPO
    clipped term of its own (Thinking Machines' on-policy distillation; use
    k1); False: the divergence is minimised directly (GKD; use k3)."""
    policy_loss_mode: str = "vanilla"
    """The policy loss of that term (verl supports vanilla only)."""
    clip_ratio: float = 0.2
    """PPO clip of that term."""
    clip_ratio_low: float = 0.2
    """Lower clip of that term's ratio."""
    clip_ratio_high: float = 0.2
    """Upper clip of that term's ratio."""


@dataclass
class DistillationConfig:
    """Frozen teachers and the distillation loss."""
    enabled: bool = False
    """Turn on-policy distillation on."""
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    """The loss."""
    n_gpus_per_node: int = 8
    """verl: devices per node of the teachers' own pool (thinkrl: the training ranks)."""
    nnodes: int = 0
    """verl: nodes of the teachers' own pool."""
    teacher_models: dict[str, Any] = field(default_factory=lambda: {"teacher_model": default_teacher()})
    """Name -> {key, model_path, num_replicas, inference}: one teacher, or one
    per value of ``teacher_key`` (add more with +distillation.teacher_models.NAME.key=...)."""
    teacher_key: str = "data_source"
    """The row field whose value picks a row's teacher (each teacher's ``key``)."""
