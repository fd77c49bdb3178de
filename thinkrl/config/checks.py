"""Cross-field checks of a loaded ``Config`` and the batch sizes they imply.

``validate`` gathers every problem and raises one ``ValueError`` that lists
them all (key, value, what to do), so a launch line is fixed in one go. On
success it returns ``DerivedSizes``: how one training step splits into
mini-batches, devices and micro-batches, printed at start by the trainer.

Sizes follow verl: ``data.train_batch_size`` and ``ppo_mini_batch_size``
count PROMPTS; every micro-batch size counts RESPONSES (prompt x rollout.n).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thinkrl.config.choices import (ADV_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES,
                                    POLICY_LOSS_MODES, REWARD_SCORERS, TEMPLATES, divisors,
                                    near_divisors)
from thinkrl.config.async_checks import async_problems
from thinkrl.config.critic_checks import critic_problems, uses_critic
from thinkrl.config.distill_checks import distillation_problems, needs_reference
from thinkrl.config.keys import ARR, shown, value_at
from thinkrl.config.lora_checks import lora_problems
from thinkrl.config.moe_checks import moe_problems
from thinkrl.config.multi_turn_checks import multi_turn_problems
from thinkrl.config.schema import Config
from thinkrl.config.schema_roles import SAVE_CONTENTS
from thinkrl.config.sizes import DerivedSizes, derive_sizes, micro_size
from thinkrl.config.verifier_checks import reward_verifier_problems
from thinkrl.errors import UserError
from thinkrl.loggers import unknown_loggers

__all__ = ["DerivedSizes", "execution_backend", "validate"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "algorithm.adv_estimator": ADV_ESTIMATORS,
    f"{ARR}.actor.policy_loss.loss_mode": POLICY_LOSS_MODES,
    "algorithm.kl_penalty": KL_ESTIMATORS,
    "algorithm.kl_ctrl.type": ("fixed", "adaptive"),
    f"{ARR}.actor.loss_agg_mode": LOSS_AGG_MODES,
    f"{ARR}.actor.kl_loss_type": KL_ESTIMATORS,
    f"{ARR}.actor.strategy": ("fsdp", "fsdp2"),
    f"{ARR}.actor.optim.warmup_style": ("constant", "cosine"),
    f"{ARR}.model.dtype": ("auto", "float32", "bfloat16", "float16"),
    f"{ARR}.rollout.name": ("native", "vllm", "sglang"),
    f"{ARR}.rollout.dtype": ("auto", "float32", "bfloat16", "float16"),
    f"{ARR}.rollout.mode": ("sync",),
    "algorithm.rollout_is_level": ("token", "sequence"),
    "algorithm.rollout_is_mode": ("truncate", "mask"),
    "data.truncation": ("error", "left", "right", "middle"),
    "data.template": TEMPLATES,
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    "trainer.device": ("auto", "cpu", "cuda", "npu"),
    "trainer.backend": ("auto", "local", "ray"),
    "trainer.dist_init_method": ("auto", "file", "tcp"),
    "reward.scorer": REWARD_SCORERS,
}
_POSITIVE = (
    "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    f"{ARR}.actor.ppo_mini_batch_size", f"{ARR}.actor.ppo_epochs", f"{ARR}.rollout.n",
    f"{ARR}.rollout.val_kwargs.n", "trainer.total_epochs", "trainer.nnodes", "trainer.n_gpus_per_node",
    f"{ARR}.rollout.tensor_model_parallel_size", f"{ARR}.rollout.pipeline_model_parallel_size",
)
_POSITIVE_IF_SET = (
    f"{ARR}.actor.ppo_micro_batch_size", f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
    f"{ARR}.rollout.log_prob_micro_batch_size", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    f"{ARR}.ref.log_prob_micro_batch_size", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
    f"{ARR}.rollout.prompt_length", f"{ARR}.rollout.response_length", f"{ARR}.rollout.max_model_len",
    "data.val_batch_size", "trainer.total_training_steps", "trainer.max_actor_ckpt_to_keep",
    "data.gen_batch_size",
)
# verl's deprecated micro-batch counts over all devices, beside their per-device keys
_DEPRECATED_PAIRS = tuple((f"{ARR}.{role}.{name}", f"{ARR}.{role}.{name}_per_gpu") for role, name in (
    ("actor", "ppo_micro_batch_size"), ("rollout", "log_prob_micro_batch_size"),
    ("ref", "log_prob_micro_batch_size"))) + tuple(
    (f"critic.{name}", f"critic.{name}_per_gpu") for name in ("ppo_micro_batch_size", "forward_micro_batch_size"))
# key -> (is the value accepted, what to do otherwise)
_SAVE_CONTENTS_RULE = (
    lambda v: set(v) <= set(SAVE_CONTENTS) and bool({"model", "hf_model"} & set(v)),
    f"list what to save from {', '.join(SAVE_CONTENTS)}, the weights included: "
    "[model,optimizer,extra] (resumable, the default) or [model] (weights only, for export)")
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    f"{ARR}.actor.checkpoint.save_contents": _SAVE_CONTENTS_RULE,
    "critic.checkpoint.save_contents": _SAVE_CONTENTS_RULE,
    f"{ARR}.actor.clip_ratio": (lambda v: 0 < v < 1, "use a value in (0, 1), e.g. 0.2"),
    f"{ARR}.actor.clip_ratio_low": (lambda v: v is None or v > 0, "use a value in (0, 1), e.g. 0.2, or null"),
    f"{ARR}.actor.clip_ratio_high": (lambda v: v is None or v > 0, "use a value > 0, e.g. 0.28, or null"),
    f"{ARR}.actor.clip_ratio_c": (lambda v: v > 1, "dual-clip needs a bound > 1, e.g. 3.0"),
    f"{ARR}.actor.grad_clip": (lambda v: v > 0, "use a norm > 0, e.g. 1.0"),
    f"{ARR}.actor.kl_loss_coef": (lambda v: v >= 0, "use a weight >= 0, e.g. 0.001"),
    f"{ARR}.actor.optim.lr": (lambda v: v >= 0, "use a learning rate >= 0, e.g. 1e-6"),
    f"{ARR}.actor.optim.weight_decay": (lambda v: v >= 0, "use a value >= 0, e.g. 0.01"),
    f"{ARR}.actor.optim.eps": (lambda v: v > 0, "use a value > 0, e.g. 1e-8"),
    f"{ARR}.actor.optim.betas": (
        lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "give two values in [0, 1), e.g. [0.9,0.999]"
    ),
    f"{ARR}.actor.optim.min_lr_ratio": (lambda v: 0 <= v <= 1, "use a fraction in [0, 1]"),
    f"{ARR}.actor.optim.lr_warmup_steps_ratio": (lambda v: 0 <= v <= 1, "use a fraction in [0, 1]"),
    f"{ARR}.rollout.temperature": (lambda v: v >= 0, "use a temperature >= 0, e.g. 1.0"),
    f"{ARR}.rollout.top_p": (lambda v: 0 < v <= 1, "use a value in (0, 1], e.g. 1.0"),
    f"{ARR}.rollout.top_k": (lambda v: v == -1 or v >= 1, "use -1 (keep all tokens) or a count >= 1"),
    f"{ARR}.rollout.min_p": (lambda v: 0 <= v < 1, "use a value in [0, 1), e.g. 0.0 (off) or 0.05"),
    f"{ARR}.rollout.val_kwargs.temperature": (lambda v: v >= 0, "use a temperature >= 0, e.g. 0.0"),
    f"{ARR}.rollout.val_kwargs.top_p": (lambda v: 0 < v <= 1, "use a value in (0, 1], e.g. 1.0"),
    f"{ARR}.rollout.val_kwargs.top_k": (lambda v: v == -1 or v >= 1, "use -1 (keep all tokens) or a count >= 1"),
    f"{ARR}.rollout.gpu_memory_utilization": (lambda v: 0 < v <= 1, "use a fraction in (0, 1], e.g. 0.5"),
    f"{ARR}.rollout.update_weights_bucket_megabytes": (lambda v: v >= 1, "use a size >= 1 MB, e.g. 512"),
    f"{ARR}.rollout.attest_stride": (lambda v: v >= 0, "use 1 (every weight at every sync), k > 1 "
                                                       "(every k-th layer per sync) or 0 (off)"),
    "algorithm.rollout_is_threshold": (lambda v: v > 1, "use a bound > 1 on the importance weight, e.g. 2.0"),
    "algorithm.kl_ctrl.kl_coef": (lambda v: v >= 0, "use a coefficient >= 0, e.g. 0.001"),
    f"{ARR}.actor.tau_pos": (lambda v: v > 0, "SAPO's gate temperature must be > 0, e.g. 1.0"),
    f"{ARR}.actor.tau_neg": (lambda v: v > 0, "SAPO's gate temperature must be > 0, e.g. 1.05"),
    f"{ARR}.actor.policy_loss.clip_cov_ratio": (lambda v: 0 < v <= 1, "use a fraction in (0, 1], e.g. 0.0002"),
    f"{ARR}.actor.policy_loss.kl_cov_ratio": (lambda v: 0 < v <= 1, "use a fraction in (0, 1], e.g. 0.0002"),
    f"{ARR}.actor.policy_loss.ppo_kl_coef": (lambda v: v >= 0, "use a weight >= 0, e.g. 0.1"),
    "reward_model.overlong_buffer.penalty_factor": (lambda v: v >= 0, "use a penalty >= 0, e.g. 1.0"),
    "trainer.log_val_generations": (lambda v: v >= 0, "use a count >= 0"),
    "reward.timeout_s": (lambda v: 0 < v < float("inf"), "use seconds per response > 0, e.g. 10"),
    "trainer.ray_wait_timeout_s": (lambda v: 0 < v < float("inf"), "use seconds > 0, e.g. 1800"),
    "reward.num_workers": (lambda v: v >= 0, "use 0 (score in the trainer process) or a worker count, e.g. 2"),
    "reward.zero_reward_warn_steps": (lambda v: v >= 0, "use a step count >= 0 (0 never warns)"),
    "reward.max_failure_rate": (lambda v: 0 < v <= 1, "use a share in (0, 1], e.g. 0.5 (1.0 never stops)"),
    "reward.failure_window_steps": (lambda v: v >= 1, "use a step count >= 1, e.g. 3"),
    "reward.format_score": (lambda v: abs(v) < float("inf"), "use a finite score, e.g. 0.0 or 0.1"),
    "reward.r1_format_weight": (lambda v: abs(v) < float("inf"), "use a finite weight, e.g. 0.5"),
    "reward.r1_accuracy_weight": (lambda v: abs(v) < float("inf"), "use a finite weight, e.g. 1.0"),
}
# key -> (value that is not supported, what to do)
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    f"{ARR}.actor.ulysses_sequence_parallel_size": (lambda v: v != 1, "sequence parallelism is not implemented; use 1"),
    f"{ARR}.hybrid_engine": (lambda v: not v, "only colocated actor and rollout are implemented; set it to True"),
    "reward_model.enable": (bool, "reward models are not implemented; set False (reward functions score)"),
}


def validate(cfg: Config) -> DerivedSizes:
    """Check ``cfg`` as a whole; raise one ``ValueError`` listing every problem.

    Returns the derived sizes when all checks pass.
    """
    problems: list[str] = []

    def bad(key: str, fix: str) -> None:
        problems.append(f"  - {key}={shown(value_at(cfg, key))}: {fix}")

    for key in _POSITIVE:
        if value_at(cfg, key) < 1:
            bad(key, "must be a whole number >= 1")
    for key in _POSITIVE_IF_SET:
        if value_at(cfg, key) is not None and value_at(cfg, key) < 1:
            bad(key, "must be a whole number >= 1, or null to use the default")
    sizes_ok = not problems  # the divisibility checks below divide by these
    for key, allowed in _CHOICES.items():
        if value_at(cfg, key) not in allowed:
            implemented = "thinkrl implements only" if len(allowed) == 1 else "use one of"
            bad(key, f"{implemented}: {', '.join(allowed)}")
    for key, (ok, fix) in _RANGES.items():
        if not ok(value_at(cfg, key)):
            bad(key, fix)
    for key, (unsupported, fix) in _UNSUPPORTED.items():
        if unsupported(value_at(cfg, key)):
            bad(key, fix)
    with_ref = needs_reference(cfg) or cfg.distillation.enabled  # the teachers read ref.* too
    for total, per_device in _DEPRECATED_PAIRS:  # verl refuses both too (for the roles it builds)
        built = not (total.startswith("critic.") and not uses_critic(cfg)
                     or total.startswith(f"{ARR}.ref.") and not with_ref)
        if built and value_at(cfg, total) is not None and value_at(cfg, per_device) is not None:
            bad(total, f"{per_device}={value_at(cfg, per_device)} is set too, and only one counts: "
                       f"keep {per_device} (per device) and remove {total} (verl's deprecated "
                       "count over all devices)")
    _check_combinations(cfg, bad, problems)
    if sizes_ok:
        _check_divisibility(cfg, problems)
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise UserError(f"the config has {count}:\n" + "\n".join(problems))
    return derive_sizes(cfg)


def _check_combinations(cfg: Config, bad: Callable[[str, str], None], problems: list[str]) -> None:
    arr = cfg.actor_rollout_ref
    if cfg.data.val_template is not None and cfg.data.val_template not in TEMPLATES:
        bad("data.val_template", f"use one of: {', '.join(TEMPLATES)}, or null for data.template's")
    if cfg.algorithm.adv_estimator == "grpo" and arr.rollout.n == 1:
        bad(f"{ARR}.rollout.n", "GRPO compares responses within a group, so n=1 gives all-zero advantages; "
            "set actor_rollout_ref.rollout.n>=2 (e.g. 5)")
    if arr.actor.use_kl_loss and cfg.algorithm.use_kl_in_reward:
        problems.append(
            f"  - {ARR}.actor.use_kl_loss=True and algorithm.use_kl_in_reward=True: this counts the KL twice; "
            "pick one (GRPO uses the loss: set algorithm.use_kl_in_reward=False)"
        )
    for problem in unknown_loggers(cfg.trainer.logger):  # a missing package: the doctor's environment/loggers
        problems.append(f"  - trainer.logger={shown(cfg.trainer.logger)}: {problem}")
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        bad("trainer.resume_from_path", "trainer.resume_mode=resume_path needs the checkpoint path here")
    if cfg.custom_reward_function.path and cfg.reward.scorer != "auto":
        problems.append(
            f"  - custom_reward_function.path={cfg.custom_reward_function.path} and reward.scorer="
            f"{cfg.reward.scorer}: the custom function scores every row, so reward.scorer would be "
            "ignored; remove one of them")
    problems.extend(f"  - {problem}" for problem in
                    reward_verifier_problems(cfg.reward, cfg.custom_reward_function.path))
    _check_algorithm(cfg, bad)
    problems.extend(critic_problems(cfg))
    problems.extend(async_problems(cfg, execution_backend(cfg)))
    problems.extend(multi_turn_problems(cfg))
    problems.extend(lora_problems(cfg))
    problems.extend(distillation_problems(cfg))
    problems.extend(moe_problems(cfg))
    _check_truncated_logprobs(cfg, bad)
    pixels = (cfg.data.min_pixels, cfg.data.max_pixels)
    if any(p is not None and p < 28 * 28 for p in pixels):  # one merged patch of 28 x 28
        bad("data.min_pixels" if pixels[0] is not None and pixels[0] < 784 else "data.max_pixels",
            "an image needs at least 784 pixels (one 28 x 28 vision token)")
    elif None not in pixels and pixels[0] > pixels[1]:
        bad("data.min_pixels", f"must not exceed data.max_pixels={pixels[1]}")
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    if cfg.trainer.backend == "local" and world > 1:
        bad("trainer.backend", f"the local backend drives one device, but trainer.n_gpus_per_node x "
            f"trainer.nnodes = {world}; use trainer.backend=ray (or auto), or one device")
    tp = arr.rollout.tensor_model_parallel_size
    if arr.rollout.name != "native" and tp >= 1 and world >= 1 and world % tp:
        bad(f"{ARR}.rollout.tensor_model_parallel_size",
            f"must divide the device count {world} (trainer.n_gpus_per_node x trainer.nnodes); "
            f"use one of {', '.join(map(str, divisors(world)))}")


def truncates(rollout) -> bool:
    """Whether the training rollout samples from a truncated distribution."""
    return rollout.top_p < 1 or rollout.top_k > 0 or rollout.min_p > 0


def _check_truncated_logprobs(cfg: Config, bad: Callable[[str, str], None]) -> None:
    """vLLM's log-probs of a truncated, tempered distribution are not the
    trainer's; refused where they enter the update (see accept_truncated_logprobs)."""
    arr = cfg.actor_rollout_ref
    rollout = arr.rollout
    if rollout.name != "vllm" or not truncates(rollout) or rollout.temperature == 1 \
            or rollout.accept_truncated_logprobs:
        return
    uses = [key for key, on in (("algorithm.rollout_is=True", cfg.algorithm.rollout_is),
                                (f"{ARR}.actor.use_rollout_log_probs=True", arr.actor.use_rollout_log_probs),
                                (f"async_training.mode={cfg.async_training.mode}",
                                 cfg.async_training.mode != "off")) if on]
    if uses:
        bad(f"{ARR}.rollout.temperature",
            f"with top_p={rollout.top_p}, top_k={rollout.top_k}, min_p={rollout.min_p}, vLLM reports "
            "log-probs renormalised over the kept tokens while the trainer's are over all of them, and "
            f"{uses[0]} puts their ratio (off by log(kept mass)) into the update; set temperature=1 "
            "(vLLM then reports the untruncated log-probs), or top_p=1, top_k=-1, min_p=0, or accept "
            f"the bias with {ARR}.rollout.accept_truncated_logprobs=True")


