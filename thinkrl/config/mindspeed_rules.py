"""Each MindSpeed-RL config key and what it becomes in thinkrl.

A rule takes the key's value and the whole file (`Source`, for keys whose
meaning depends on others) and returns a `Row`: the thinkrl settings it
became, or why there are none. Every key MindSpeed-RL's two GRPO recipes use
has a rule; a key without one is an error (`thinkrl.config.mindspeed`).

Sizes, from MindSpeed-RL's source (config_cls/rl_config.py, the actor's
`update`): `global_batch_size` counts prompts per iteration;
`rl_config.mini_batch_size` counts prompts per optimizer step PER
data-parallel rank (it is multiplied by `n_samples_per_prompt` and split per
rank); `micro_batch_size` counts responses per device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from thinkrl.errors import UserError

_ARR = "actor_rollout_ref"
NPUS_PER_NODE = 8
"""Ascend servers hold 8 NPUs; larger `num_npus` span several nodes."""


@dataclass(frozen=True)
class Row:
    """One line of the translation table."""

    key: str
    """The MindSpeed-RL key, dotted (`rl_config.n_samples_per_prompt`)."""
    value: Any
    settings: dict[str, Any] = field(default_factory=dict)
    """thinkrl key -> value it became (empty: no counterpart)."""
    note: str = ""
    """How it was converted, or why it has no counterpart."""
    differs: bool = False
    """thinkrl will not do what MindSpeed-RL did with it (printed as a warning)."""


@dataclass(frozen=True)
class Source:
    """The whole MindSpeed-RL file, for rules that read more than their key."""

    sections: Mapping[str, Mapping[str, Any]]

    def get(self, dotted: str, default: Any = None) -> Any:
        section, _, key = dotted.partition(".")
        return self.sections.get(section, {}).get(key, default)

    def actor_data_parallel(self) -> int:
        """Actor data-parallel ranks: NPUs / (TP x PP)."""
        npus = (self.get("rl_config.actor_resource") or {}).get("num_npus") or 1
        tp = self.get("actor_config.tensor_model_parallel_size", 1)
        pp = self.get("actor_config.pipeline_model_parallel_size", 1)
        return max(1, npus // max(1, tp * pp))


Rule = Callable[[str, Any, Source], Row]


def to(target: str, convert: Callable[[Any], Any] = lambda v: v, note: str = "") -> Rule:
    return lambda key, value, src: Row(key, value, {target: convert(value)}, note)


def why(reason: str) -> Rule:
    return lambda key, value, src: Row(key, value, {}, reason)


_FUSION = why("Megatron kernel/fusion switch; thinkrl runs the Hugging Face model's own modules")
_MODEL = why("names the architecture in model/<name>.yaml; thinkrl reads it from the model "
             "folder's config.json")
_LAYOUT = why("Megatron TP/PP of training: thinkrl shards with FSDP2 straight from the Hugging "
              "Face folder, so there is no hf2mcore conversion and no actor/reference layout "
              "that could mismatch (seed 000's third failure)")
_MEGATRON_CKPT = why("a Megatron checkpoint converted from the Hugging Face weights; thinkrl loads "
                     "actor_rollout_ref.model.path (tokenizer_name_or_path) directly")
_NOT_LOADED = why("no Megatron checkpoint is loaded, so there is no optimizer or RNG state to skip")


def _max_prompt_length(key: str, value: Any, src: Source) -> Row:
    # MindSpeed-RL's datasets drop longer prompts (its prompt-length filter,
    # 2025-05: `sequence_lengths < max_prompt_length`); verl's default would stop the run.
    return Row(key, value, {"data.max_prompt_length": value, "data.filter_overlong_prompts": True},
               "longer prompts are dropped, as MindSpeed-RL's datasets drop them (it drops one "
               "of exactly this length too; thinkrl keeps it)")


_NO_REWARD_MODEL = why("reward model settings; thinkrl scores with rule verifiers (no reward model)")


def _model_path(key: str, value: Any, src: Source) -> Row:
    return Row(key, value, {f"{_ARR}.model.path": value},
               "the Hugging Face folder: weights, config and tokenizer are read from it")


def _dtype(key: str, value: Any, src: Source) -> Row:
    if not value:
        return Row(key, value, {f"{_ARR}.model.dtype": "float32"})
    return Row(key, value, {f"{_ARR}.model.dtype": "auto"},
               "bfloat16 compute on accelerators (float32 on CPU), float32 master weights")


def _data_path(key: str, value: Any, src: Source) -> Row:
    train = data_parquet(str(value))
    return Row(key, value, {"data.train_files": train, "data.val_files": train,
                            "data.template": "qwen_r1"},
               "a prefix of Megatron .bin/.idx files, which thinkrl does not read; it reads "
               f"{train}, written by `thinkrl prep` (`thinkrl doctor` prints the command), and "
               "renders its rows with qwen_r1 as MindSpeed-RL's R1 data configs do. No "
               "validation runs during training; data.val_files only needs a file")


def data_parquet(data_path: str) -> str:
    """Where thinkrl looks for the rows behind MindSpeed-RL's `data_path` prefix."""
    return f"{data_path.rstrip('/')}/train.parquet"


