"""Memory checks: an estimate of one device's peak memory against its size,
and of the host RAM an accelerator run needs beside it.

Estimate per device (P parameters from `model.estimate_param_count`, the
fp32 terms divided by the devices FSDP shards over: 1 on the local backend):

    weights      4 P          fp32 master weights (mixed precision)
    gradients    4 P          fp32, alive during the update only
    AdamW        8 P          two fp32 moments
    reference    c P          frozen copy in the compute dtype (fp32 on a CPU), when a
                              KL term is on
    activations  L * b*s*h * (34 + 5*a*s/h) * c/2 + b*s*V*(c + 4)
                 per micro-batch of b responses, s = prompt + response
                 tokens, c bytes per compute element (4 fp32, 2 bf16).
                 The first term is Korthikanti et al. 2022 (16-bit, no
                 recomputation); the 5as/h part (attention scores) is
                 dropped on accelerators, whose fused attention never
                 materialises the scores. With gradient checkpointing only
                 each layer's input (c*b*s*h) is kept, plus one layer's full
                 set. The last term is the logits and their fp32 log-softmax.
    KV cache     2 * L * k * d * s * n_seq * c   + n_seq * V * 4 (sampling logits)
                 n_seq sequences generated at once (train batch x rollout.n,
                 or a validation batch x val_kwargs.n, the larger).

    critic       12 P         PPO with a critic (algorithm.adv_estimator=gae): the
                              value model's fp32 weights and AdamW moments, assumed
                              the policy's size (critic.model.path defaults to it)
    critic update 4 P + activations of a critic micro-batch (its gradients; the
                 activation formula above with critic.ppo_micro_batch_size_per_gpu,
                 critic.model.enable_gradient_checkpointing and a one-number head
                 instead of the logits)

    peak = weights + AdamW + reference + critic
           + max(gradients + activations, critic update, KV cache)

The rollout and the two updates never overlap, so the largest phase counts.
It is a planning estimate (within tens of percent), not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from thinkrl.assets import val_batch_size
from thinkrl.config.checks import execution_backend
from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, gib, ok, warn

WARN_FRACTION = 0.85
_ARR = "actor_rollout_ref"
_ONE_DEVICE = ("one device holds all of it; with more devices (trainer.n_gpus_per_node, "
               "trainer.nnodes) FSDP2 shards it over them")
FIXES = {
    # Only what the native engine accepts now (thinkrl.preflight.check_backend
    # refuses other engines).
    "weights": f"use a smaller model ({_ARR}.model.path): fp32 weights, gradients and AdamW "
               f"take 16 bytes per parameter and {_ONE_DEVICE}",
    "AdamW": f"use a smaller model ({_ARR}.model.path): AdamW's two fp32 moments take 8 bytes "
             f"per parameter and {_ONE_DEVICE}",
    "gradients": f"use a smaller model ({_ARR}.model.path): fp32 gradients take 4 bytes per "
                 f"parameter and {_ONE_DEVICE}",
    "reference": f"drop the KL term ({_ARR}.actor.use_kl_loss=False and "
                 "algorithm.use_kl_in_reward=False): the frozen reference copy is then not "
                 f"loaded; or use a smaller model ({_ARR}.model.path)",
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
}


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per device, by term."""
    weights: int
    gradients: int
    optimizer: int
    reference: int
    activations: int
    kv_cache: int
    sequences: int
    """Sequences in flight during generation."""
    critic: int = 0
    """The value model's weights and AdamW state (PPO with a critic)."""
    critic_update: int = 0
    """The critic's gradients and the activations of one critic micro-batch."""

    @property
    def peak(self) -> int:
        return self.weights + self.optimizer + self.reference + self.critic + max(
            self.gradients + self.activations, self.critic_update, self.kv_cache)

    def terms(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "AdamW": self.optimizer,
                "reference": self.reference, "critic": self.critic, "activations": self.activations,
                "critic update": self.critic_update, "KV cache": self.kv_cache}


