"""Assemble a run from its config: device, tokenizer, models, data, roles.

Everything a user can get wrong is checked here, before the first step, so
the driver (`thinkrl.trainer`) only ever sees a run that can start.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from pathlib import Path

import torch
import yaml

from thinkrl.builtin import resolve_model_path
from thinkrl.algos.advantages import build_advantage_estimator
from thinkrl.algos.kl_control import KLController
from thinkrl.algos.rollout_correction import RolloutCorrection
from thinkrl.async_rollout.launch import start_async_rollout
from thinkrl.assets import (generation_batch_size, prompt_set, run_tokenizer,
                            total_training_steps, training_sampling, val_batch_size,
                            validation_sampling)
from thinkrl.checkpoint.lock import RunLock
from thinkrl.checkpoint.resume import checkpoint_to_resume
from thinkrl.checkpoint.state import load_checkpoint
from thinkrl.config import Config
from thinkrl.config.sizes import DerivedSizes
from thinkrl.config.checks import execution_backend, validate
from thinkrl.config.distill_checks import needs_reference
from thinkrl.config.moe_checks import router_replay_mode
from thinkrl.config.inactive import inactive_settings
from thinkrl.config.loading import config_to_dict
from thinkrl.data.dataset import PromptLoader
from thinkrl.data.images import check_image_backend
from thinkrl.data.mixture import MixtureLoader, source_weights
from thinkrl.errors import UserError
from thinkrl.metrics import MetricsLog
from thinkrl.parallel.device import synchronizer
from thinkrl.preflight import check_backend, check_model
from thinkrl.reward_watch import FailureBreaker, ZeroRewardWatch
from thinkrl.rewards.gold_answers import gold_responses
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.run import Roles, Run, RunSpec, RunState, StepSettings
from thinkrl.stages.sampling import Draw, OverlongPenalty, build_sampler
from thinkrl.teachers import check_teacher_sources, resolve_teachers
from thinkrl.envs.routing import SINGLE_TURN, EnvRouter
from thinkrl.envs.setup import check_rows, needs_loop, run_router, with_env_loop
from thinkrl.tools.setup import chat_kwargs_with_tools, run_tools
from thinkrl.workers.group import LocalGroup
from thinkrl.workers.policy_rank import RankSpec

from thinkrl.workers.handles import ActorHandle, CriticHandle, EngineHandle, ReferenceHandle, TeacherHandle
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
    torch.manual_seed(cfg.trainer.seed)
    import_external_lib(cfg)
    model_path = resolve_model_path(cfg.actor_rollout_ref.model.path, log=log)
    for note in check_model(cfg, model_path):
        log(f"note: {note}")
    tokenizer = run_tokenizer(cfg, model_path)
    data = cfg.data
    tools = run_tools(cfg)  # a bad tool file stops the run here
    chat = chat_kwargs_with_tools(cfg, tools)
    train_prompts = prompt_set(cfg, tokenizer, files=data.train_files, key="data.train_files",
                               template=data.template, log=log, chat_kwargs=chat)
    val_prompts = prompt_set(cfg, tokenizer, files=data.val_files, key="data.val_files",
                             template=data.val_template or data.template, log=log, chat_kwargs=chat)
    check_image_backend(cfg, train_prompts + val_prompts)  # images: local backend only
    router = run_router(cfg, tools)  # a broken environment or interaction file stops the run here
    try:
        return _assemble_with(cfg, sizes, router, train_prompts=train_prompts, val_prompts=val_prompts,
                              tokenizer=tokenizer, model_path=model_path, chat=chat, log=log)
    except BaseException:
        router.close()
        raise


def _assemble_with(cfg: Config, sizes: DerivedSizes, router: EnvRouter, *, train_prompts, val_prompts,
                   tokenizer, model_path: str, chat: dict, log) -> Run:
    environments = check_rows(router, [p.sample for p in train_prompts], key="data.train_files", log=log)
    for name, rows in check_rows(router, [p.sample for p in val_prompts], key="data.val_files", log=log).items():
        environments[name] = environments.get(name, 0) + rows
    if needs_loop(environments) and cfg.async_training.mode != "off":
        raise UserError(f"async_training.mode={cfg.async_training.mode}: rows talk to environments "
                         f"({', '.join(sorted(n for n in environments if n != SINGLE_TURN))}), which the "
                         "rollout process does not run yet: set async_training.mode=off")
    teachers = resolve_teachers(cfg, tokenizer, log=log)  # a wrong teacher stops the run here
    check_teacher_sources(teachers, [p.sample.data_source for p in train_prompts], key="data.train_files")
    reward = RewardScorer.from_config(cfg)  # a bad custom reward file stops the run here
    # An unknown data_source stops the run here, not at step 1 (rows an environment scores need none).
    scored = [p.sample for p in train_prompts + val_prompts if not router.owns_reward(p.sample)]
    try:
        reward.check_sources(s.data_source for s in scored)
        if cfg.reward.startup_trial:  # a row per source, its gold answer in every format
            reward.trial({s.data_source: s for s in reversed(scored)}.values(), gold_responses)
    except BaseException:
        reward.close()
        raise
    train_loader = prompt_loader(cfg, train_prompts, pad_token_id=tokenizer.pad_token_id, log=log)
    total_steps = total_training_steps(cfg, batches_per_epoch=train_loader.batches_per_epoch)
    rank_spec = RankSpec.of_model(cfg, sizes, model_path, tokenizer, total_steps=total_steps,
                                  with_reference=needs_reference(cfg), teachers=teachers)
    roles = build_roles(rank_spec, log=log)
    roles = dataclasses.replace(roles, close=functools.partial(_close_all, roles.close, router.close))
    if cfg.actor_rollout_ref.model.lora_rank > 0 and cfg.actor_rollout_ref.rollout.name == "vllm":
        from thinkrl.rollout.vllm_lora import adapter_serving
        log(f"note: {adapter_serving(cfg)[1]}; attested at every sync")
    if needs_loop(environments):  # every generate call (training and validation) runs the loop
        log(f"environments: {', '.join(f'{name} ({rows} rows)' for name, rows in sorted(environments.items()))}")
        roles = dataclasses.replace(roles, engine=with_env_loop(
            cfg, roles.engine, tokenizer=tokenizer, router=router,
            eos_token_ids=list(rank_spec.eos_token_ids), chat_kwargs=chat))
    try:  # the workers hold processes (and devices) until closed
        run_dir = _run_dir(cfg)
        resume_from = checkpoint_to_resume(cfg.trainer, run_dir, log=log)
        sampling = training_sampling(cfg, max_tokens=sizes.response_length)
        spec = RunSpec(cfg=cfg, sizes=sizes, run_dir=run_dir, model_path=model_path,
                       tokenizer=tokenizer, val_prompts=val_prompts, sampling=sampling,
                       val_sampling=validation_sampling(cfg, max_tokens=sizes.response_length),
                       val_batch_size=val_batch_size(cfg, len(val_prompts)),
                       total_steps=total_steps, advantage_fn=build_advantage_estimator(cfg.algorithm),
                       step=step_settings(cfg, sizes, teachers=teachers))
        state = RunState(train_loader=train_loader,
                         metrics_log=MetricsLog(run_dir, loggers=cfg.trainer.logger, print_fn=log,
                                                config=config_to_dict(cfg)),
                         zero_reward_watch=ZeroRewardWatch(cfg.reward.zero_reward_warn_steps),
                         kl_controller=_kl_controller(cfg),
                         reward_breaker=FailureBreaker.from_config(cfg.reward))
        draw = Draw(roles.engine, train_loader, reward, tokenizer, sampling,
                    overlong=_overlong_penalty(cfg, sizes), breaker=state.reward_breaker)
        sample = build_sampler(cfg, draw)
        if cfg.async_training.mode != "off":  # the rollout on a process of its own
            roles, sample = start_async_rollout(cfg, rank_spec, roles, draw, log=log)
        run = Run(spec, roles, state, reward=reward, sample=sample)
    except BaseException:
        roles.close()
        raise
    try:
        _start(run, resume_from, log=log)
    except BaseException:
        run.close()
        raise
    return run


def prompt_loader(cfg: Config, prompts: list, *, pad_token_id: int, log=print) -> PromptLoader:
    """Seeded batches of the training prompts; in data.mixture's proportions when it is set."""
    data, size = cfg.data, generation_batch_size(cfg)
    if not data.mixture:
        return PromptLoader(prompts, batch_size=size, shuffle=data.shuffle, seed=data.seed,
                            pad_token_id=pad_token_id)
    sources = sorted({p.sample.data_source for p in prompts})
    weights = source_weights(data.mixture, sources, log=log)
    log("data.mixture: " + ", ".join(f"{s} {w:.3f}" for s, w in weights.items()))
    return MixtureLoader(prompts, weights=weights, batch_size=size, shuffle=data.shuffle, seed=data.seed,
                         pad_token_id=pad_token_id)


