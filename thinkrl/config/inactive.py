"""Settings that are accepted (verl's keys) but change nothing in this build:
`thinkrl train` prints one note per such setting at start, never silently
ignoring it."""

from __future__ import annotations

from thinkrl.config.checks import execution_backend
from thinkrl.config.distill_checks import distillation_notes
from thinkrl.config.keys import ARR, shown, value_at
from thinkrl.config.loading import flatten_keys
from thinkrl.config.schema import Config
from thinkrl.config.schema_async import partial_rollout_on

# critic.* keys accepted for verl's launch lines that change nothing here.
CRITIC_VERL_ONLY = ("rollout_n", "model.tokenizer_path", "model.external_lib", "model.use_remove_padding",
                    "model.enable_activation_offload", "model.use_shm")


def critic_keys() -> list[str]:
    """Every critic.* key (its values are compared with the defaults by `note`)."""
    return [k for k in flatten_keys(Config()) if k.startswith("critic.")]


Notes = list[tuple[tuple[str, ...], str]]
"""(keys, why they change nothing): a note for each key whose value is not its default."""
_FSDP = ("param_offload", "optimizer_offload", "offload_policy", "reshard_after_forward", "fsdp_size",
         "forward_prefetch", "wrap_policy")
_ROLLOUT = f"{ARR}.rollout"


def inactive_settings(cfg: Config) -> list[str]:
    """Notes for settings that are accepted but change nothing in this build.

    A note appears only where the value differs from its default, or where
    it is used only together with another setting that is off.
    """
    default = Config()
    notes: list[str] = []
    for family in (_engine_notes, _multi_turn_notes, _async_notes, _backend_notes, _model_and_data_notes, _critic_notes,
                   _algorithm_notes, _loss_notes, _optim_notes):
        for keys, why in family(cfg):
            notes.extend(f"{key}={shown(value_at(cfg, key))} has no effect: {why}" for key in keys
                         if value_at(cfg, key) != value_at(default, key))
    return notes + distillation_notes(cfg)


def _engine_notes(cfg: Config) -> Notes:
    if cfg.actor_rollout_ref.rollout.name != "native":
        return []
    return [(tuple(f"{_ROLLOUT}.{k}" for k in (
        "gpu_memory_utilization", "enforce_eager", "free_cache_engine", "enable_chunked_prefill",
        "engine_kwargs", "tensor_model_parallel_size", "pipeline_model_parallel_size", "max_num_batched_tokens",
        "max_model_len", "max_num_seqs", "load_format", "disable_log_stats", "dtype",
    )), "it configures vLLM/SGLang and rollout.name=native")]


def _multi_turn_notes(cfg: Config) -> Notes:
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        return []
    # max_assistant_turns / max_user_turns and the interaction file apply to every environment
    keys = ("tool_config_path", "max_parallel_calls", "max_tool_response_length",
            "tool_response_truncate_side", "format", "tool_concurrency", "tool_timeout_s")
    return [(tuple(f"{_ROLLOUT}.multi_turn.{k}" for k in keys),
             f"it configures the tools and {_ROLLOUT}.multi_turn.enable=False")]


def _async_notes(cfg: Config) -> Notes:
    a = cfg.async_training
    if a.mode == "off":
        return [(("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step",
                  "async_training.require_batches", "async_training.partial_rollout",
                  "async_training.partial_chunk_tokens", "async_training.rollout_threads",
                  "async_training.trainer_threads",
                  f"{_ROLLOUT}.nnodes", f"{_ROLLOUT}.n_gpus_per_node"),
                 "async_training.mode=off: generation and update take turns on the same weights")]
    notes = [(("async_training.staleness_threshold", "async_training.trigger_parameter_sync_step"),
              "one_step_off always syncs every step and generates one batch ahead")] \
        if a.mode == "one_step_off" else []
    if not partial_rollout_on(a) or a.streaming:  # streaming decodes token by token: no chunks
        notes.append((("async_training.partial_chunk_tokens",),
                      "async_training.streaming=True" if a.streaming else "async_training.partial_rollout off"))
    return notes


