"""Config checks: batch sizes, backend, devices, parallel sizes and layouts.

The batch-size and backend rules live in `thinkrl.config.checks.validate`
and `thinkrl.preflight.check_backend`; these checks call them and turn their
messages into rows, so a rule and its wording exist once.
"""

from __future__ import annotations

import os

from thinkrl.preflight import check_backend as build_check_backend
from thinkrl.doctor.context import DoctorContext, NotChecked
from thinkrl.doctor.core import CheckResult, fail, ok, warn
from thinkrl.doctor.shards import read_sharded_layout
from thinkrl.errors import problem_and_fix


def check_validate(ctx: DoctorContext) -> list[CheckResult]:
    """Every cross-field rule of the config, one row per problem."""
    from thinkrl.config.checks import validate

    try:
        sizes = validate(ctx.cfg)
    except ValueError as err:
        problems = [line[4:] for line in str(err).splitlines() if line.startswith("  - ")]
        return [fail("config/validate", *_split_problem(p)) for p in problems] or [
            fail("config/validate", str(err), "see the message")]
    return [ok("config/validate",
               f"{sizes.prompts_per_step} prompts x {sizes.responses_per_prompt} = "
               f"{sizes.responses_per_step} responses per step, {sizes.mini_batches_per_step} "
               f"mini-batch(es), micro-batch {sizes.micro_batch_size_per_device} per device, "
               f"{sizes.grad_accum_steps} accumulation step(s)")]


def _split_problem(problem: str) -> tuple[str, str]:
    """"key=value: what to do" -> (found, fix)."""
    found, sep, fix = problem.partition(": ")
    return (found, fix) if sep else (problem, "see the message")


def check_backend(ctx: DoctorContext) -> CheckResult:
    """What this release can run: the same function `build_run` calls."""

    from thinkrl.config.checks import execution_backend

    trainer = ctx.cfg.trainer
    try:
        build_check_backend(ctx.cfg)
    except ValueError as err:
        found, fix = problem_and_fix(err)
        if ctx.target is not None and "pip install" in fix:  # a package this machine lacks, not the target
            return warn("config/backend", found + " (here)", fix + " (on the target's nodes)")
        return fail("config/backend", found, fix)
    devices = trainer.n_gpus_per_node * trainer.nnodes
    return ok("config/backend", f"trainer.backend={execution_backend(ctx.cfg)}, "
              f"rollout.name={ctx.cfg.actor_rollout_ref.rollout.name}, {devices} device(s)")


def check_devices(ctx: DoctorContext) -> CheckResult:
    """trainer.n_gpus_per_node against the devices this node actually sees."""
    from thinkrl.doctor.environment import visible_devices
    from thinkrl.parallel.device import resolve_device

    trainer = ctx.cfg.trainer
    asked = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node} x trainer.nnodes={trainer.nnodes}"
    if ctx.target is not None:
        if trainer.device not in ("auto", ctx.target.kind):
            return fail("config/devices", f"trainer.device={trainer.device}, but the target is a "
                        f"{ctx.target.kind} machine ({ctx.target.label})",
                        f"set trainer.device={ctx.target.kind} (or auto), or name the target the line is for")
        per_node = ctx.target.per_node
        if per_node is not None and trainer.n_gpus_per_node > per_node:
            return fail("config/devices", f"{asked}, but a node of the target holds {per_node}",
                        f"set trainer.n_gpus_per_node={per_node} (and trainer.nnodes to what the "
                        "cluster has), or name the target's real size (--target ...x<devices per node>)")
        return ok("config/devices", f"{asked} on {ctx.target.describe()}")
    try:
        resolve_device(trainer.device)
    except ValueError as err:
        found, _, fix = str(err).partition(" (")
        return fail("config/devices", found, "(" + fix if fix else str(err))
    kind = ctx.device_kind
    if kind == "cpu":
        cores = os.cpu_count() or 1
        if trainer.device == "auto" and trainer.n_gpus_per_node > cores:
            return warn("config/devices", f"{asked} with trainer.device=auto on a machine without "
                        f"accelerators: {trainer.n_gpus_per_node} CPU processes per node on {cores} "
                        "core(s)", "to judge this line for the cluster it was written for, "
                        "`thinkrl doctor --target h100x8 ...` (or 910bx16, 80GiBx8, ...); to run it "
                        f"here, trainer.n_gpus_per_node={cores} or fewer")
        return ok("config/devices", f"{asked} on the CPU (one process per device)")
    visible, variable = visible_devices(kind)
    if trainer.n_gpus_per_node > visible:
        return fail("config/devices", f"{asked}, but this node sees {visible} {kind} device(s)",
                    f"set trainer.n_gpus_per_node={visible}, or make more devices visible "
                    f"({variable})")
    if trainer.n_gpus_per_node < visible:
        return ok("config/devices", f"{asked}; this node sees {visible} {kind} devices "
                  f"(the rest stay idle; {variable} chooses which)")
    return ok("config/devices", f"{asked}; this node sees {visible} {kind} device(s)")


