"""Settings that are accepted (verl's keys) but change nothing in this build:
`thinkrl train` prints one note per such setting at start, never silently
ignoring it."""

from __future__ import annotations

from thinkrl.config.checks import _ARR, _get, _show, execution_backend
from thinkrl.config.loading import flatten_keys
from thinkrl.config.schema import Config

# critic.* keys accepted for verl's launch lines that change nothing here.
CRITIC_VERL_ONLY = ("rollout_n", "model.tokenizer_path", "model.external_lib", "model.use_remove_padding",
                    "model.enable_activation_offload", "model.use_shm", "model.lora_alpha",
                    "model.target_modules")


def critic_keys() -> list[str]:
    """Every critic.* key (its values are compared with the defaults by `note`)."""
    return [k for k in flatten_keys(Config()) if k.startswith("critic.")]


def inactive_settings(cfg: Config) -> list[str]:
    """Notes for settings that are accepted but change nothing in this build.

    A note appears only where the value differs from its default, or where
    it is used only together with another setting that is off.
    """
    default = Config()
    notes: list[str] = []

    def note(keys: tuple[str, ...], why: str) -> None:
        for key in keys:
            if _get(cfg, key) != _get(default, key):
                notes.append(f"{key}={_show(_get(cfg, key))} has no effect: {why}")

    rollout, fsdp = f"{_ARR}.rollout", ("param_offload", "optimizer_offload", "offload_policy",
                                        "reshard_after_forward", "fsdp_size", "forward_prefetch", "wrap_policy")
    if cfg.actor_rollout_ref.rollout.name == "native":
        note(tuple(f"{rollout}.{k}" for k in (
            "gpu_memory_utilization", "enforce_eager", "free_cache_engine", "enable_chunked_prefill",
            "engine_kwargs", "tensor_model_parallel_size", "pipeline_model_parallel_size", "max_num_batched_tokens",
            "max_model_len", "max_num_seqs", "load_format", "disable_log_stats", "dtype",
        )), "it configures vLLM/SGLang and rollout.name=native")
    if execution_backend(cfg) == "local":
        note(("trainer.balance_batch",), "one process gets every response")
        note(tuple(f"{_ARR}.{role}.fsdp_config.{k}" for role in ("actor", "ref") for k in fsdp)
             + (f"{_ARR}.actor.strategy", f"{_ARR}.nccl_timeout"),
             "trainer.backend=local runs in one process without FSDP sharding")
    else:
        note(tuple(f"{_ARR}.{role}.fsdp_config.{k}" for role in ("actor", "ref")
                   for k in ("fsdp_size", "forward_prefetch", "wrap_policy", "reshard_after_forward")),
             "thinkrl shards each decoder layer, then the root, over all devices (FSDP2)")
        if cfg.trainer.device == "cpu":
            note(tuple(f"{_ARR}.{role}.fsdp_config.{k}" for role in ("actor", "ref")
                       for k in ("param_offload", "optimizer_offload", "offload_policy")),
                 "the model is in host memory already (trainer.device=cpu)")
    note((f"{_ARR}.actor.use_torch_compile", f"{_ARR}.ref.use_torch_compile"), "thinkrl does not use torch.compile")
    note(("data.video_key",), "video prompts are not supported (a row with videos is refused)")
    note(("data.dataloader_num_workers", "data.filter_overlong_prompts_workers", "data.use_shm"),
         "prompts are loaded in the main process")
    note((f"{_ARR}.model.use_liger", f"{_ARR}.model.enable_activation_offload",
          f"{_ARR}.model.use_shm", "reward_model.launch_reward_fn_async", "data.return_raw_input_ids"),
         "a verl-specific option that thinkrl does not implement")
    arr = cfg.actor_rollout_ref
    if not arr.model.use_remove_padding:
        note((f"{_ARR}.model.use_fused_kernels",), f"it is used only with {_ARR}.model.use_remove_padding=True "
             "(the shared-prompt pass)")
    elif execution_backend(cfg) == "ray" and cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes > 1:
        note((f"{_ARR}.model.use_remove_padding", f"{_ARR}.model.use_fused_kernels"),
             "FSDP2 shards take the padded forward (the shared-prompt pass reads whole weights)")
    note(tuple(key for key, used in (
        (f"{_ARR}.actor.ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz),
        (f"{rollout}.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz),
        (f"{_ARR}.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_use_dynamic_bsz),
        ("critic.ppo_max_token_len_per_gpu", cfg.critic.use_dynamic_bsz),
        ("critic.forward_max_token_len_per_gpu", cfg.critic.use_dynamic_bsz)) if not used),
         "it is used only with dynamic batch sizes (its use_dynamic_bsz switch is off)")
    if cfg.algorithm.adv_estimator != "gae":
        note(("trainer.critic_warmup", "algorithm.lam"), "only PPO with a critic (algorithm.adv_estimator=gae) "
             "uses it")
        note(tuple(critic_keys()), "the critic is built only for algorithm.adv_estimator=gae")
    else:
        note(tuple(f"critic.{k}" for k in CRITIC_VERL_ONLY), "a verl option that thinkrl's critic does "
             "not implement (or, for rollout_n and model.tokenizer_path, takes from the actor)")
        if execution_backend(cfg) == "local":
            note(tuple(f"critic.model.fsdp_config.{k}" for k in fsdp) + ("critic.strategy",),
                 "trainer.backend=local runs in one process without FSDP sharding")
        else:
            note(tuple(f"critic.model.fsdp_config.{k}" for k in fsdp[3:]),
                 "thinkrl shards each decoder layer, then the root, over all devices (FSDP2)")
            if cfg.trainer.device == "cpu":
                note(tuple(f"critic.model.fsdp_config.{k}" for k in fsdp[:3]),
                     "the model is in host memory already (trainer.device=cpu)")
    if cfg.algorithm.adv_estimator not in ("reinforce_plus_plus", "gae"):
        note(("algorithm.gamma",), "only reinforce_plus_plus and gae discount rewards")
    if cfg.algorithm.adv_estimator not in ("grpo", "grpo_passk"):
        note(("algorithm.norm_adv_by_std_in_grpo",), "only grpo and grpo_passk divide by the group std")
    loss = cfg.actor_rollout_ref.actor.policy_loss.loss_mode
    if loss != "clip_cov":
        note(tuple(f"{_ARR}.actor.policy_loss.clip_cov_{k}" for k in ("ratio", "lb", "ub")),
             "policy_loss.loss_mode is not clip_cov")
    if loss != "kl_cov":
        note((f"{_ARR}.actor.policy_loss.kl_cov_ratio", f"{_ARR}.actor.policy_loss.ppo_kl_coef"),
             "policy_loss.loss_mode is not kl_cov")
    if loss != "sapo":
        note((f"{_ARR}.actor.tau_pos", f"{_ARR}.actor.tau_neg"), "policy_loss.loss_mode is not sapo")
    if loss in ("sapo", "geo_mean"):
        note((f"{_ARR}.actor.loss_agg_mode",), f"{loss} fixes its own aggregation (see its docstring)")
    if not cfg.algorithm.filter_groups.enable:
        note(("algorithm.filter_groups.metric", "algorithm.filter_groups.max_num_gen_batches"),
             "algorithm.filter_groups.enable is False")
    if not cfg.reward_model.overlong_buffer.enable:
        note(tuple(f"reward_model.overlong_buffer.{k}" for k in ("len", "penalty_factor", "log")),
             "reward_model.overlong_buffer.enable is False")
    if not cfg.actor_rollout_ref.actor.use_kl_loss:
        note((f"{_ARR}.actor.kl_loss_coef", f"{_ARR}.actor.kl_loss_type"), "actor.use_kl_loss is False")
    if not cfg.algorithm.use_kl_in_reward:
        note(("algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
              "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl"), "algorithm.use_kl_in_reward is False")
    if cfg.reward.scorer != "r1":
        note(("reward.r1_format_weight", "reward.r1_accuracy_weight"), "reward.scorer is not r1")
    note(("data.return_raw_chat", "data.return_full_prompt",
          "data.validation_shuffle", f"{rollout}.calculate_log_probs",
          "reward_model.reward_manager"),
         "thinkrl has no equivalent for it yet (one device, one reward path)")
    actor = cfg.actor_rollout_ref.actor
    if actor.clip_ratio_low is not None and actor.clip_ratio_high is not None:
        note((f"{_ARR}.actor.clip_ratio",), "clip_ratio_low and clip_ratio_high are both set")
    return notes
