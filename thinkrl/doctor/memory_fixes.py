"""What to change when one term of the doctor's memory estimate
(`memory.py`) is the largest: one sentence per term, naming the keys."""

from __future__ import annotations

from thinkrl.config.keys import ARR as _ARR

_ONE_DEVICE = ("one device holds all of it; with more devices (trainer.n_gpus_per_node, "
               "trainer.nnodes) FSDP2 shards it over them")
FIXES = {
    "weights": f"use a smaller model ({_ARR}.model.path): fp32 weights, gradients and AdamW "
               f"take 16 bytes per parameter and {_ONE_DEVICE}",
    "AdamW": f"use a smaller model ({_ARR}.model.path): AdamW's two fp32 moments take 8 bytes "
             f"per parameter and {_ONE_DEVICE}",
    "gradients": f"use a smaller model ({_ARR}.model.path): fp32 gradients take 4 bytes per "
                 f"parameter and {_ONE_DEVICE}",
    "reference": f"drop the KL term ({_ARR}.actor.use_kl_loss=False and "
                 "algorithm.use_kl_in_reward=False): the frozen reference copy is then not "
                 f"loaded; or use a smaller model ({_ARR}.model.path)",
    "teachers": "each distillation teacher is a frozen copy held like the reference: spread it over more "
                f"devices (trainer.n_gpus_per_node), offload it ({_ARR}.ref.fsdp_config.param_offload=True, "
                "on an accelerator), or pick a smaller teacher (distillation.teacher_models.NAME.model_path)",
    "activations": f"lower {_ARR}.actor.ppo_micro_batch_size_per_gpu (and "
                   f"{_ARR}.rollout.log_prob_micro_batch_size_per_gpu, "
                   f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu), set "
                   f"{_ARR}.model.enable_gradient_checkpointing=True, shorten "
                   "data.max_response_length, or use a smaller model",
    "critic": "the value model of PPO with a critic holds fp32 weights and AdamW (12 bytes per "
              "parameter) beside the actor on one device: point critic.model.path at a smaller model, "
              "or use a critic-free estimator (algorithm.adv_estimator=grpo, rloo, ...)",
    "critic update": "lower critic.ppo_micro_batch_size_per_gpu, set "
                     "critic.model.enable_gradient_checkpointing=True, shorten data.max_response_length, "
                     "or point critic.model.path at a smaller model",
    "KV cache": "the native engine generates a whole batch in one call: in training "
                f"data.train_batch_size x {_ARR}.rollout.n sequences (lower either), in "
                "validation data.val_batch_size x rollout.val_kwargs.n, or rollout.max_num_seqs "
                "when data.val_batch_size is unset (lower those); or shorten "
                "data.max_response_length",
    "gathered weights": f"the native engine gathers the whole model on every device for the "
                        f"rollout: use {_ARR}.rollout.name=vllm with "
                        f"{_ARR}.rollout.tensor_model_parallel_size > 1, or a smaller model",
    "vLLM share": f"lower {_ARR}.rollout.gpu_memory_utilization, or keep "
                  f"{_ARR}.rollout.free_cache_engine=True (sleep mode frees the share during "
                  f"the updates), or raise {_ARR}.rollout.tensor_model_parallel_size",
    "weight sync": f"lower {_ARR}.rollout.update_weights_bucket_megabytes",
    "build": "the sharded build holds one whole fp32 tensor (the embedding) beside the shards; "
             "spread the model over more devices (trainer.n_gpus_per_node, trainer.nnodes)",
}