def _close_all(*closers) -> None:
    """Call every closer, even when one raises (the first error is raised after)."""
    errors = []
    for close in closers:
        try:
            close()
        except BaseException as err:  # noqa: PERF203 - each must run
            errors.append(err)
    if errors:
        raise errors[0]


def step_settings(cfg: Config, sizes: DerivedSizes, *, teachers: tuple = ()) -> StepSettings:
    """What the step's stages read, from the config once."""
    algo, arr = cfg.algorithm, cfg.actor_rollout_ref
    asynchronous = cfg.async_training.mode != "off"
    from_rollout = arr.actor.use_rollout_log_probs
    # Async samples may come from older weights: pi_old is then not the
    # update's own first forward, and (unless pi_old is the behaviour policy
    # itself, use_rollout_log_probs) rollout_is corrects for the behaviour
    # policy. Whether a batch is behind is read from the versions stamped on
    # its tokens (StepSettings.for_batch), not from the window: streaming at
    # window 1 still trains tokens of the previous version; a batch with none
    # is the synchronous algorithm and is left exactly so.
    off_policy = sizes.optimizer_steps_per_step > 1 or from_rollout
    correction = RolloutCorrection(algo.rollout_is_threshold, algo.rollout_is_level, algo.rollout_is_mode)
    # An engine with its own weights (vllm, the rollout process), or rollout_is's
    # correction: the trainer's log-probs of the sampled tokens are compared with the engine's.
    checks_engine = arr.rollout.name != "native" or algo.rollout_is or asynchronous
    replay = router_replay_mode(cfg)  # R2 records, R3 replays (and is compared) in the old-log-prob pass
    return StepSettings(
        recompute_old_logprobs=(off_policy or algo.use_kl_in_reward or checks_engine or replay != "disabled")
        and not from_rollout,
        old_from_rollout=from_rollout,
        off_policy=off_policy, kl_loss=arr.actor.use_kl_loss and needs_reference(cfg),
        kl_penalty=algo.kl_penalty,
        rollout_correction=correction if algo.rollout_is else None,
        behind_correction=correction if asynchronous and not from_rollout else None,
        critic_warmup=cfg.trainer.critic_warmup,
        train_generations=cfg.trainer.log_train_generations,
        generations_every=cfg.trainer.generations_log_freq, teachers=teachers, router_replay=replay)


