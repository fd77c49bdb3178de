"""What this machine must have for the config's backend and rollout engine,
checked before anything loads: by `thinkrl train` at start and by
`thinkrl doctor` (config/backend)."""

from __future__ import annotations

import importlib.util
import os

import torch

from thinkrl.config import Config
from thinkrl.config.checks import execution_backend
from thinkrl.errors import SetupError
from thinkrl.parallel.device import resolve_device
from thinkrl.parallel.fsdp import MIN_TORCH
from thinkrl.rollout.vllm_checks import (check_vllm_usable, engine_model_problem,
                                         engine_parallel_problem)


def torch_problem(version: str) -> tuple[str, str] | None:
    """Why this torch cannot run the ray backend (FSDP2's public `fully_shard`
    arrived in torch 2.6), with the fix; None when it can."""
    release = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    if release >= MIN_TORCH:
        return None
    return (f"trainer.backend=ray shards with FSDP2 (torch.distributed.fsdp.fully_shard), "
            f"public from torch {'.'.join(map(str, MIN_TORCH))}; this is torch {version}",
            "pip install 'torch>=2.6' (thinkrl's tests ran the ray backend on 2.7.1 and "
            "2.13.0, which the Makefile pins), or use one device: trainer.n_gpus_per_node=1")


def check_backend(cfg: Config) -> None:
    if execution_backend(cfg) == "ray":
        devices = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
        if importlib.util.find_spec("ray") is None:
            raise SetupError(f"trainer.backend=ray ({devices} devices) needs Ray, which is not "
                             "installed", "pip install -e '.[ray]' (in thinkrl's checkout) (or use one device: "
                             "trainer.n_gpus_per_node=1)")
        problem = torch_problem(torch.__version__)
        if problem is not None:
            raise SetupError(*problem)
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


def check_model(cfg: Config, model_path: str) -> list[str]:
    """What the model's config rules out with this run's config, before any
    weights load (raised), and what it turns on that a user should hear at
    start (returned, `moe_notes`). A config that does not read is left to the
    model load, which says why."""
    from transformers import AutoConfig

    from thinkrl.models.vision import is_vision_model

    model = cfg.actor_rollout_ref.model
    vision = is_vision_model(model_path)  # an unsupported VL model type is refused here, by name
    if vision and cfg.actor_rollout_ref.rollout.name == "vllm":
        check_vllm_vision_usable()
    if vision and model.lora_rank > 0:
        raise SetupError(f"actor_rollout_ref.model.lora_rank={model.lora_rank} with the vision-language "
                         f"model {model_path}: LoRA is implemented for text decoders only",
                         "train every weight (lora_rank=0, model.freeze_vision_tower=True keeps the "
                         "vision tower fixed) or use a text model")
    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=model.trust_remote_code,
                                            **model.override_config)
    except Exception:  # noqa: BLE001 - the model load reports it with its fix
        return []
    problem = engine_model_problem(cfg.actor_rollout_ref.rollout, config)
    if problem is not None:
        raise SetupError(*problem)
    from thinkrl.config.moe_checks import router_replay_mode

    mode = router_replay_mode(cfg)
    if mode != "disabled":
        check_replayable(config, model_path, mode)
    return moe_notes(config, model_path)


REPLAYABLE = ("qwen3_moe", "qwen2_moe")
"""Decoders whose sparse blocks `thinkrl.models.routing` taps (a top-k router over fused experts)."""


def check_replayable(config, model_path: str, mode: str) -> None:
    """Router replay needs a Qwen3-MoE / Qwen2-MoE decoder with at least 2
    experts per token (a route of one expert cannot be told from "no route":
    verl's VeOmni path refuses top-1 too)."""
    fix = "set actor_rollout_ref.actor.router_replay.mode=disabled"
    kind = getattr(config, "model_type", "?")
    if kind not in REPLAYABLE:
        raise SetupError(f"router replay ({mode}) with {model_path}: thinkrl replays the routers of "
                         f"{' and '.join(REPLAYABLE)} models; a {kind} model "
                         + ("has no experts to route to" if not getattr(config, "num_experts", 0)
                            and not getattr(config, "num_local_experts", 0) else "is not one of them"),
                         f"{fix}, or train a Qwen3-MoE / Qwen2-MoE model")
    if config.num_experts_per_tok < 2:
        raise SetupError(f"router replay ({mode}) with {model_path}: one expert per token "
                         "(num_experts_per_tok=1) leaves no way to mark a token without a route", fix)


def moe_notes(config, model_path: str) -> list[str]:
    """What a mixture-of-experts model's config (overrides applied) turns on
    that a user should hear at start: the routers' load-balancing loss (off
    in verl's RL recipes)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(text, "num_experts", 0) or not getattr(text, "output_router_logits", False):
        return []
    return [f"the routers' load-balancing loss is on: output_router_logits=True in {model_path}'s config "
            f"(or actor_rollout_ref.model.override_config), weighed by its router_aux_loss_coef="
            f"{getattr(text, 'router_aux_loss_coef', 0.0)}; verl's RL recipes keep it off "
            "(override_config.output_router_logits=False)"]


def check_vllm_vision_usable() -> None:
    """vLLM's Qwen2-VL modules import transformers' image processor, which
    imports torchvision: it must import beside this torch."""
    try:
        import torchvision.transforms.v2.functional  # noqa: F401
    except Exception as err:  # noqa: BLE001 - ImportError, or torchvision's RuntimeError
        raise SetupError(
            f"actor_rollout_ref.rollout.name=vllm with a vision-language model needs torchvision, "
            f"which does not import here ({type(err).__name__}: {err})",
            f"pip install the torchvision built for torch {torch.__version__} (a CPU torch needs "
            "PyTorch's CPU torchvision build; PyPI's links the CUDA libraries), or use "
            "actor_rollout_ref.rollout.name=native") from None


def busy_machine_note() -> str | None:
    """A line for the start of a run on a busy machine (other programs use
    the cores this process may run on, or torch runs more threads than
    there are cores), so that slow steps are not taken for a hang."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    found = []
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on every platform
        load = 0.0
    machine = os.cpu_count() or cores  # the load average counts the whole machine
    if load >= 2 * machine:  # this run alone (its ranks, its workers starting) stays below
        found.append(f"load average {load:.1f} on {machine} core{'s' if machine > 1 else ''}: "
                     "other programs use them")
    threads = torch.get_num_threads()
    if threads > cores:
        found.append(f"torch runs {threads} threads on {cores} cores (set OMP_NUM_THREADS={cores})")
    if not found:
        return None
    return ("note: this machine is busy (" + "; ".join(found) + "): steps will take longer than "
            "docs/benchmarks.md says")