def _backend_notes(cfg: Config) -> Notes:
    roles = ("actor", "ref")
    if execution_backend(cfg) == "local":
        return [(("trainer.balance_batch",), "one process gets every response"),
                (tuple(f"{ARR}.{role}.fsdp_config.{k}" for role in roles for k in _FSDP)
                 + (f"{ARR}.actor.strategy", f"{ARR}.nccl_timeout"),
                 "trainer.backend=local runs in one process without FSDP sharding")]
    notes = [(tuple(f"{ARR}.{role}.fsdp_config.{k}" for role in roles for k in _FSDP[3:]),
              "thinkrl shards each decoder layer, then the root, over all devices (FSDP2)")]
    if cfg.trainer.device == "cpu":
        notes.append((tuple(f"{ARR}.{role}.fsdp_config.{k}" for role in roles for k in _FSDP[:3]),
                      "the model is in host memory already (trainer.device=cpu)"))
    return notes


def _model_and_data_notes(cfg: Config) -> Notes:
    arr = cfg.actor_rollout_ref
    notes = [
        ((f"{ARR}.actor.use_torch_compile", f"{ARR}.ref.use_torch_compile"), "thinkrl does not use torch.compile"),
        (("data.video_key",), "video prompts are not supported (a row with videos is refused)"),
        (("data.dataloader_num_workers", "data.filter_overlong_prompts_workers", "data.use_shm"),
         "prompts are loaded in the main process"),
        ((f"{ARR}.model.use_liger", f"{ARR}.model.enable_activation_offload", f"{ARR}.model.use_shm",
          "reward_model.launch_reward_fn_async", "data.return_raw_input_ids"),
         "a verl-specific option that thinkrl does not implement"),
        (("data.return_raw_chat", "data.return_full_prompt", "data.validation_shuffle",
          f"{_ROLLOUT}.calculate_log_probs", "reward_model.reward_manager"),
         "thinkrl has no equivalent for it yet (one device, one reward path)"),
        (tuple(key for key, used in (
            (f"{ARR}.actor.ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz),
            (f"{_ROLLOUT}.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz),
            (f"{ARR}.ref.log_prob_max_token_len_per_gpu", arr.ref.log_prob_use_dynamic_bsz),
            ("critic.ppo_max_token_len_per_gpu", cfg.critic.use_dynamic_bsz),
            ("critic.forward_max_token_len_per_gpu", cfg.critic.use_dynamic_bsz)) if not used),
         "it is used only with dynamic batch sizes (its use_dynamic_bsz switch is off)"),
    ]
    if not arr.model.use_remove_padding:
        notes.append(((f"{ARR}.model.use_fused_kernels",), f"it is used only with "
                      f"{ARR}.model.use_remove_padding=True (the shared-prompt pass)"))
    if arr.model.lora_rank <= 0:
        notes.append((tuple(f"{ARR}.model.{k}" for k in ("lora_alpha", "target_modules", "exclude_modules",
                                                          "lora.merge")),
                      f"it configures LoRA adapters and {ARR}.model.lora_rank=0 (every weight trains)"))
    elif arr.rollout.name != "vllm":
        notes.append(((f"{ARR}.model.lora.merge",), f"only a vLLM engine holds its own weights; "
                       f"{_ROLLOUT}.name={arr.rollout.name} samples from the actor's module"))
    notes.append(((f"{ARR}.model.layered_summon",),
                  "the weight sync always gathers FSDP2 shards one tensor at a time"))
    return notes


def _critic_notes(cfg: Config) -> Notes:
    if cfg.algorithm.adv_estimator != "gae":
        return [(("trainer.critic_warmup", "algorithm.lam"),
                 "only PPO with a critic (algorithm.adv_estimator=gae) uses it"),
                (tuple(critic_keys()), "the critic is built only for algorithm.adv_estimator=gae")]
    notes = [(tuple(f"critic.{k}" for k in CRITIC_VERL_ONLY), "a verl option that thinkrl's critic does "
              "not implement (or, for rollout_n and model.tokenizer_path, takes from the actor)")]
    if cfg.critic.model.lora_rank <= 0:
        notes.append((tuple(f"critic.model.{k}" for k in ("lora_alpha", "target_modules", "exclude_modules")),
                      "it configures the critic's LoRA adapters and critic.model.lora_rank=0"))
    fsdp = tuple(f"critic.model.fsdp_config.{k}" for k in _FSDP)
    if execution_backend(cfg) == "local":
        return notes + [(fsdp + ("critic.strategy",),
                         "trainer.backend=local runs in one process without FSDP sharding")]
    notes.append((fsdp[3:], "thinkrl shards each decoder layer, then the root, over all devices (FSDP2)"))
    if cfg.trainer.device == "cpu":
        notes.append((fsdp[:3], "the model is in host memory already (trainer.device=cpu)"))
    return notes


def _algorithm_notes(cfg: Config) -> Notes:
    algo, notes = cfg.algorithm, []
    if algo.adv_estimator not in ("reinforce_plus_plus", "gae"):
        notes.append((("algorithm.gamma",), "only reinforce_plus_plus and gae discount rewards"))
    if algo.adv_estimator not in ("grpo", "grpo_passk"):
        notes.append((("algorithm.norm_adv_by_std_in_grpo",), "only grpo and grpo_passk divide by the group std"))
    if not algo.filter_groups.enable:
        notes.append((("algorithm.filter_groups.metric", "algorithm.filter_groups.max_num_gen_batches"),
                      "algorithm.filter_groups.enable is False"))
    if not cfg.reward_model.overlong_buffer.enable:
        notes.append((tuple(f"reward_model.overlong_buffer.{k}" for k in ("len", "penalty_factor", "log")),
                      "reward_model.overlong_buffer.enable is False"))
    if not algo.use_kl_in_reward:
        notes.append((("algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef",
                       "algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.target_kl"),
                      "algorithm.use_kl_in_reward is False"))
    if cfg.reward.scorer != "r1":
        notes.append((("reward.r1_format_weight", "reward.r1_accuracy_weight"), "reward.scorer is not r1"))
    return notes


def _loss_notes(cfg: Config) -> Notes:
    actor = cfg.actor_rollout_ref.actor
    loss, notes = actor.policy_loss.loss_mode, []
    if loss != "clip_cov":
        notes.append((tuple(f"{ARR}.actor.policy_loss.clip_cov_{k}" for k in ("ratio", "lb", "ub")),
                      "policy_loss.loss_mode is not clip_cov"))
    if loss != "kl_cov":
        notes.append(((f"{ARR}.actor.policy_loss.kl_cov_ratio", f"{ARR}.actor.policy_loss.ppo_kl_coef"),
                      "policy_loss.loss_mode is not kl_cov"))
    if loss != "sapo":
        notes.append(((f"{ARR}.actor.tau_pos", f"{ARR}.actor.tau_neg"), "policy_loss.loss_mode is not sapo"))
    if loss in ("sapo", "geo_mean"):
        notes.append(((f"{ARR}.actor.loss_agg_mode",), f"{loss} fixes its own aggregation (see its docstring)"))
    if not actor.use_kl_loss:
        notes.append(((f"{ARR}.actor.kl_loss_coef", f"{ARR}.actor.kl_loss_type"), "actor.use_kl_loss is False"))
    if actor.clip_ratio_low is not None and actor.clip_ratio_high is not None:
        notes.append(((f"{ARR}.actor.clip_ratio",), "clip_ratio_low and clip_ratio_high are both set"))
    return notes


def _optim_notes(cfg: Config) -> Notes:
    """A zero learning rate is accepted (a dry run of sampling and scoring may
    want it) but said: the weights never change."""
    notes = []
    if cfg.actor_rollout_ref.actor.optim.lr == 0:
        notes.append(((f"{ARR}.actor.optim.lr",), "a zero learning rate never changes the policy: "
                      "the run samples and scores but learns nothing; set a positive lr (e.g. 1e-6 "
                      "for a 7B model, the tiny recipe's 2e-4) unless that is what you want"))
    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.optim.lr == 0:
        notes.append((("critic.optim.lr",), "a zero learning rate never changes the critic, whose "
                      "values then stay those of its initial weights; set a positive lr"))
    return notes
