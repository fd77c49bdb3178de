"""The weights a vLLM worker actually serves, as digests (`thinkrl.rollout.attest`).

Runs inside each worker (`LLM.apply_model`), on its own tensor-parallel
shard. A parameter is read where the kernels read it: on a GPU that is the
parameter itself; vLLM's CPU build repacks each linear layer's matrix for its
kernels (`cpu_linear`) and may drop the parameter, so the matrix is read back
*through the kernel*: its product with the identity, a block of columns at a
time, which is exact (every product is w * 1 and every sum adds zeros). An
embedding keeps its parameter for lookups beside the packed copy its logits
use (a tied output head): both are read and must agree.
"""

from __future__ import annotations

import time

import torch

from thinkrl.rollout.attest import INCONSISTENT, AttestShare, Ledger, tensor_digest, unit_of

# Identity columns per read-back product: [256, K] at a time.
_READ_BACK_COLUMNS = 256


def packed_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """The model's fused tensors: {"qkv_proj": ["q_proj", "k_proj", "v_proj"], ...}."""
    return {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}


def counted_rows(module: torch.nn.Module) -> int | None:
    """How many of the module's output rows this rank counts, None for all.

    With fewer KV heads than tensor-parallel ranks, vLLM gives every rank a
    copy of its K and V heads (`num_kv_head_replicas` ranks hold each one):
    only the first rank of each replica set counts them, so the ranks' digests
    still add up to the trainer's; the others count their Q rows only."""
    replicas = getattr(module, "num_kv_head_replicas", 1)
    if replicas > 1 and getattr(module, "tp_rank", 0) % replicas:
        return module.num_heads * module.head_size
    return None


@torch.no_grad()
def _read_back(module: torch.nn.Module, columns: int, rows: int | None) -> Ledger:
    """The digest of the matrix the module's kernel multiplies by (its first
    `rows` rows, None for all), read through the kernel (see the module's docstring)."""
    ledger = Ledger()
    param = next(module.parameters())
    for start in range(0, columns, _READ_BACK_COLUMNS):
        width = min(_READ_BACK_COLUMNS, columns - start)
        probe = torch.zeros(width, columns, dtype=param.dtype, device=param.device)
        probe[:, start:start + width] = torch.eye(width, dtype=param.dtype, device=param.device)
        ledger.add("w", module.quant_method.apply(module, probe, bias=None)[:, :rows])
    return ledger


@torch.no_grad()
def served_ledger(model: torch.nn.Module, share: AttestShare | None = None) -> Ledger:
    """Digests of every parameter this worker serves (those of the units in
    `share`, when given), by unit (engine names)."""
    started = time.perf_counter()
    ledger = Ledger()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            # A layer vLLM wrapped for LoRA holds its weights in `base_layer`.
            unit = unit_of((f"{module_name}.{name}" if module_name else name).replace(".base_layer.", "."))
            if share is not None and not share(unit):
                continue
            rows = counted_rows(module)
            if name == "weight" and hasattr(module, "cpu_linear") and hasattr(module, "quant_method"):
                columns = (param.shape[1] if param.dim() == 2 else
                           getattr(module, "input_size_per_partition", None)
                           or getattr(module, "embedding_dim"))
                read = _read_back(module, columns, rows)
                digest, numel = read.units["w"], read.numel["w"]
                if param.numel() and tensor_digest(param[:rows]) != digest:
                    digest = INCONSISTENT
                ledger.add_digest(unit, digest, numel)
            elif param.numel():
                ledger.add(unit, param[:rows])
    ledger.seconds = time.perf_counter() - started
    return ledger