def _overlong_penalty(cfg: Config, sizes: DerivedSizes) -> OverlongPenalty | None:
    buffer = cfg.reward_model.overlong_buffer
    if not buffer.enable:
        return None
    return OverlongPenalty(buffer.len, buffer.penalty_factor, sizes.response_length, buffer.log)


def import_external_lib(cfg: Config) -> None:
    """actor_rollout_ref.model.external_lib: registers custom architectures with transformers."""
    lib = cfg.actor_rollout_ref.model.external_lib
    if not lib:
        return
    try:
        importlib.import_module(lib)
    except ImportError as err:
        raise UserError(f"actor_rollout_ref.model.external_lib={lib}: cannot import it ({err}); "
                         "install it or remove the key") from None


def _run_dir(cfg: Config) -> Path:
    """trainer.default_local_dir, made, with the run's config.yaml written into it."""
    run_dir = Path(cfg.trainer.default_local_dir).expanduser().resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "config.yaml").open("w") as f:
        yaml.safe_dump(config_to_dict(cfg), f, sort_keys=False)
    return run_dir


def _start(run: Run, resume_from: Path | None, *, log) -> None:
    """Load the checkpoint resumed from, open metrics.jsonl, start the scorers."""
    if resume_from is not None:  # the reference keeps the initial weights
        run.state.progress = load_checkpoint(run, resume_from, log=log)
    # An engine with its own copy of the weights gets the actor's (resumed
    # ones) and proves it serves them before the first sample is drawn.
    run.roles.engine.sync_weights(version=run.state.progress.step)
    # Only now, with the checkpoint loaded, may metrics.jsonl change; it is
    # continued only when the checkpoint belongs to this run directory.
    own = resume_from is not None and resume_from.parent == run.spec.run_dir
    run.state.metrics_log.begin(resume_step=run.state.progress.step if own else None)
    run.reward.start()  # worker start-up is not charged to the first step's timings


def build_roles(spec: RankSpec, *, log=print) -> Roles:
    """The driver's handles over the run's ranks: one `PolicyRank` in this
    process (trainer.backend=local) or one Ray actor per device (ray); the
    handles are the same. The weight sync is chosen here: an engine with its
    own weights (vllm) is refreshed after each update; the native engine
    samples from the actor's module and needs none."""
    if execution_backend(spec.cfg) == "local":
        group = LocalGroup(spec)
        sync = synchronizer(group.rank.device)
    else:
        group, sync = RayWorkerGroup.start(spec, log=log), (lambda: None)  # Ray calls already waited
    return Roles(ActorHandle(group), ReferenceHandle(group) if spec.with_reference else None,
                 EngineHandle(group, own_weights=spec.cfg.actor_rollout_ref.rollout.name != "native"),
                 sync=sync, close=group.close,
                 critic=CriticHandle(group) if spec.sizes.critic is not None else None,
                 teachers=TeacherHandle(group) if spec.teachers else None)


def _kl_controller(cfg: Config) -> KLController | None:
    if not cfg.algorithm.use_kl_in_reward:
        return None
    ctrl = cfg.algorithm.kl_ctrl
    return KLController(value=ctrl.kl_coef, adaptive=ctrl.type == "adaptive",
                        target_kl=ctrl.target_kl, horizon=ctrl.horizon)
