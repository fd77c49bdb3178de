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
chosen at start and stated (`adapter_serving`), where this module cannot
serve the adapter (a rank above vLLM's largest, per-module ranks, slots
sharded by rank, a vLLM release before the one it was built on) or the user
asks for it (actor_rollout_ref.model.lora.merge=True, verl's key).
"""

from __future__ import annotations

import time
from typing import Iterable, Iterator

import torch
from torch import Tensor

from thinkrl.models.lora import adapter_part, read_adapter_config, saved_key
from thinkrl.rollout.attest import Ledger, unit_of
from thinkrl.rollout.vllm_versions import release

ADAPTER_ID = 1
"""The one adapter's id in the engine (vLLM ids start at 1)."""
ENGINE_ADAPTER_NAME = "thinkrl-policy"
# Never read: the adapter is installed before any request names it. Absolute and
# absent, so that should vLLM ever look, it fails at once (no relative folder, no hub).
_NO_PATH = "/nonexistent/thinkrl-adapter-is-sent-in-memory"
# vLLM's accepted max_lora_rank values (vllm.config.lora.MaxLoRARanks).
_ENGINE_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The vLLM releases whose adapter internals this module was written and tested against.
_FIRST_SERVING_RELEASE = (0, 32)


def adapter_serving(cfg) -> tuple[bool, str]:
    """(whether the vLLM engine serves the adapter itself, the sentence that
    says how the engine gets the trained policy). Decided once at start."""
    model, rollout = cfg.actor_rollout_ref.model, cfg.actor_rollout_ref.rollout
    merged = (f"LoRA with rollout.name={rollout.name}: the engine is sent the base with the adapter "
              "merged in (W + s B A) after every update")
    if model.lora.merge:
        return False, f"{merged} (actor_rollout_ref.model.lora.merge=True)"
    if model.lora_rank > _ENGINE_RANKS[-1]:
        return False, f"{merged}: lora_rank={model.lora_rank} is above vLLM's largest adapter rank (512)"
    here = _vllm_release()
    if here is None or here < _FIRST_SERVING_RELEASE:
        return False, (f"{merged}: serving the adapter itself is built on vLLM "
                       f"{'.'.join(map(str, _FIRST_SERVING_RELEASE))}+ (here: "
                       f"{'.'.join(map(str, here)) if here else 'none'})")
    if (rollout.engine_kwargs.get("vllm") or {}).get("fully_sharded_loras"):
        return False, f"{merged}: engine_kwargs.vllm.fully_sharded_loras shards the adapter's slots by rank"
    if model.lora_adapter_path and read_adapter_config(model.lora_adapter_path).get("rank_pattern"):
        return False, f"{merged}: the adapter at lora_adapter_path has per-module ranks (rank_pattern)"
    return True, (f"LoRA with rollout.name={rollout.name}: the engine loads the base once and serves "
                  "the adapter itself; each update sends the adapter alone, in memory (set "
                  "actor_rollout_ref.model.lora.merge=True to send merged weights instead: faster "
                  "on vLLM's CPU build, whose LoRA kernels decode slowly)")


def _vllm_release() -> tuple[int, int] | None:
    """vLLM's (major, minor) here, None without it. Read from the module: the
    CPU build's distribution has another name than "vllm"."""
    try:
        import vllm
    except ImportError:
        return None
    version = getattr(vllm, "__version__", None)
    return release(version) if version else None


def engine_lora_arguments(rank: int) -> dict:
    """`vllm.LLM` arguments for one adapter of rank `rank`."""
    engine_rank = next(r for r in _ENGINE_RANKS if r >= rank)
    return dict(enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=engine_rank)


def engine_adapter(named: Iterable[tuple[str, Tensor]], scalings: dict[str, float], *, dtype: torch.dtype
                   ) -> Iterator[tuple[str, str, Tensor]]:
    """The adapter as the engine takes it, from the actor's (name, tensor)
    pairs of A and B: (attestation unit without the packing, PEFT's saved
    name, tensor), B scaled by its module's s (in float32), both in the
    engine's dtype."""
    for name, tensor in named:
        module, part = adapter_part(name)
        if part == "lora_B":
            tensor = tensor.float() * scalings[module]
        yield f"{module}.{part}", saved_key(name), tensor.to(dtype).contiguous()


def adapter_config(rank: int, modules: Iterable[str]) -> dict:
    """The PEFT config the engine is given: alpha = r (s already in B)."""
    return {"r": rank, "lora_alpha": rank, "target_modules": sorted(set(modules)), "bias": "none"}


def lora_request():
    """The request field naming the installed adapter."""
    from vllm.lora.request import LoRARequest
    return LoRARequest(ENGINE_ADAPTER_NAME, ADAPTER_ID, lora_path=_NO_PATH)


# -- inside each vLLM worker (LLM.collective_rpc passes the worker first) -------
def install_adapter(worker, tensors: dict[str, Tensor], config: dict) -> None:
    """Replace this worker's adapter ADAPTER_ID by `tensors` and make it the
    active one (its weights copied into the layers' adapter slots now, so
    that `served_adapter` reads what requests will use). Names are mapped
    as vLLM maps a loaded adapter's (the model's renames and skipped parts)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    slots = manager._adapter_manager  # vLLM's own way in: WorkerLoRAManager keeps no public one
    model = slots.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    adapter = LoRAModel.from_lora_tensors(
        ADAPTER_ID, tensors, PEFTHelper.from_dict(config), device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
        weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None))
    slots.remove_adapter(ADAPTER_ID)
    slots.add_adapter(adapter)  # fuses q|k|v and gate|up as the model does
    unserved = sorted(set(adapter.loras) - set(slots.modules))
    if unserved:
        raise RuntimeError(f"vLLM serves no adapter on {len(unserved)} adapted module(s) (first: "
                           f"{unserved[0]}); set actor_rollout_ref.model.lora.merge=True")
    slots.activate_adapter(ADAPTER_ID)


@torch.no_grad()
def served_adapter(worker) -> Ledger:
    """Digests of the adapter this worker's layers hold in ADAPTER_ID's slot,
    by unit: each layer's A and B slices (q, k, v of a fused layer add up),
    the slot's padding beyond the adapter's rank left out, and a slice the
    adapter does not cover (its A all zero: a trained A never is; with
    unsharded slots every rank holds A whole) skipped. Where several
    tensor-parallel ranks hold a copy of the same K/V heads, the first
    counts them (as `vllm_attest.counted_rows` does for the base)."""
    started = time.perf_counter()
    slots = worker.model_runner.lora_manager._adapter_manager
    ledger = Ledger()
    if ADAPTER_ID not in slots.lora_index_to_id:
        return ledger
    slot = slots.lora_index_to_id.index(ADAPTER_ID)
    rank = slots.get_adapter(ADAPTER_ID).rank
    from vllm.lora.layers.base_linear import BaseLinearLayerWithLoRA

    for name, module in slots.modules.items():
        # Linear layers only: thinkrl adapts the decoder's projections, and vLLM also
        # wraps embeddings and the logits processor (other slot layouts) on some models.
        if not isinstance(module, BaseLinearLayerWithLoRA):
            continue
        a_stacked, b_stacked = module.lora_a_stacked, module.lora_b_stacked
        base = module.base_layer
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