def execution_backend(cfg: Config) -> str:
    """trainer.backend with "auto" resolved: local for one device, ray for more."""
    if cfg.trainer.backend != "auto":
        return cfg.trainer.backend
    return "ray" if cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1 else "local"


# Estimators that compare the responses to one prompt need two of them at least.
_GROUP_ESTIMATORS = ("grpo", "rloo", "opo", "grpo_passk", "gpg", "reinforce_plus_plus_baseline")


def _check_algorithm(cfg: Config, bad: Callable[[str, str], None]) -> None:
    """Settings of the advantage estimators, policy losses and DAPO switches."""
    algo, arr = cfg.algorithm, cfg.actor_rollout_ref
    if algo.adv_estimator in _GROUP_ESTIMATORS[1:] and arr.rollout.n == 1:
        bad(f"{ARR}.rollout.n", f"{algo.adv_estimator} compares the responses to one prompt, so it needs "
            "actor_rollout_ref.rollout.n>=2 (e.g. 4)")
    loss = arr.actor.policy_loss
    low = arr.actor.clip_ratio_low
    if low is not None and low >= 1 and loss.loss_mode != "cispo":
        bad(f"{ARR}.actor.clip_ratio_low", "use a value in (0, 1), e.g. 0.2, or null (only "
            "policy_loss.loss_mode=cispo takes >= 1, meaning no lower bound on its weight)")
    if loss.clip_cov_lb >= loss.clip_cov_ub:
        bad(f"{ARR}.actor.policy_loss.clip_cov_lb",
            f"must be below policy_loss.clip_cov_ub={loss.clip_cov_ub} (verl: 1.0 and 5.0)")
    groups = algo.filter_groups
    if groups.enable and not groups.metric:
        bad("algorithm.filter_groups.metric", "dynamic sampling needs the value whose constant groups are "
            "dropped: set algorithm.filter_groups.metric=acc (or score, seq_reward, seq_final_reward)")
    if groups.enable and arr.rollout.n == 1:
        bad(f"{ARR}.rollout.n", "a group of one response is never constant, so dynamic sampling would "
            "drop nothing; set rollout.n>=2 or algorithm.filter_groups.enable=False")
    if groups.enable and groups.metric == "seq_final_reward" and algo.use_kl_in_reward:
        bad("algorithm.filter_groups.metric", "groups are filtered before the KL-in-reward penalty is "
            "computed here; use seq_reward, or algorithm.use_kl_in_reward=False")
    gen = cfg.data.gen_batch_size
    if gen is not None and not groups.enable and gen != cfg.data.train_batch_size:
        bad("data.gen_batch_size", "it sizes the generation batches of dynamic sampling only; set "
            "algorithm.filter_groups.enable=True or remove data.gen_batch_size")
    buffer = cfg.reward_model.overlong_buffer
    length = arr.rollout.response_length or cfg.data.max_response_length
    if buffer.enable and not 0 < buffer.len <= length:
        bad("reward_model.overlong_buffer.len", f"the penalty ramps over the last `len` tokens of the "
            f"{length}-token response limit; use 0 < len <= {length} (DAPO: a fifth of it)")