def check_rollout_parallel(ctx: DoctorContext) -> CheckResult:
    """Rollout TP x PP: one engine's devices must fit in one node and tile it."""
    rollout, trainer = ctx.cfg.actor_rollout_ref.rollout, ctx.cfg.trainer
    tp, pp = rollout.tensor_model_parallel_size, rollout.pipeline_model_parallel_size
    per_engine, per_node = tp * pp, trainer.n_gpus_per_node
    found = f"rollout TP{tp} x PP{pp} = {per_engine} device(s) per engine, {per_node} per node"
    if rollout.name == "native":
        if per_engine != 1:
            return warn("config/rollout-parallel", found + " (rollout.name=native ignores TP/PP)",
                        "remove tensor/pipeline_model_parallel_size, or use rollout.name=vllm")
        return ok("config/rollout-parallel", "rollout.name=native: one engine per device")
    if per_engine > per_node or per_node % per_engine:
        return fail("config/rollout-parallel", found,
                    f"choose TP x PP dividing trainer.n_gpus_per_node={per_node} (e.g. "
                    f"tensor_model_parallel_size={_largest_divisor(per_node, tp)} "
                    "pipeline_model_parallel_size=1)")
    from thinkrl.rollout.vllm_checks import engine_parallel_problem
    from thinkrl.config.checks import execution_backend
    problem = engine_parallel_problem(rollout, execution_backend(ctx.cfg))
    if problem is not None:
        return fail("config/rollout-parallel", found + ": " + problem[0], problem[1])
    return ok("config/rollout-parallel", found)


def check_rollout_model(ctx: DoctorContext) -> CheckResult:
    """The rollout engine takes this kind of model: the start-up check
    (`thinkrl.preflight.check_model`) on the model's config."""
    from thinkrl.rollout.vllm_checks import engine_model_problem

    rollout = ctx.cfg.actor_rollout_ref.rollout
    config = ctx.model_config
    vision = getattr(config, "vision_config", None) is not None
    problem = engine_model_problem(rollout, config)
    if problem is not None:
        return fail("config/rollout-model", *problem)
    if vision and rollout.name == "vllm":
        from thinkrl.preflight import check_vllm_vision_usable
        try:
            check_vllm_vision_usable()
        except ValueError as err:
            return fail("config/rollout-model", *problem_and_fix(err))
    return ok("config/rollout-model", f"rollout.name={rollout.name} takes the "
              f"{'vision-language' if vision else 'text'} model {config.model_type!r}")


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(at_most, 1))


def check_parallel_layout(ctx: DoctorContext) -> list[CheckResult]:
    """Actor, reference and rollout sharding agree with each other, with the
    device count, and with any pre-sharded weights the model path holds."""
    arr, world = ctx.cfg.actor_rollout_ref, ctx.cfg.trainer.n_gpus_per_node * ctx.cfg.trainer.nnodes
    results: list[CheckResult] = []
    for role in ("actor", "ref"):
        size = getattr(arr, role).fsdp_config.fsdp_size
        if size != -1 and (size < 1 or world % size):
            results.append(fail(
                "config/parallel-layout", f"{role}.fsdp_config.fsdp_size={size} with {world} device(s)",
                f"use -1 (shard over all devices) or a divisor of {world}"))
    actor_fsdp, ref_fsdp = arr.actor.fsdp_config.fsdp_size, arr.ref.fsdp_config.fsdp_size
    if actor_fsdp != ref_fsdp and not results:
        results.append(warn(
            "config/parallel-layout", f"actor fsdp_size={actor_fsdp}, ref fsdp_size={ref_fsdp}",
            "the reference is a copy of the actor's weights; give both the same fsdp_size"))
    results.extend(_sharded_weights(ctx))
    return results or [ok("config/parallel-layout",
                          f"actor and reference shard alike over {world} device(s); "
                          "the model path holds Hugging Face weights")]


def _sharded_weights(ctx: DoctorContext) -> list[CheckResult]:
    """The reference loads the actor's model path in this release (there is
    no separate reference path), so one sharded folder serves both roles and
    must match the run's layout; thinkrl itself loads Hugging Face folders."""
    try:
        path = ctx.model_path
    except NotChecked:
        path = ctx.cfg.actor_rollout_ref.model.path  # a builtin that failed: not sharded
    layout = read_sharded_layout(path)
    if layout is None:
        return []
    rollout = ctx.cfg.actor_rollout_ref.rollout
    run_tp, run_pp = rollout.tensor_model_parallel_size, rollout.pipeline_model_parallel_size
    found = (f"actor_rollout_ref.model.path holds Megatron-sharded weights {layout.describe()}; "
             f"the actor and the reference load it, the rollout runs TP{run_tp} PP{run_pp}")
    if (layout.tensor_parallel, layout.pipeline_parallel) != (run_tp, run_pp):
        found += " - the layouts differ (seed 000: AclOpKernelInit failed)"
    return [fail("config/parallel-layout", found,
                 "load the Hugging Face folder the shards were converted from "
                 "(actor_rollout_ref.model.path=/path/to/hf_model); with sharded weights, convert "
                 "actor and reference with the same TP/PP as the run")]


CHECKS = [check_validate, check_backend, check_devices, check_rollout_parallel, check_rollout_model,
          check_parallel_layout]