def _split(key: str, value: Any, src: Source) -> Row:
    """`train,valid,test` weights; MindSpeed-RL's recipes train on everything (100,0,0)."""
    held_out = any(float(p) for p in str(value).split(",")[1:] if p.strip())
    note = ("NOT applied: thinkrl trains on every row of data.train_files" if held_out
            else "every row trains; no validation during the run")
    return Row(key, value, {"trainer.val_before_train": False, "trainer.test_freq": -1}, note,
               differs=held_out)


def _stage(key: str, value: Any, src: Source) -> Row:
    if value != "ray_grpo":
        raise UserError(f"megatron_training.stage={value}: thinkrl translates GRPO recipes "
                         "(stage: ray_grpo) only")
    return Row(key, value, {"algorithm.adv_estimator": "grpo"}, "GRPO")


def _dropout(key: str, value: Any, src: Source) -> Row:
    if float(value) == 0.0:
        return Row(key, value, {}, "0 is what Qwen2.5's config.json says; thinkrl keeps it")
    return Row(key, value, {}, "NOT applied: thinkrl uses the dropout of the model's config.json",
               differs=True)


def _lr_style(key: str, value: Any, src: Source) -> Row:
    if value not in ("constant", "cosine"):
        raise UserError(f"actor_config.lr_decay_style={value}: thinkrl has constant and cosine "
                         "(actor_rollout_ref.actor.optim.warmup_style)")
    return Row(key, value, {f"{_ARR}.actor.optim.warmup_style": value})


def _min_lr(key: str, value: Any, src: Source) -> Row:
    lr = float(src.get("actor_config.lr", 0.0))
    ratio = float(value) / lr if lr else 0.0
    return Row(key, value, {f"{_ARR}.actor.optim.min_lr_ratio": ratio},
               f"as a fraction of lr ({value} / {lr})")


def _betas(key: str, value: Any, src: Source) -> Row:
    betas = [float(src.get("actor_config.adam_beta1", 0.9)),
             float(src.get("actor_config.adam_beta2", 0.999))]
    return Row(key, value, {f"{_ARR}.actor.optim.betas": betas})


def _mini_batch(key: str, value: Any, src: Source) -> Row:
    dp = src.actor_data_parallel()
    prompts = int(value) * dp
    gbs = int(src.get("megatron_training.global_batch_size", prompts))
    note = f"prompts per data-parallel rank x {dp} actor rank(s) = {prompts} prompts per update"
    if prompts > gbs:
        prompts = gbs
        note += f", more than a step's {gbs}: one update on the whole batch, as MindSpeed-RL does"
    return Row(key, value, {f"{_ARR}.actor.ppo_mini_batch_size": prompts}, note)


def _kl_coef(key: str, value: Any, src: Source) -> Row:
    return Row(key, value, {f"{_ARR}.actor.use_kl_loss": True, f"{_ARR}.actor.kl_loss_coef": value,
                            "algorithm.use_kl_in_reward": False},
               "MindSpeed-RL's GRPO loss adds kl_coef x KL(policy || reference) per token")


