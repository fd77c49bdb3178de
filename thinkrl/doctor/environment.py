"""Environment checks: the device kind, environment variables the NPU stack
reads, and torch_npu's serialization patch.
"""

from __future__ import annotations

from thinkrl.doctor.context import DoctorContext, torch_npu_module
from thinkrl.doctor.core import CheckResult, fail, ok, warn
from thinkrl.rollout.vllm_engine import ascend_nz_problem

VISIBLE_VARIABLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def visible_devices(kind: str) -> tuple[int, str]:
    """How many `kind` devices this process sees, and the variable that chooses them."""
    import torch

    if kind == "cuda":
        return torch.cuda.device_count(), VISIBLE_VARIABLE["cuda"]
    if kind == "npu":
        npu = getattr(torch, "npu", None)
        return (npu.device_count() if npu is not None else 0), VISIBLE_VARIABLE["npu"]
    return 1, ""


def check_vllm_ascend_nz(ctx: DoctorContext) -> CheckResult:
    """vllm-ascend stores weights in the FRACTAL_NZ layout unless
    VLLM_ASCEND_ENABLE_NZ=0, which costs precision in RL weight syncs; it
    refuses to start (seed 004: "ValueError: FRACTAL_NZ mode is enabled")."""
    from thinkrl.doctor.versions import installed_versions

    if ctx.device_kind != "npu":
        return ok("environment/vllm-ascend-nz", f"not an NPU run (device {ctx.device_kind})")
    uses_vllm = (ctx.cfg.actor_rollout_ref.rollout.name == "vllm"
                 or "vllm_ascend" in ctx.remember("versions", lambda: installed_versions(ctx.env)))
    problem = ascend_nz_problem(ctx.env)
    if problem is None:
        return ok("environment/vllm-ascend-nz", "VLLM_ASCEND_ENABLE_NZ=0")
    found, fix = problem[0] + " on an NPU run", problem[1]
    if uses_vllm:
        return fail("environment/vllm-ascend-nz", found + " with vllm-ascend", fix)
    return warn("environment/vllm-ascend-nz", found + " (vllm-ascend is not used by this run)", fix)


def check_serialization(ctx: DoctorContext) -> CheckResult:
    """torch_npu replaces `torch.UntypedStorage.nbytes` with its own
    function; some builds recurse in it during `torch.save`, which is how
    Ray pickles tensors (seed 000: RecursionError in npu_nbytes). thinkrl
    sends only plain values between processes (reward workers get strings),
    so the patch matters to user code that pickles device tensors."""
    module = torch_npu_module()
    if module is None:
        return ok("environment/serialization", "torch_npu is not installed: torch.save is unpatched")
    import torch

    nbytes = torch.UntypedStorage.nbytes
    owner = getattr(nbytes, "__module__", None) or ""
    if owner.startswith("torch_npu"):
        return warn("environment/serialization",
                    f"torch.UntypedStorage.nbytes is patched by {owner}.{getattr(nbytes, '__name__', '?')}; "
                    "torch.save / pickling of NPU tensors can recurse forever (seed 000: RecursionError)",
                    "move tensors to the CPU before they cross a process (.cpu()); if your code must "
                    "pickle NPU tensors, use a torch_npu build without the patch")
    return ok("environment/serialization", "torch_npu is installed and torch.UntypedStorage.nbytes is "
              "torch's own")


CHECKS = [check_vllm_ascend_nz, check_serialization]
