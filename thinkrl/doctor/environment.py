"""Environment checks: the device kind, environment variables the NPU stack
reads, torch_npu's serialization patch, and the sockets a run opens.
"""

from __future__ import annotations

from pathlib import Path

from thinkrl.config.checks import execution_backend
from thinkrl.doctor.context import DoctorContext, torch_npu_module
from thinkrl.doctor.core import CheckResult, fail, ok, warn
from thinkrl.parallel.ray_cluster import on_loopback_address
from thinkrl.rollout.vllm_checks import ascend_nz_problem

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


COLLECTIVES = {"cpu": ("gloo", "GLOO_SOCKET_IFNAME"), "cuda": ("nccl", "NCCL_SOCKET_IFNAME"),
               "npu": ("hccl", "HCCL_IF_IP")}
"""Device kind -> (the collective library between ranks, the variable that
pins its sockets to one interface)."""


def check_network(ctx: DoctorContext) -> CheckResult:
    """Which sockets a run opens, and on which interface: none for one
    process; on one host, all on 127.0.0.1; across nodes, Ray's ports, the
    rendezvous and the collectives, with what pins each."""
    cfg, trainer = ctx.cfg, ctx.cfg.trainer
    if execution_backend(cfg) == "local":
        return ok("environment/network", "one process (trainer.backend=local): no network sockets")
    address = trainer.ray_address or ctx.env.get("RAY_ADDRESS")
    run_dir = Path(trainer.default_local_dir).expanduser()
    rendezvous = (f"a file under {run_dir / 'logs'} (no listening store)"
                  if trainer.dist_init_method != "tcp" else
                  "a TCP store on rank 0's node address at a free port, listening on every "
                  "interface, unauthenticated (trainer.dist_init_method=tcp)")
    library, variable = COLLECTIVES.get(ctx.device_kind, COLLECTIVES["cpu"])
    loopback = not address or on_loopback_address(address)
    if loopback and trainer.nnodes == 1:
        ray = "started by the run" if not address else f"joined at {address}"
        return ok("environment/network", f"one host, every socket on 127.0.0.1: Ray ({ray}), "
                  f"rendezvous through {rendezvous}, {library} collectives on lo")
    pinned = ctx.env.get(variable)
    found = (f"{trainer.nnodes} node(s) through the Ray cluster at {address or '(none given)'}: "
             "Ray's own ports on each node's address (GCS, node manager, object store, "
             f"workers); rendezvous through {rendezvous}; {library} collectives between ranks on ")
    if pinned:
        return ok("environment/network", found + f"{variable}={pinned}")
    return warn("environment/network", found + f"the interface of each node's hostname address "
                f"({variable} is unset)",
                f"export {variable}=<the cluster network's interface> on every node (and start "
                "Ray with --node-ip-address on that network) so that no rank listens elsewhere")


def check_loggers(ctx: DoctorContext) -> CheckResult:
    """The packages of trainer.logger's sinks (an unknown name is config/validate's)."""
    from thinkrl.loggers import missing_logger_packages

    missing = missing_logger_packages(ctx.cfg.trainer.logger)
    if not missing:
        return ok("environment/loggers", f"trainer.logger={ctx.cfg.trainer.logger}: every package installed")
    found = "; ".join(problem.split(": ")[0] for problem in missing)
    fix = "; ".join(problem.split(": ", 1)[1] for problem in missing)
    if ctx.target is not None:  # the run goes elsewhere: install it there
        return warn("environment/loggers", found + " here", fix + " (on the target's nodes)")
    return fail("environment/loggers", found, fix)


CHECKS = [check_vllm_ascend_nz, check_serialization, check_network, check_loggers]
