"""vLLM serving the policy's LoRA adapter itself (model.lora_rank > 0).

The engine holds the frozen base, loaded once, and each sync hands it the
adapter alone: r (in + out) numbers per adapted layer instead of the whole
model. The adapter goes in memory, never through the disk: each vLLM worker
builds vLLM's own adapter record from the tensors (`install_adapter`, run
in the worker by `LLM.collective_rpc`) and puts it in place of the previous
one under the same id, so every request names the newest adapter.

Scaling: PEFT computes s B A with s = lora_alpha / r. The sent B is s B
(float32 product, then the engine's dtype) and the engine is told
lora_alpha = r, so its own scaling is exactly 1 and the engine holds
bit-for-bit what the digests were taken of (`thinkrl.rollout.attest`).

The engine is sent the base with the adapter merged in (W + s B A) instead,
chosen at start and stated (`lora_sync`), where it cannot serve the adapter
(a rank above vLLM's largest; a vision-language model, whose engine takes
image features from the trainer, should LoRA on one ever pass the start-up
checks, which refuse it today) or the user asks for it
(actor_rollout_ref.model.lora.merge=True, verl's key).
"""

from __future__ import annotations

import re
import time
from typing import Iterable, Iterator

import torch
from torch import Tensor

from thinkrl.rollout.attest import Ledger, unit_of

ADAPTER_ID = 1
"""The one adapter's id in the engine (vLLM ids start at 1)."""
ADAPTER_NAME = "thinkrl-policy"
# vLLM's accepted max_lora_rank values (vllm.config.lora.MaxLoRARanks).
_ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# "<module>.lora_A.default.weight" in the PEFT module; "<module>.lora_A.weight" saved.
_ADAPTER_TENSOR = re.compile(r"^(.*)\.(lora_[AB])\.(?:[^.]+\.)?weight$")
_SAVED_PREFIX = "base_model.model."


def lora_sync(cfg, *, vision: bool) -> tuple[bool, str]:
    """(whether the vLLM engine serves the adapter itself, the sentence that
    says how the engine gets the trained policy). Decided once at start."""
    model = cfg.actor_rollout_ref.model
    name = cfg.actor_rollout_ref.rollout.name
    merged = "the engine is sent the base with the adapter merged in (W + s B A) after every update"
    if model.lora.merge:
        return False, f"LoRA with rollout.name={name}: {merged} (actor_rollout_ref.model.lora.merge=True)"
    if vision:
        return False, (f"LoRA with rollout.name={name} on a vision-language model: {merged} (its engine "
                       "takes image features from the trainer and serves no adapter in this release)")
    if model.lora_rank > _ENGINE_RANKS[-1]:
        return False, (f"LoRA with rollout.name={name}: lora_rank={model.lora_rank} is above vLLM's "
                       f"largest adapter rank ({_ENGINE_RANKS[-1]}): {merged}")
    return True, (f"LoRA with rollout.name={name}: the engine loads the base once and serves the "
                  "adapter itself; each update sends the adapter alone, in memory (set "
                  "actor_rollout_ref.model.lora.merge=True to send merged weights instead)")


def engine_lora_arguments(rank: int) -> dict:
    """`vllm.LLM` arguments for one adapter of rank `rank`."""
    engine_rank = next(r for r in _ENGINE_RANKS if r >= rank)
    return dict(enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=engine_rank)


def engine_adapter(named: Iterable[tuple[str, Tensor]], scalings: dict[str, float], *, dtype: torch.dtype
                   ) -> Iterator[tuple[str, Tensor]]:
    """The adapter as the engine takes it, from the actor's (name, tensor)
    pairs of A and B: PEFT's saved names, B scaled by its module's s (in
    float32), both in the engine's dtype."""
    for name, tensor in named:
        module, part = _ADAPTER_TENSOR.match(name).groups()
        if part == "lora_B":
            tensor = tensor.float() * scalings[module]
        yield f"{_SAVED_PREFIX}{module}.{part}.weight", tensor.to(dtype).contiguous()


def adapter_unit(name: str, packed: dict[str, list[str]]) -> str:
    """The attestation unit of an adapter tensor (`engine_adapter`'s name):
    "layers.0.self_attn.qkv_proj.lora_A" for q_proj's A (fused as the engine fuses)."""
    module, part = _ADAPTER_TENSOR.match(name).groups()
    return unit_of(f"{module}.{part}", packed)


def adapter_config(rank: int, modules: Iterable[str]) -> dict:
    """The PEFT config the engine is given: alpha = r (s already in B)."""
    return {"r": rank, "lora_alpha": rank, "target_modules": sorted(set(modules)), "bias": "none"}


# -- inside each vLLM worker (LLM.collective_rpc passes the worker first) -------
def install_adapter(worker, tensors: dict[str, Tensor], config: dict) -> None:
    """Replace this worker's adapter ADAPTER_ID by `tensors` and make it the
    active one (its weights copied into the layers' adapter slots now, so
    that `served_adapter` reads what requests will use)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    slots = manager._adapter_manager  # vLLM's own way in: WorkerLoRAManager keeps no public one
    adapter = LoRAModel.from_lora_tensors(
        ADAPTER_ID, tensors, PEFTHelper.from_dict(config), device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size)
    if len(adapter.loras) != len({adapter_module(n) for n in tensors}):
        raise RuntimeError(f"vLLM took {len(adapter.loras)} of the adapter's modules; it does not "
                           "serve LoRA on all of them (set actor_rollout_ref.model.lora.merge=True)")
    slots.remove_adapter(ADAPTER_ID)
    slots.add_adapter(adapter)
    slots.activate_adapter(ADAPTER_ID)


def adapter_module(name: str) -> str:
    return _ADAPTER_TENSOR.match(name).group(1)


@torch.no_grad()
def served_adapter(worker) -> Ledger:
    """Digests of the adapter this worker's layers hold in ADAPTER_ID's slot,
    by unit: each layer's A and B slices (q, k, v of a fused layer add up),
    the slot's padding beyond the adapter's rank left out, and a slice the
    adapter does not cover (its A all zero: a trained A never is) skipped. Where several
    tensor-parallel ranks hold a copy of the same K/V heads, the first counts
    them (as `vllm_attest.counted_rows` does for the base)."""
    started = time.perf_counter()
    slots = worker.model_runner.lora_manager._adapter_manager
    ledger = Ledger()
    if ADAPTER_ID not in slots.lora_index_to_id:
        return ledger
    slot = slots.lora_index_to_id.index(ADAPTER_ID)
    rank = slots.get_adapter(ADAPTER_ID).rank
    for name, module in slots.model.named_modules():
        a_stacked, b_stacked = getattr(module, "lora_a_stacked", None), getattr(module, "lora_b_stacked", None)
        if a_stacked is None or b_stacked is None:
            continue
        base = getattr(module, "base_layer", module)
        replicas = getattr(base, "num_kv_head_replicas", 1)
        skip_kv = replicas > 1 and getattr(module, "tp_rank", 0) % replicas != 0
        for index, (a, b) in enumerate(zip(a_stacked, b_stacked)):
            a = a[slot, 0, :rank]
            if not a.any():  # a part the adapter does not adapt (k_proj of q_proj + v_proj)
                continue
            ledger.add(unit_of(f"{name}.lora_A"), a)
            if not (skip_kv and index > 0):
                ledger.add(unit_of(f"{name}.lora_B"), b[slot, 0, :, :rank])
    ledger.seconds = time.perf_counter() - started
    return ledger