def estimate_memory(ctx: DoctorContext) -> MemoryEstimate:
    """The formulas of the module docstring for this run."""
    cfg, sizes, params = ctx.cfg, ctx.sizes, ctx.param_count
    config = ctx.model_config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    h, layers, vocab, heads = text.hidden_size, text.num_hidden_layers, text.vocab_size, text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or h // heads
    accelerator = ctx.device_kind != "cpu"
    dtype = cfg.actor_rollout_ref.model.dtype
    c = 4 if dtype == "float32" or (dtype == "auto" and not accelerator) else 2
    shards = sizes.world_size if execution_backend(cfg) == "ray" else 1
    arr = cfg.actor_rollout_ref

    s = sizes.prompt_length + sizes.response_length

    def layer_activations(b: int, checkpointing: bool) -> float:
        per_layer_16bit = b * s * h * (34 + (0 if accelerator else 5 * heads * s / h))
        if checkpointing:
            return layers * c * b * s * h + per_layer_16bit * c / 2
        return layers * per_layer_16bit * c / 2

    b = sizes.micro_batch_size_per_device
    activations = int(layer_activations(b, arr.model.enable_gradient_checkpointing) + b * s * vocab * (c + 4))
    critic = critic_update = 0
    if sizes.critic is not None:  # PPO with a critic, assumed the policy's size
        critic = 12 * params // shards
        critic_update = 4 * params // shards + int(layer_activations(
            sizes.critic.micro_batch_size_per_device, cfg.critic.model.enable_gradient_checkpointing))

    train_seqs = sizes.prompts_per_step * sizes.responses_per_prompt
    val = arr.rollout.val_kwargs
    try:
        from thinkrl.doctor.data import KEYS, dataset_of
        val_seqs = val_batch_size(cfg, len(dataset_of(ctx, KEYS[1]).rows)) * max(val.n, 1)
    except NotChecked:
        val_seqs = (cfg.data.val_batch_size or 0) * max(val.n, 1)
    # each rank generates its share of the prompts (the ray backend splits them)
    seqs = -(-max(train_seqs, val_seqs) // shards)
    kv = 2 * layers * kv_heads * head_dim * s * seqs * c + seqs * vocab * 4
    with_ref = arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    return MemoryEstimate(weights=4 * params // shards, gradients=4 * params // shards,
                          optimizer=8 * params // shards,
                          # kept in the compute dtype on accelerators (fp32 on a CPU)
                          reference=((4 if not accelerator else c) * params // shards) if with_ref else 0,
                          activations=activations, kv_cache=int(kv), sequences=seqs,
                          critic=critic, critic_update=critic_update)


def host_available() -> int:
    """Host RAM available to a new allocation (MemAvailable), in bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_capacity(kind: str) -> tuple[int, str]:
    """Bytes one device can hold, and what was measured."""
    import torch

    if kind == "cuda" and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return total, f"CUDA device 0 ({gib(free)} free now)"
    npu = getattr(torch, "npu", None)
    if kind == "npu" and npu is not None and npu.is_available():
        free, total = npu.mem_get_info()
        return total, f"NPU device 0 ({gib(free)} free now)"
    return host_available(), "host RAM available (MemAvailable)"


def check_device(ctx: DoctorContext) -> CheckResult:
    """Estimated peak per device against the device's memory."""
    estimate = estimate_memory(ctx)
    capacity, measured = device_capacity(ctx.device_kind)
    terms = estimate.terms()
    largest = max(terms, key=terms.get)
    listed = ", ".join(f"{name} {gib(value)}" for name, value in terms.items() if value)
    fraction = estimate.peak / capacity if capacity else float("inf")
    found = (f"~{gib(estimate.peak)} peak of {gib(capacity)} {measured} ({100 * fraction:.0f}%): {listed}; "
             f"{estimate.sequences} sequences generated at once; largest: {largest}")
    if fraction > 1:
        return fail("memory/device", found, FIXES[largest])
    if fraction > WARN_FRACTION:
        return warn("memory/device", found, FIXES[largest])
    return ok("memory/device", found)


def check_host(ctx: DoctorContext) -> CheckResult:
    """Host RAM beside an accelerator: loading passes the fp32 weights
    through the host (once per node: on the ray backend rank 0 alone reads
    them and the other ranks receive their shards), and offloaded roles live there."""
    if ctx.device_kind == "cpu":
        return ok("memory/host", "the device is the CPU: host RAM is memory/device")
    cfg, params = ctx.cfg, ctx.param_count
    arr = cfg.actor_rollout_ref
    need, parts = 4 * params, [f"loading {gib(4 * params)}"]
    if execution_backend(cfg) == "ray":  # this node holds its devices' shards: 1/nnodes of each
        on_node = params // cfg.trainer.nnodes
        offloaded = {"actor weights": (arr.actor.fsdp_config.param_offload, 4 * on_node),
                     "AdamW": (arr.actor.fsdp_config.optimizer_offload, 8 * on_node),
                     "reference": (arr.ref.fsdp_config.param_offload, 4 * on_node)}
        for name, (on, size) in offloaded.items():
            if on:
                need += size
                parts.append(f"offloaded {name} {gib(size)}")
    available = host_available()
    found = f"~{gib(need)} of {gib(available)} available ({', '.join(parts)})"
    fix = "free host RAM (stop other processes) or use a smaller model (actor_rollout_ref.model.path)"
    if len(parts) > 1:
        fix += "; turn off the fsdp_config offload flags"
    if need > available:
        return fail("memory/host", found, fix)
    if need > WARN_FRACTION * available:
        return warn("memory/host", found, fix)
    return ok("memory/host", found)


CHECKS = [check_device, check_host]
