"""What this machine must have for the config's backend and rollout engine,
checked before anything loads: by `thinkrl train` at start and by
`thinkrl doctor` (config/backend)."""

from __future__ import annotations

import importlib.util

import torch

from thinkrl.config import Config
from thinkrl.config.checks import execution_backend
from thinkrl.errors import SetupError
from thinkrl.parallel.device import resolve_device
from thinkrl.rollout.vllm_engine import check_vllm_usable, engine_parallel_problem


def check_backend(cfg: Config) -> None:
    if execution_backend(cfg) == "ray":
        devices = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
        if importlib.util.find_spec("ray") is None:
            raise SetupError(f"trainer.backend=ray ({devices} devices) needs Ray, which is not "
                             "installed", "pip install 'thinkrl[ray]' (or use one device: "
                             "trainer.n_gpus_per_node=1)")
        from torch.distributed.fsdp import FSDPModule
        if not hasattr(FSDPModule, "set_force_sum_reduction_for_comms"):
            raise SetupError(f"trainer.backend=ray needs FSDP2's summed gradient reduction, "
                             f"which torch {torch.__version__} lacks",
                             "install torch >= 2.8 (the Makefile's TORCH_SPEC pins 2.13.0)")
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name == "sglang":
        raise SetupError("actor_rollout_ref.rollout.name=sglang is not available in this release",
                         "use rollout.name=vllm (or native)")
    if rollout.name == "vllm":
        problem = engine_parallel_problem(rollout, execution_backend(cfg))
        if problem is not None:
            raise SetupError(*problem)
        # On the driver; each rank checks again on its own device at start.
        device = cfg.trainer.device
        check_vllm_usable(device if device != "auto" else resolve_device("auto").type)
