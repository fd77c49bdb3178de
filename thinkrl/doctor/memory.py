"""Memory checks: an estimate of one device's peak memory against its size,
and of the host RAM an accelerator run needs beside it.

Estimate per device (P parameters from `model.estimate_param_count`, the
fp32 terms divided by the devices FSDP shards over: 1 on the local backend):

    weights      4 P          fp32 master weights (mixed precision)
    gradients    4 P          fp32, alive during the update only
    AdamW        8 P          two fp32 moments
    reference    c P          frozen copy in the compute dtype (fp32 on a CPU), when a
                              KL term is on
    teachers     c P_t        distillation.enabled: each frozen teacher, held like the
                              reference (P_t from its config.json; the policy's P when unread)
    activations  L * b*s*h * (34 + 5*a*s/h) * c/2 + b*s*V*(c + 4)
                 per micro-batch of b responses, s = prompt + response
                 tokens, c bytes per compute element (4 fp32, 2 bf16).
                 The first term is Korthikanti et al. 2022 (16-bit, no
                 recomputation); the 5as/h part (attention scores) is
                 dropped on accelerators, whose fused attention never
                 materialises the scores. With gradient checkpointing only
                 each layer's input (c*b*s*h) is kept, plus one layer's full
                 set. The last term is the logits and their fp32 log-softmax.
                 That is the padded forward. The shared-prompt pass
                 (model.use_remove_padding on a plain Llama/Qwen2/Qwen3/Mistral
                 decoder, thinkrl's default path) computes each distinct prompt
                 once and the responses beside it: `shared_prompt_activations`
                 gives its terms (counted against autograd's saved tensors).
                 Mixture of experts (Qwen3-MoE, Qwen2-MoE): P counts every expert (sharded
                 like any weight); activations count the k active experts' width
                 (k x moe_intermediate_size for intermediate_size) and per token
                 2 k h + 3 X more (the tokens' copies in and out of their experts,
                 the router's logits and probabilities; `activations.mlp_terms`)
    KV cache     2 * L * k * d * s * n_seq * c   + n_seq * V * 4 (sampling logits)
                 n_seq sequences generated at once (train batch x rollout.n,
                 or a validation batch x val_kwargs.n, the larger).

    LoRA         (model.lora_rank > 0, T adapter parameters) weights 4 P + 4 T (the
                 frozen fp32 base and the adapters), gradients 4 T, AdamW 8 T, and no
                 reference term: the reference is the base with the adapter off
                 The critic's LoRA (critic.model.lora_rank): 4 P + 12 T' resident and
                 4 T' of gradients, T' its adapters plus the value head (h)
    critic       12 P         PPO with a critic (algorithm.adv_estimator=gae): the
                              value model's fp32 weights and AdamW moments, assumed
                              the policy's size (critic.model.path defaults to it)
    critic update 4 P + activations of a critic micro-batch (its gradients; the
                 activation formula above with critic.ppo_micro_batch_size_per_gpu,
                 critic.model.enable_gradient_checkpointing and a one-number head
                 instead of the logits)

    gathered     c P          the native engine on FSDP shards: every device holds the
    weights                   whole model, gathered once per rollout (`fsdp.gathered`)
    vLLM share   u * D        rollout.name=vllm: the share u (rollout.gpu_memory_utilization)
                              of the device's D bytes vLLM reserves for its weights (c P / TP)
                              and KV cache (on a CPU: c P / TP + VLLM_CPU_KVCACHE_SPACE);
                              the native KV term above is then 0. With sleep mode
                              (rollout.free_cache_engine, CUDA) it is freed for the updates;
                              without, it stays reserved beside them.
    weight sync  B            vLLM: one bucket of whole tensors on its way into the
                              engine (rollout.update_weights_bucket_megabytes, at least
                              the largest tensor, c V h)
    build        4 V h        sharded runs: rank 0 reads the model into host memory and
                              every device receives its shards one whole fp32 tensor at a
                              time (the largest, the embedding), never the whole model

    runtime      0.4 GiB      on a CPU only: the process itself (Python, torch, libraries)

    peak = weights + AdamW + reference + teachers + critic (+ runtime)
           + max(gradients + activations, critic update) (+ vLLM share, awake)
           | KV cache + gathered weights + vLLM share + weight sync (the rollout)
           | build

The rollout and the two updates never overlap, so the largest phase counts.
On a CPU the peak is raised by `CPU_SLACK` (15%: what the allocator keeps
of freed blocks); calibrated there against the measured peaks of ten runs,
it is an upper bound, within 1.5x for nine (docs/memory.md). On accelerators no device
was lent to calibrate it: a planning estimate (within tens of percent).
Per node (`check_host`): the fp32 weights pass through rank 0's host once
(the other ranks receive their shards), plus whatever is offloaded there:
the FSDP offload flags' shards, and the weights of every sleeping vLLM
engine of the node (sleep level 1 moves them to the host).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from thinkrl.assets import val_batch_size
from thinkrl.config.checks import execution_backend
from thinkrl.config.distill_checks import needs_reference, teachers_of
from thinkrl.config.keys import ARR as _ARR
from thinkrl.doctor.activations import mlp_terms, shared_prompt_activations, shared_prompt_pass
from thinkrl.doctor.context import DoctorContext, NotChecked, estimate_param_count
from thinkrl.doctor.core import CheckResult, fail, gib, ok, warn
from thinkrl.doctor.memory_fixes import FIXES
from thinkrl.rollout.vllm_engine import engine_dtype, sleeps

WARN_FRACTION = 0.85
CPU_SLACK = 0.15
"""On a CPU, what the allocator keeps of freed blocks: the terms alone fell
under the measured peaks of some runs; with it, every one of ten runs'
peak is under the estimate (docs/memory.md)."""
RUNTIME_BYTES = 400 * 2**20
"""A trainer process's own memory before any model: Python with torch,
transformers, thinkrl and a tokenizer imported (378 MB resident, measured
with /usr/bin/time on this 2-core machine; docs/memory.md)."""


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
    teachers: int = 0
    """The frozen teachers of on-policy distillation, held like the reference."""
    critic_update: int = 0
    """The critic's gradients and the activations of one critic micro-batch."""
    gathered_weights: int = 0
    """The native engine's whole-model copy on FSDP shards, during the rollout."""
    vllm_share: int = 0
    """vLLM's reserved memory (its weights and KV cache)."""
    vllm_weights: int = 0
    """vLLM's own copy of the weights (c P / TP), inside its share."""
    vllm_awake_in_training: bool = False
    """No sleep mode: vLLM's share stays reserved during the updates."""
    weight_sync: int = 0
    """One bucket of whole tensors on its way into vLLM."""
    build: int = 0
    """The sharded build: one whole fp32 tensor in flight from rank 0's host
    copy (the largest: the embedding), beside the shards already placed."""
    runtime: int = 0
    """On a CPU the device is the process: Python, torch, transformers and the
    tokenizer hold their own memory (measured: `RUNTIME_BYTES`)."""
    slack: float = 0.0
    """A share added to the peak for memory the allocator freed but keeps
    (`CPU_SLACK` on a CPU, calibrated against measured peaks: docs/memory.md)."""

    @property
    def resident(self) -> int:
        """What stays on the device the whole run."""
        return self.weights + self.optimizer + self.reference + self.teachers + self.critic + self.runtime

    @property
    def phases(self) -> dict[str, int]:
        """The bytes each phase adds to `resident`: the actor's update, the
        critic's, the rollout (the largest counts)."""
        awake = self.vllm_share if self.vllm_awake_in_training else 0
        return {"update": self.gradients + self.activations + awake,
                "critic update": self.critic_update + awake,
                "rollout": self.kv_cache + self.gathered_weights + self.vllm_share + self.weight_sync,
                "build": self.build}

    @property
    def peak(self) -> int:
        return int((self.resident + max(self.phases.values())) * (1 + self.slack))

    def terms(self) -> dict[str, int]:
        return {"weights": self.weights, "gradients": self.gradients, "AdamW": self.optimizer,
                "reference": self.reference, "teachers": self.teachers, "critic": self.critic,
                "activations": self.activations,
                "critic update": self.critic_update, "KV cache": self.kv_cache,
                "gathered weights": self.gathered_weights, "vLLM share": self.vllm_share,
                "weight sync": self.weight_sync, "build": self.build, "runtime": self.runtime}


