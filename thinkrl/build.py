"""Assemble a run from its config: device, tokenizer, models, data, roles.

Everything a user can get wrong is checked here, before the first step, so
the driver (`thinkrl.trainer`) only ever sees a run that can start.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch
import yaml

from thinkrl import builtin
from thinkrl.algos.advantages import build_advantage_estimator
from thinkrl.algos.kl_control import KLController
from thinkrl.assets import (generation_batch_size, prompt_set, run_stop_ids, run_tokenizer,
                            total_training_steps, validation_sampling)
from thinkrl.checkpoint.lock import RunLock
from thinkrl.checkpoint.resume import checkpoint_to_resume
from thinkrl.checkpoint.state import load_checkpoint
from thinkrl.config import Config, DerivedSizes, execution_backend, inactive_settings, validate
from thinkrl.config.loading import config_to_dict
from thinkrl.data.dataset import PromptLoader
from thinkrl.data.images import check_image_backend
from thinkrl.metrics import MetricsLog
from thinkrl.models.loading import load_generation_config
from thinkrl.parallel.device import synchronizer
from thinkrl.preflight import check_backend
from thinkrl.reward_watch import FailureBreaker, ZeroRewardWatch
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rollout.base import SamplingParams
from thinkrl.run import Roles, Run
from thinkrl.workers.policy_rank import PolicyRank, RankSpec

from thinkrl.workers.handles import ActorHandle, CriticHandle, EngineHandle, ReferenceHandle
from thinkrl.workers.ray_group import RayWorkerGroup


def build_run(cfg: Config, *, log=print) -> Run:
    """The run of `cfg`, holding the lock of its run directory (taken first:
    a second run into the same folder is refused before anything loads)."""
    sizes = validate(cfg)
    check_backend(cfg)
    lock = RunLock.acquire(cfg.trainer.default_local_dir, log=log)
    try:
        run = _assemble(cfg, sizes, log=log)
    except BaseException:
        lock.release()
        raise
    run.lock = lock
    return run


def _assemble(cfg: Config, sizes: DerivedSizes, *, log=print) -> Run:
    for note in inactive_settings(cfg):
        log(f"note: {note}")
    arr = cfg.actor_rollout_ref
    torch.manual_seed(cfg.trainer.seed)

    if arr.model.external_lib:  # registers custom architectures with transformers
        try:
            importlib.import_module(arr.model.external_lib)
        except ImportError as err:
            raise ValueError(f"actor_rollout_ref.model.external_lib={arr.model.external_lib}: "
                             f"cannot import it ({err}); install it or remove the key") from None
    model_path = builtin.resolve_model_path(arr.model.path, log=log)
    data = cfg.data
    tokenizer = run_tokenizer(cfg, model_path)
    train_prompts = prompt_set(cfg, tokenizer, files=data.train_files, key="data.train_files",
                               template=data.template, log=log)
    val_prompts = prompt_set(cfg, tokenizer, files=data.val_files, key="data.val_files",
                             template=data.val_template or data.template, log=log)
    check_image_backend(cfg, train_prompts + val_prompts)  # images: local backend only
    reward = RewardScorer.from_config(cfg)  # a bad custom reward file stops the run here
    # An unknown data_source stops the run here, not at step 1.
    reward.check_sources(p.sample.data_source for p in train_prompts + val_prompts)

    train_loader = PromptLoader(train_prompts, batch_size=generation_batch_size(cfg),
                                shuffle=data.shuffle, seed=data.seed,
                                pad_token_id=tokenizer.pad_token_id)
    total_steps = total_training_steps(cfg, batches_per_epoch=train_loader.batches_per_epoch)

    spec = RankSpec(cfg=cfg, sizes=sizes, model_path=model_path, total_steps=total_steps,
                    eos_token_ids=tuple(run_stop_ids(cfg, tokenizer, load_generation_config(
                        model_path, arr.model.trust_remote_code))),
                    pad_token_id=tokenizer.pad_token_id, tokenizer_size=len(tokenizer),
                    with_reference=arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)
    roles = build_roles(spec, log=log)
    actor, reference, engine = roles.actor, roles.reference, roles.engine
    sync, close_workers = roles.sync, roles.close
    try:  # the workers hold processes (and devices) until closed
        rollout = arr.rollout
        sampling = SamplingParams(n=rollout.n, max_tokens=sizes.response_length,
                                  temperature=rollout.temperature, top_p=rollout.top_p,
                                  top_k=rollout.top_k, min_p=rollout.min_p,
                                  do_sample=rollout.do_sample,
                                  ignore_eos=rollout.ignore_eos)
        val_sampling = validation_sampling(cfg, max_tokens=sizes.response_length)

        run_dir = Path(cfg.trainer.default_local_dir).expanduser().resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / "config.yaml").open("w") as f:
            yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
        resume_from = checkpoint_to_resume(cfg.trainer, run_dir, log=log)
        metrics_log = MetricsLog(run_dir, loggers=cfg.trainer.logger, print_fn=log,
                                 config=config_to_dict(cfg))
        run = Run(cfg=cfg, sizes=sizes, run_dir=run_dir, model_path=model_path,
                  tokenizer=tokenizer, actor=actor, reference=reference, engine=engine, train_loader=train_loader,
                  val_prompts=val_prompts, reward=reward,
                  zero_reward_watch=ZeroRewardWatch(cfg.reward.zero_reward_warn_steps),
                  advantage_fn=build_advantage_estimator(cfg.algorithm),
                  sampling=sampling, val_sampling=val_sampling, total_steps=total_steps,
                  metrics_log=metrics_log,
                  kl_controller=_kl_controller(cfg), sync=sync,
                  close_workers=close_workers,
                  reward_breaker=FailureBreaker.from_config(cfg.reward), critic=roles.critic)
    except BaseException:
        close_workers()
        raise
    try:
        if resume_from is not None:  # the reference keeps the initial weights
            run.progress = load_checkpoint(run, resume_from, log=log)
            run.engine.update_weights(run.actor.weights())  # an engine with its own copy
        # Only now, with the checkpoint loaded, may metrics.jsonl change; it is
        # continued only when the checkpoint belongs to this run directory.
        own = resume_from is not None and resume_from.parent == run_dir
        metrics_log.begin(resume_step=run.progress.step if own else None)
        reward.start()  # worker start-up is not charged to the first step's timings
    except BaseException:
        run.close()
        raise
    return run


def build_roles(spec: RankSpec, *, log=print) -> Roles:
    if execution_backend(spec.cfg) == "local":
        rank = PolicyRank(spec)
        return Roles(rank.actor, rank.reference, rank.engine, synchronizer(rank.device),
                     close=getattr(rank.engine, "close", lambda: None), critic=rank.critic)
    group = RayWorkerGroup.start(spec, log=log)
    return Roles(ActorHandle(group), ReferenceHandle(group) if spec.with_reference else None,
                 EngineHandle(group), sync=lambda: None, close=group.close,
                 critic=CriticHandle(group) if spec.sizes.critic is not None else None)


def _kl_controller(cfg: Config) -> KLController | None:
    if not cfg.algorithm.use_kl_in_reward:
        return None
    ctrl = cfg.algorithm.kl_ctrl
    return KLController(value=ctrl.kl_coef, adaptive=ctrl.type == "adaptive",
                        target_kl=ctrl.target_kl, horizon=ctrl.horizon)