def _check_divisibility(cfg: Config, problems: list[str]) -> None:
    actor, n = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout.n
    train, mini = cfg.data.train_batch_size, actor.ppo_mini_batch_size
    world = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    devices = (
        f"{world} devices (trainer.n_gpus_per_node {cfg.trainer.n_gpus_per_node} x trainer.nnodes {cfg.trainer.nnodes})"
    )
    mini_key, micro_key = f"{ARR}.actor.ppo_mini_batch_size", f"{ARR}.actor.ppo_micro_batch_size"
    if train % mini:
        problems.append(
            f"  - data.train_batch_size={train} is not a multiple of {mini_key}={mini}: each step's prompts must "
            f"split into whole mini-batches; set {mini_key} to a divisor of {train} "
            f"(e.g. {near_divisors(train, mini)}) or data.train_batch_size to a multiple of {mini}"
        )
    if (train * n) % world and not (mini * n) % world:  # else the mini-batch message below says it
        problems.append(
            f"  - responses per step = data.train_batch_size {train} x {ARR}.rollout.n {n} = {train * n} do not "
            f"split evenly over {devices}; change data.train_batch_size, rollout.n or the device count"
        )
    if (mini * n) % world:
        problems.append(
            f"  - responses per mini-batch = {mini_key} {mini} x {ARR}.rollout.n {n} = {mini * n} do not split "
            f"evenly over {devices}; change {mini_key}, rollout.n or the device count so that "
            f"{mini * n} is a multiple of {world}"
        )
        return
    for role in ("actor", "rollout", "ref"):
        prefix = "ppo_" if role == "actor" else "log_prob_"
        key = f"{ARR}.{role}.{prefix}micro_batch_size"
        size = value_at(cfg, key)
        if size is not None and value_at(cfg, f"{key}_per_gpu") is None and size % world:
            problems.append(
                f"  - {key}={size} (deprecated, counted over all devices) is not a multiple of the {devices}; "
                f"set {key}_per_gpu instead (e.g. {key}_per_gpu={max(size // world, 1)})"
            )
    per_device = mini * n // world
    micro, source = micro_size(cfg, "actor", fallback=per_device)
    if per_device % micro:
        problems.append(
            f"  - responses per mini-batch per device = {mini * n} / {world} = {per_device} is not a multiple of "
            f"the micro-batch size {micro} ({source}); set {micro_key}_per_gpu to a divisor of {per_device} "
            f"(e.g. {near_divisors(per_device, micro)})"
        )
