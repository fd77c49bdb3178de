"""Starting asynchronous training's rollout side for a run being built
(`thinkrl.build`): the rollout process, the role the driver talks to, the
sampler, and the split of a CPU's cores between the two sides."""

from __future__ import annotations

import dataclasses

import torch

from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.async_rollout.sampler import AsyncRollout, AsyncSampler, Window
from thinkrl.config import Config
from thinkrl.models.vision import is_vision_model
from thinkrl.parallel.device import resolve_device
from thinkrl.run import Roles
from thinkrl.stages.sampling import Draw, Sampler
from thinkrl.workers.policy_rank import RankSpec


def thread_split(cfg: Config, cores: int | None = None) -> tuple[int, int]:
    """(trainer threads, rollout threads) on a CPU, out of the threads this
    process would use alone (torch's, which OMP_NUM_THREADS sets):
    async_training.rollout_threads for the rollout (0: half), and
    async_training.trainer_threads (0: the rest) for the trainer, at least 1 each."""
    cores = cores or torch.get_num_threads()
    rollout = cfg.async_training.rollout_threads or max(1, cores // 2)
    return cfg.async_training.trainer_threads or max(1, cores - rollout), rollout


def async_window(cfg: Config) -> Window:
    """How far generation may run ahead of the trainer (async_training.*)."""
    a = cfg.async_training
    return Window.of(a.mode, staleness_threshold=a.staleness_threshold,
                     sync_every=a.trigger_parameter_sync_step)


def start_async_rollout(cfg: Config, spec: RankSpec, roles: Roles, draw: Draw, *,
                        log=print) -> tuple[Roles, Sampler]:
    """The run's roles with the rollout process as their engine, and the sampler
    that takes its batches. The trainer's own engine stays for nothing else."""
    asynchronous = cfg.async_training
    if is_vision_model(spec.model_path):
        raise ValueError("async_training.mode: vision-language models are not supported by the "
                         "rollout process yet; set async_training.mode=off")
    on_cpu = resolve_device(spec.device or cfg.trainer.device).type == "cpu"
    trainer_threads, rollout_threads = thread_split(cfg) if on_cpu else (0, 0)
    chunk = asynchronous.partial_chunk_tokens if asynchronous.partial_rollout else 0
    process = RolloutProcess(spec, chunk_tokens=chunk, threads=rollout_threads,
                             timeout_s=cfg.trainer.ray_wait_timeout_s)
    threads_before = torch.get_num_threads()
    if trainer_threads:
        torch.set_num_threads(trainer_threads)
    window = async_window(cfg)
    rollout = AsyncRollout(process, roles.actor, window=window, loader=draw.loader,
                           sampling=draw.sampling)
    log(f"async training ({asynchronous.mode}): a rollout process (pid {process.process.pid}"
        + (f", torch threads: {rollout_threads}; the trainer's: {trainer_threads}" if on_cpu else "")
        + f"); weights synced every {window.sync_every} step(s), at most {window.cap} batch(es) "
        f"dispatched per sync window, partial rollout {'on' if chunk else 'off'}; pi_old: "
        + ("the rollout's log-probs (actor.use_rollout_log_probs)"
           if cfg.actor_rollout_ref.actor.use_rollout_log_probs else
           "the trainer's policy before the update, with algorithm.rollout_is correcting "
           "for the rollout's"))

    def close() -> None:
        try:
            process.close()
        finally:
            torch.set_num_threads(threads_before)
            roles.close()

    return dataclasses.replace(roles, engine=rollout, close=close), AsyncSampler(rollout, draw)
