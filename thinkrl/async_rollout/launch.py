"""Starting asynchronous training's rollout side for a run being built
(`thinkrl.build`): the rollout process, the role the driver talks to, the
sampler, and the split of a CPU's cores between the two sides."""

from __future__ import annotations

import dataclasses

import torch

from thinkrl.async_rollout.process import RolloutProcess
from thinkrl.async_rollout.sampler import AsyncRollout, AsyncSampler, Window
from thinkrl.async_rollout.stream import StreamArgs, StreamSchedule
from thinkrl.async_rollout.streaming import StreamingRollout
from thinkrl.config import Config
from thinkrl.config.schema_async import partial_rollout_on
from thinkrl.errors import UserError
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


def stream_args(cfg: Config, spec: RankSpec, draw: Draw, window: Window) -> StreamArgs:
    """Streaming rollout's settings: one batch's responses as slots at most
    (rollout.max_num_seqs), weights synced at `window`'s steps, the trainer's
    loader where it stands."""
    rollout, n = cfg.actor_rollout_ref.rollout, draw.sampling.n
    batch = cfg.data.train_batch_size
    schedule = StreamSchedule(groups_per_batch=batch, cap=window.cap, sync_every=window.sync_every)
    return StreamArgs(loader=draw.loader, params=draw.sampling, schedule=schedule,
                      slots=max(n, min(rollout.max_num_seqs, batch * n)),
                      partial=partial_rollout_on(cfg.async_training), seed=spec.sampling_seed)


def start_async_rollout(cfg: Config, spec: RankSpec, roles: Roles, draw: Draw, *,
                        log=print) -> tuple[Roles, Sampler]:
    """The run's roles with the rollout process as their engine, and the sampler
    that takes its batches. The trainer's own engine stays for validation,
    and for nothing else: validating on the rollout process would change
    the weights and the generator the training stream samples with."""
    asynchronous = cfg.async_training
    if is_vision_model(spec.model_path):
        raise UserError("async_training.mode: vision-language models are not supported by the "
                         "rollout process yet; set async_training.mode=off")
    on_cpu = resolve_device(spec.device or cfg.trainer.device).type == "cpu"
    trainer_threads, rollout_threads = thread_split(cfg) if on_cpu else (0, 0)
    window = async_window(cfg)
    stream = stream_args(cfg, spec, draw, window) if asynchronous.streaming else None
    chunked = partial_rollout_on(asynchronous) and stream is None  # streaming decodes token by token
    chunk = asynchronous.partial_chunk_tokens if chunked else 0
    process = RolloutProcess(spec, chunk_tokens=chunk, threads=rollout_threads,
                             timeout_s=cfg.trainer.ray_wait_timeout_s, stream=stream)
    threads_before = torch.get_num_threads()
    if trainer_threads:
        torch.set_num_threads(trainer_threads)
    if stream is None:
        rollout = AsyncRollout(process, roles.actor, window=window, loader=draw.loader,
                               sampling=draw.sampling, validation_engine=roles.engine)
        shape = f"at most {window.cap} batch(es) dispatched per sync window"
    else:
        rollout = StreamingRollout(process, roles.actor, schedule=stream.schedule,
                                   validation_engine=roles.engine)
        shape = (f"streaming: {stream.slots} slots of continuous batching, a batch is the first "
                 f"{stream.schedule.groups_per_batch} groups to finish, window {window.cap}")
    log(f"async training ({asynchronous.mode}): a rollout process (pid {process.process.pid}"
        + (f", torch threads: {rollout_threads}; the trainer's: {trainer_threads}" if on_cpu else "")
        + f"); weights synced every {window.sync_every} step(s), {shape}"
        + (", partial rollout on (a seeded run will not repeat: which chunk a sync lands on depends on "
           "timing)" if chunked else ", partial rollout off (verl's default is on; off, a seeded run "
           "repeats; streaming=True keeps the overlap and repeats too)" if stream is None else
           f", partial rollout {'on: in-flight updates at fixed points' if stream.partial else 'off'}")
        + "; pi_old: "
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