def estimate_memory(ctx: DoctorContext, *, capacity: int | None = None) -> MemoryEstimate:
    """The formulas of the module docstring for this run; `capacity`: the
    device's bytes (vLLM reserves a share of it; measured when not given)."""
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
    # The shared-prompt pass pads prompts to its batch's longest: the data's, where
    # data/prompt-length measured every row. (The padded formula keeps the limit: measured,
    # its peaks hold transients its terms do not name; docs/memory.md.)
    measured = [ctx.memo.get(f"longest-prompt:{key}") for key in ("data.train_files", "data.val_files")]
    prompt_length = max(measured) if all(isinstance(n, int) for n in measured) else sizes.prompt_length

    f, routing = mlp_terms(text)  # a mixture of experts: its active experts, and the routing

    def layer_activations(b: int, checkpointing: bool) -> float:
        per_layer_16bit = b * s * h * (34 + (0 if accelerator else 5 * heads * s / h)) + 2 * b * s * routing
        if checkpointing:
            return layers * c * b * s * h + per_layer_16bit * c / 2
        return layers * per_layer_16bit * c / 2

    b = sizes.micro_batch_size_per_device
    if shared_prompt_pass(cfg, text):
        activations = shared_prompt_activations(
            b=b, prompts=min(b, sizes.prompts_per_mini_batch), p=prompt_length, r=sizes.response_length,
            h=h, f=f + routing // 4, kv=kv_heads * head_dim, layers=layers, vocab=vocab,
            c=c, checkpointing=arr.model.enable_gradient_checkpointing,
            fused_head=arr.model.use_fused_kernels)
    else:
        activations = int(layer_activations(b, arr.model.enable_gradient_checkpointing) + b * s * vocab * (c + 4))
    critic = critic_update = 0
    if sizes.critic is not None:  # PPO with a critic, assumed the policy's size
        critic_trained, critic = params, 12 * params // shards
        if cfg.critic.model.lora_rank > 0:  # the frozen base; the adapters and value head train
            from thinkrl.models.lora import adapter_parameter_count
            critic_trained = adapter_parameter_count(text, cfg.critic.model.lora_rank,
                                                     cfg.critic.model.target_modules) + h
            critic = (4 * params + 12 * critic_trained) // shards
        critic_update = 4 * critic_trained // shards + int(layer_activations(
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
    with_ref = needs_reference(cfg)
    # On an accelerator, any fsdp_config offload flag moves the role's sharded
    # weights (and the actor's gradients and AdamW) to the host (FSDP2's
    # CPUOffloadPolicy keeps the three together; `check_host` counts them there).
    actor_on_device = 0 if offloaded(cfg, arr.actor.fsdp_config, accelerator) else 1
    ref_on_device = 0 if offloaded(cfg, arr.ref.fsdp_config, accelerator) else 1
    # LoRA: T adapter parameters train; the base stays (frozen, fp32) and is the reference.
    lora = arr.model.lora_rank > 0
    trained, held = params, params  # parameters that train; parameters the actor holds
    if lora:
        from thinkrl.models.lora import adapter_parameter_count
        trained = adapter_parameter_count(text, arr.model.lora_rank, arr.model.target_modules)
        held, with_ref = params + trained, False
    estimate = MemoryEstimate(
        weights=actor_on_device * 4 * held // shards,
        gradients=actor_on_device * 4 * trained // shards,
        optimizer=actor_on_device * 8 * trained // shards,
        # kept in the compute dtype on accelerators (fp32 on a CPU)
        reference=ref_on_device * ((4 if not accelerator else c) * params // shards) if with_ref else 0,
        teachers=ref_on_device * (4 if not accelerator else c) * teacher_params(cfg, params) // shards,
        activations=activations, kv_cache=int(kv), sequences=seqs,
        critic=critic, critic_update=critic_update,
        # rank 0 reads into host memory; a device gets its shards, one tensor at a time
        build=4 * vocab * h if shards > 1 else 0, runtime=0 if accelerator else RUNTIME_BYTES,
        slack=0.0 if accelerator else CPU_SLACK)
    if arr.rollout.name == "native":
        return replace(estimate, gathered_weights=c * params if shards > 1 else 0)
    return replace(estimate, kv_cache=0, **_vllm_terms(ctx, c=c, params=params, hidden=h, vocab=vocab,
                                                       capacity=capacity))


def teacher_params(cfg, policy_params: int) -> int:
    """The parameters of every teacher (distillation.enabled): each from its
    config.json when it can be read without building or downloading anything,
    else assumed the policy's size."""
    total = 0
    for teacher in teachers_of(cfg):
        try:
            from transformers import AutoConfig
            config = AutoConfig.from_pretrained(teacher.model_path, local_files_only=True)
            total += estimate_param_count(config)
        except Exception:  # noqa: BLE001 - a builtin: name, a hub id not cached: the policy's size
            total += policy_params
    return total


def offloaded(cfg, fsdp_config, accelerator: bool) -> bool:
    """A role's shards live on the host: the ray backend on an accelerator
    with any of verl's three offload flags (as `PolicyRank` maps them)."""
    return accelerator and execution_backend(cfg) == "ray" and fsdp_config.offloads


def _vllm_terms(ctx: DoctorContext, *, c: int, params: int, hidden: int, vocab: int,
                capacity: int | None) -> dict:
    """vLLM's share of the device, whether it sleeps, the weight sync's bucket."""
    rollout = ctx.cfg.actor_rollout_ref.rollout
    if ctx.device_kind == "cpu":  # its own weights and a KV space of VLLM_CPU_KVCACHE_SPACE GiB
        kv_space = float(ctx.env.get("VLLM_CPU_KVCACHE_SPACE", 1)) * 2**30
        share = c * params // rollout.tensor_model_parallel_size + int(kv_space)
    else:
        capacity = capacity if capacity is not None else device_capacity(ctx.device_kind)[0]
        share = int(rollout.gpu_memory_utilization * capacity)
    bucket = max(rollout.update_weights_bucket_megabytes * 2**20, c * vocab * hidden)
    return {"vllm_share": share, "weight_sync": bucket,
            "vllm_weights": c * params // rollout.tensor_model_parallel_size,
            "vllm_awake_in_training": not sleeps(ctx.cfg, ctx.device_kind)}


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
    """Estimated peak per device against the device's memory (the target's, when named)."""
    if ctx.target is not None:
        capacity, measured = ctx.target.bytes_per_device, f"per device of {ctx.target.describe()}"
    else:
        capacity, measured = device_capacity(ctx.device_kind)
    estimate = estimate_memory(ctx, capacity=capacity)
    terms = estimate.terms()
    largest = max((name for name in terms if name != "runtime"), key=terms.get)  # what a setting can shrink
    listed = ", ".join(f"{name} {gib(value)}" for name, value in terms.items() if value)
    fraction = estimate.peak / capacity if capacity else float("inf")
    slack = f", + {100 * estimate.slack:.0f}% allocator slack" if estimate.slack else ""
    found = (f"~{gib(estimate.peak)} peak of {gib(capacity)} {measured} ({100 * fraction:.0f}%): {listed}{slack}; "
             f"{estimate.sequences} sequences generated at once; largest: {largest}")
    if estimate.vllm_share and estimate.vllm_weights >= estimate.vllm_share:
        return fail("memory/device", found + f"; vLLM's share holds not even its weights "
                    f"({gib(estimate.vllm_weights)})",
                    f"raise {_ARR}.rollout.tensor_model_parallel_size (each engine then holds "
                    f"1/TP of the weights) or {_ARR}.rollout.gpu_memory_utilization")
    if fraction > 1:
        return fail("memory/device", found, FIXES[largest])
    if fraction > WARN_FRACTION:
        return warn("memory/device", found, FIXES[largest])
    return ok("memory/device", found)


def host_need(ctx: DoctorContext) -> tuple[int, list[str]]:
    """Host RAM of the busiest node beside accelerators (rank 0's: it reads
    the fp32 weights once), and its parts."""
    cfg, params = ctx.cfg, ctx.param_count
    arr = cfg.actor_rollout_ref
    need, parts = 4 * params, [f"loading {gib(4 * params)}"]
    if execution_backend(cfg) == "ray":  # this node holds its devices' shards: 1/nnodes of each
        on_node = params // cfg.trainer.nnodes
        actor = offloaded(cfg, arr.actor.fsdp_config, True)
        on_host = {"actor weights, gradients and AdamW": (actor, 16 * on_node),
                   "reference": (offloaded(cfg, arr.ref.fsdp_config, True), 4 * on_node)}
        rollout = arr.rollout
        if rollout.name == "vllm" and sleeps(cfg, ctx.device_kind):  # sleep level 1: weights to host
            engine_bytes = 4 if engine_dtype(cfg, ctx.device_kind) == "float32" else 2
            on_host["sleeping vLLM weights"] = (True, cfg.trainer.n_gpus_per_node * engine_bytes
                                                  * params // rollout.tensor_model_parallel_size)
        for name, (on, size) in on_host.items():
            if on:
                need += size
                parts.append(f"offloaded {name} {gib(size)}")
    return need, parts


def check_host(ctx: DoctorContext) -> CheckResult:
    """Host RAM beside an accelerator: loading passes the fp32 weights
    through the host (once per node: on the ray backend rank 0 alone reads
    them and the other ranks receive their shards), and offloaded roles live there."""
    if ctx.device_kind == "cpu":
        return ok("memory/host", "the device is the CPU: host RAM is memory/device")
    need, parts = host_need(ctx)
    if ctx.target is not None:
        return ok("memory/host", f"~{gib(need)} of host RAM on the busiest node ({', '.join(parts)}); "
                  "the target's nodes are not this machine, so not compared")
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
