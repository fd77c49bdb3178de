"""The only place that names device kinds ("cuda", "npu") and their libraries."""

from __future__ import annotations

import contextlib
import importlib.util
import resource

import torch

from thinkrl.errors import UserError


def _npu_available() -> bool:
    if importlib.util.find_spec("torch_npu") is None:
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)
    return torch.npu.is_available()


def resolve_device(name: str) -> torch.device:
    """trainer.device -> a torch.device; `auto` picks cuda, then npu, then cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("npu") if _npu_available() else torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("trainer.device=cuda but no CUDA device is visible (check "
                         "CUDA_VISIBLE_DEVICES and the driver), or set trainer.device=cpu")
    if name == "npu" and not _npu_available():
        raise UserError("trainer.device=npu but torch_npu is not installed or sees no NPU "
                         "(check ASCEND_RT_VISIBLE_DEVICES and CANN), or set trainer.device=cpu")
    return torch.device(name)


def compute_dtype(device: torch.device | str, name: str) -> torch.dtype:
    """actor_rollout_ref.model.dtype -> the dtype matmuls run in on `device`
    (or a device kind: "cpu", "cuda", "npu"); `auto` is float32 on CPU and
    bfloat16 on accelerators. Parameters and optimizer states stay float32
    whatever this says (see `autocast`)."""
    if name == "auto":
        kind = device if isinstance(device, str) else device.type
        return torch.float32 if kind == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """A factory of contexts in which forward passes compute in `dtype`.

    Mixed precision, not low-precision weights: an AdamW step of lr 1e-6 on a
    bfloat16 weight of magnitude 1e-2 rounds away entirely (bfloat16 keeps ~3
    significant digits), so the master weights must stay float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def synchronizer(device: torch.device):
    """A function that waits for the device's queued work, so that stage
    timings measure the work and not just its launch."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "npu":
        return lambda: torch.npu.synchronize(device)
    return lambda: None


def frozen_weights_dtype(device: torch.device, compute: torch.dtype) -> torch.dtype:
    """The dtype a model that never trains (the reference) is kept in: its
    compute dtype on accelerators, as verl keeps it (half the memory of
    float32; autocast would round each weight the same way on every
    forward), float32 on a CPU (where thinkrl computes in float32 unless
    asked otherwise, and the reference must equal the actor's first forward)."""
    return torch.float32 if device.type == "cpu" else compute


def empty_cache(device_type: str) -> None:
    """Hand the caching allocator's free blocks back to the accelerator
    (CUDA, NPU), so that the other party of a colocated pair gets them: the
    rollout engine after the update, the trainer after the engine sleeps
    (verl does the same around each switch). A no-op on a CPU."""
    module = None if device_type == "cpu" else torch.get_device_module(device_type)
    if module is not None and hasattr(module, "empty_cache") and module.is_available():
        module.empty_cache()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "npu":
        torch.npu.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory and what was measured: allocator peak on accelerators,
    the process's peak RSS on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "torch.cuda.max_memory_allocated"
    if device.type == "npu":
        return torch.npu.max_memory_allocated(device), "torch.npu.max_memory_allocated"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib * 1024, "peak RSS of the process"


def process_group_backend(device: torch.device, *, host_tensors: bool = False) -> str:
    """The torch.distributed backend for a device kind: gloo on the CPU, nccl
    on CUDA, hccl on Ascend NPUs; with `host_tensors` (offloaded FSDP2
    shards) gloo serves the CPU tensors beside the accelerator's backend."""
    backend = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}[device.type]
    if host_tensors and device.type != "cpu":
        return f"cpu:gloo,{device.type}:{backend}"
    return backend


def loopback_env() -> dict[str, str]:
    """Environment that keeps each collective library's sockets on 127.0.0.1
    (all ranks on this one machine)."""
    return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "HCCL_IF_IP": "127.0.0.1"}


def ray_resource(device_name: str) -> str | None:
    """The Ray resource one rank reserves besides a CPU: "GPU" for CUDA,
    the custom resource "NPU" for Ascend, none on the CPU."""
    return {"cuda": "GPU", "npu": "NPU"}.get(device_name)


def local_accelerator_count(device_name: str) -> int:
    """Accelerators of kind `device_name` visible to this process (0 for cpu)."""
    if device_name == "cuda":
        return torch.cuda.device_count()
    if device_name == "npu":
        return torch.npu.device_count() if _npu_available() else 0
    return 0


def bind_rank_device(device_name: str) -> torch.device:
    """The device of one rank inside a worker: Ray makes exactly the reserved
    accelerator visible, so it is device 0 of its kind."""
    device = resolve_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    if device.type == "npu":
        torch.npu.set_device(0)
        return torch.device("npu", 0)
    return device