def _kl_ctrl(key: str, value: Any, src: Source) -> Row:
    if value != "fixed":
        raise UserError(f"rl_config.kl_ctrl_type={value}: thinkrl's KL loss coefficient is "
                         "fixed; use kl_ctrl_type: fixed")
    return Row(key, value, {}, "the KL loss coefficient is fixed in thinkrl")


def _adv(key: str, value: Any, src: Source) -> Row:
    if value != "group_norm":
        raise UserError(f"rl_config.adv_estimator={value}: thinkrl's GRPO is group_norm")
    return Row(key, value, {"algorithm.adv_estimator": "grpo",
                            "algorithm.norm_adv_by_std_in_grpo": True,
                            f"{_ARR}.actor.loss_agg_mode": "token-mean"},
               "(score - group mean) / group std; token-mean loss as MindSpeed-RL's masked_mean")


def _verifier_settings(src: Source) -> dict[str, Any]:
    """`verifier_function` / `verifier_weight`, MindSpeed-RL's defaults where absent."""
    return {"reward.verifiers": list(src.get("rl_config.verifier_function", ["base_acc"])),
            "reward.verifier_weights": [float(w) for w in
                                        src.get("rl_config.verifier_weight", [1.0])]}


def _rule_reward(key: str, value: Any, src: Source) -> Row:
    settings = _verifier_settings(src)
    if value:
        return Row(key, value, settings, "rule verifiers score every response")
    return Row(key, value, settings, "MindSpeed-RL scores with the reward model of reward_config; "
               f"thinkrl has none, so the verifiers {settings['reward.verifiers']} score instead",
               differs=True)


def _verifier_list(target: str) -> Rule:
    def rule(key: str, value: Any, src: Source) -> Row:
        return Row(key, value, {target: _verifier_settings(src)[target]},
                   "reward = sum of weight x verifier (thinkrl/rewards/verifiers.py)")
    return rule


def _tensorboard(key: str, value: Any, src: Source) -> Row:
    return Row(key, value, {"trainer.logger": ["console", "tensorboard"] if value else ["console"]})


def _resources(key: str, value: Any, src: Source) -> Row:
    npus = int((value or {}).get("num_npus") or 1)
    nodes = max(1, -(-npus // NPUS_PER_NODE))
    if npus % nodes:
        raise UserError(f"{key}.num_npus={npus}: spread over {nodes} nodes of {NPUS_PER_NODE} "
                         "that is uneven; use a multiple of 8 above 8")
    return Row(key, value, {"trainer.n_gpus_per_node": npus // nodes, "trainer.nnodes": nodes,
                            "trainer.device": "npu"},
               "actor, reference and rollout share these devices (MindSpeed-RL's integrated "
               "worker); on GPUs set trainer.device=cuda")


def _colocated(role: str) -> Rule:
    def rule(key: str, value: Any, src: Source) -> Row:
        actor = (src.get("rl_config.actor_resource") or {}).get("num_npus")
        mine = (value or {}).get("num_npus")
        same = mine == actor
        return Row(key, value, {}, f"the {role} shares the actor's devices in thinkrl"
                   + ("" if same else f" (not {mine} of its own)"), differs=not same)
    return rule


def _rollout_name(key: str, value: Any, src: Source) -> Row:
    return Row(key, value, {f"{_ARR}.rollout.tensor_model_parallel_size": value,
                            f"{_ARR}.rollout.name": "vllm"},
               "MindSpeed-RL generates with vLLM; the native engine runs one device (set "
               "actor_rollout_ref.rollout.name=native on CPU)")


def _offload(target: str) -> Rule:
    return to(f"{_ARR}.actor.fsdp_config.{target}",
              note="kept off the device while the rollout engine runs")


RULES: dict[str, dict[str, Rule]] = {
    "megatron_training": {
        "model": _MODEL,
        **{k: _FUSION for k in ("use_fused_rmsnorm", "use_flash_attn", "no_masked_softmax_fusion",
                                "no_gradient_accumulation_fusion", "use_fused_swiglu",
                                "use_fused_rotary_pos_emb", "use_mcore_models")},
        "attention_softmax_in_fp32": why("the Hugging Face attention computes softmax in float32"),
        "sequence_parallel": why("Megatron sequence parallelism belongs to tensor parallelism, "
                                 "which thinkrl's training does not use"),
        "use_distributed_optimizer": why("FSDP2 shards the optimizer state already"),
        "bf16": _dtype,
        "tokenizer_type": why("thinkrl always loads the Hugging Face tokenizer"),
        "tokenizer_name_or_path": _model_path,
        "global_batch_size": to("data.train_batch_size", note="prompts per step"),
        "seq_length": why("thinkrl's sequence is data.max_prompt_length "
                          "(rl_config.max_prompt_length) + data.max_response_length "
                          "(sampling_config.max_tokens)"),
        "save_interval": to("trainer.save_freq"),
        "train_iters": to("trainer.total_training_steps"),
        "stage": _stage,
        "attention_dropout": _dropout,
        "hidden_dropout": _dropout,
        "init_method_std": why("weights are loaded, not initialised"),
        "distributed_backend": why("chosen from the device (nccl on cuda, hccl on npu, gloo on cpu)"),
        "no_shared_storage": why("thinkrl's checkpoints go to trainer.default_local_dir; several "
                                 "nodes need it on a shared file system"),
        "variable_seq_lengths": why("thinkrl pads each micro-batch to its own longest sequence"),
        "norm_epsilon": _MODEL,
        "dataset_additional_keys": why("the label is each parquet row's reward_model.ground_truth"),
        "data_path": _data_path,
        "split": _split,
    },
    "actor_config": {
        "model": _MODEL,
        "micro_batch_size": to(f"{_ARR}.actor.ppo_micro_batch_size_per_gpu",
                               note="responses per device per forward/backward"),
        "tensor_model_parallel_size": _LAYOUT,
        "pipeline_model_parallel_size": _LAYOUT,
        "lr": to(f"{_ARR}.actor.optim.lr"),
        "lr_decay_style": _lr_style,
        "min_lr": _min_lr,
        "weight_decay": to(f"{_ARR}.actor.optim.weight_decay"),
        "lr_warmup_fraction": to(f"{_ARR}.actor.optim.lr_warmup_steps_ratio"),
        "clip_grad": to(f"{_ARR}.actor.grad_clip"),
        "adam_beta1": _betas,
        "adam_beta2": _betas,
        "initial_loss_scale": why("float16 loss scaling; thinkrl computes in bfloat16 without one"),
        "finetune": why("thinkrl starts from the model folder's weights at step 0 with a fresh "
                        "optimizer (it resumes only its own checkpoints)"),
        "load": _MEGATRON_CKPT,
        "save": to("trainer.default_local_dir", note="the run folder: checkpoints, metrics, config"),
        "no_load_optim": _NOT_LOADED,
        "no_load_rng": _NOT_LOADED,
    },
    "ref_config": {
        "model": _MODEL,
        "tensor_model_parallel_size": _LAYOUT,
        "pipeline_model_parallel_size": _LAYOUT,
        "micro_batch_size": to(f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu",
                               note="responses per device per reference forward"),
        "load": why("the reference is the initial weights of actor_rollout_ref.model.path"),
        "no_load_optim": _NOT_LOADED,
        "no_load_rng": _NOT_LOADED,
    },
    "reward_config": {k: _NO_REWARD_MODEL for k in (
        "model", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
        "load", "no_load_optim", "no_load_rng")},
    "rl_config": {
        "guarantee_order": why("Ray transfer-dock scheduling; thinkrl's driver runs the stages "
                               "in order"),
        "blocking": why("Ray transfer-dock scheduling; thinkrl's driver runs the stages in order"),
        "gamma": to("algorithm.gamma", note="unused by GRPO"),
        "lam": to("algorithm.lam", note="unused by GRPO"),
        "adv_estimator": _adv,
        "kl_penalty": to(f"{_ARR}.actor.kl_loss_type", note="the same estimator names as verl"),
        "kl_ctrl_type": _kl_ctrl,
        "init_kl_coef": _kl_coef,
        "mini_batch_size": _mini_batch,
        "max_prompt_length": _max_prompt_length,
        "epochs": to(f"{_ARR}.actor.ppo_epochs"),
        "clip_ratio": to(f"{_ARR}.actor.clip_ratio"),
        "entropy_coeff": to(f"{_ARR}.actor.entropy_coeff",
                            note="loss - entropy_coeff x entropy, as MindSpeed-RL"),
        "shuffle_mini_batch": to(f"{_ARR}.actor.shuffle"),
        "n_samples_per_prompt": to(f"{_ARR}.rollout.n"),
        "rule_reward": _rule_reward,
        "verifier_function": _verifier_list("reward.verifiers"),
        "verifier_weight": _verifier_list("reward.verifier_weights"),
        "verifier_parallel": to("reward.num_workers", note="scoring processes"),
        "verifier_timeout": to("reward.timeout_s",
                               note="seconds per response (MindSpeed-RL: per batch call)"),
        "use_tensorboard": _tensorboard,
        "num_cpus_for_local_task": why("Ray CPU reservation of MindSpeed-RL's driver task"),
        "num_cpus_for_placement_group": why("Ray CPU reservation of MindSpeed-RL's placement group"),
        "actor_resource": _resources,
        "reference_resource": _colocated("reference"),
        "reward_resource": _colocated("reward model"),
    },
    "generate_config": {
        "micro_batch_size": why("not a vLLM setting: vLLM batches up to max_num_seqs"),
        "trust_remote_code": to(f"{_ARR}.model.trust_remote_code"),
        "infer_tensor_parallel_size": _rollout_name,
        "infer_pipeline_parallel_size": to(f"{_ARR}.rollout.pipeline_model_parallel_size"),
        "infer_expert_parallel_size": why("expert parallelism is for MoE models; Qwen2.5 is dense"),
        "max_num_seqs": to(f"{_ARR}.rollout.max_num_seqs"),
        "max_model_len": to(f"{_ARR}.rollout.max_model_len"),
        "dtype": to(f"{_ARR}.rollout.dtype"),
        "gpu_memory_utilization": to(f"{_ARR}.rollout.gpu_memory_utilization"),
        "offload_train_optimizer": _offload("optimizer_offload"),
        "offload_train_param": _offload("param_offload"),
        "offload_train_grad": why("gradients are freed after each optimizer step"),
        "num_scheduler_steps": to(f"{_ARR}.rollout.engine_kwargs.vllm.num_scheduler_steps",
                                  note="passed to vLLM"),
        "sampling_config.logprobs": why("the rollout returns each sampled token's log-prob"),
        "sampling_config.max_tokens": to("data.max_response_length"),
        "sampling_config.top_p": to(f"{_ARR}.rollout.top_p"),
        "sampling_config.top_k": to(f"{_ARR}.rollout.top_k"),
        "sampling_config.min_p": to(f"{_ARR}.rollout.min_p"),
        "sampling_config.temperature": to(f"{_ARR}.rollout.temperature"),
        "sampling_config.detokenize": why("thinkrl decodes responses for the reward itself"),
        "sampling_config.seed": to(f"{_ARR}.rollout.seed"),
    },
}


DEFAULTS: dict[str, Any] = {
    "rl_config.rule_reward": True,
    "rl_config.adv_estimator": "group_norm",
    "rl_config.init_kl_coef": 0.01,
    "rl_config.kl_penalty": "low_var_kl",
    "rl_config.mini_batch_size": 1,
    "rl_config.max_prompt_length": 512,
    "rl_config.entropy_coeff": 0.0,
    "rl_config.n_samples_per_prompt": 1,
}
"""MindSpeed-RL's defaults (config_cls/rl_config.py) that differ from thinkrl's or
imply other settings: a file without the key is translated as if it had this value."""
