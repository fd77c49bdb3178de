"""Assemble a run from its config: device, tokenizer, models, data, roles.

Everything a user can get wrong is checked here, before the first step, so
the driver (`thinkrl.trainer`) only ever sees a run that can start.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import yaml

from thinkrl import builtin
from thinkrl.algos.advantages import build_advantage_estimator
from thinkrl.algos.kl_control import KLController
from thinkrl.checkpoint.lock import RunLock
from thinkrl.checkpoint.resume import checkpoint_to_resume
from thinkrl.checkpoint.state import Progress, load_checkpoint
from thinkrl.config import Config, DerivedSizes, execution_backend, inactive_settings, validate
from thinkrl.config.loading import config_to_dict
from thinkrl.data.dataset import Prompt, PromptLoader, load_prompts
from thinkrl.data.images import check_image_backend, run_image_encoder
from thinkrl.data.templates import stop_token_ids
from thinkrl.dynamic_sampling import generation_batch_size
from thinkrl.errors import SetupError
from thinkrl.metrics import MetricsLog
from thinkrl.models.loading import eos_token_ids, load_generation_config, load_tokenizer
from thinkrl.parallel.device import resolve_device, synchronizer
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rewards.watch import FailureBreaker, ZeroRewardWatch
from thinkrl.rollout.base import RolloutEngine, SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.workers.policy_rank import PolicyRank, RankSpec, sampling_seed

if TYPE_CHECKING:
    from thinkrl.workers.actor import ActorWorker
    from thinkrl.workers.critic import CriticWorker
    from thinkrl.workers.ray_critic import CriticHandle
    from thinkrl.workers.ray_group import ActorHandle, ReferenceHandle
    from thinkrl.workers.reference import ReferenceWorker


@dataclass
class Run:
    cfg: Config
    sizes: DerivedSizes
    run_dir: Path
    model_path: str
    """actor_rollout_ref.model.path with `builtin:` names resolved to folders."""
    tokenizer: object
    actor: ActorWorker | ActorHandle
    """The policy and its update: the plain role (local) or a handle that
    fans out to the ranks of a Ray worker group (ray)."""
    reference: ReferenceWorker | ReferenceHandle | None
    engine: RolloutEngine
    train_loader: PromptLoader
    val_prompts: list[Prompt]
    reward: RewardScorer
    """Scores responses (worker processes with a per-response timeout); close() it."""
    zero_reward_watch: ZeroRewardWatch
    advantage_fn: Callable
    sampling: SamplingParams
    val_sampling: SamplingParams
    total_steps: int
    metrics_log: MetricsLog
    kl_controller: KLController | None
    """beta of the KL penalty in the reward (algorithm.use_kl_in_reward)."""
    sync: Callable[[], None]
    """Waits for the device's queued work (for honest stage timings)."""
    progress: Progress = field(default_factory=Progress)
    """Where training stands: step 0, or the step of the checkpoint resumed from."""
    close_workers: Callable[[], None] = lambda: None
    """Stops the Ray workers (ray backend)."""
    reward_breaker: FailureBreaker | None = None
    """Stops the run when most responses fail to score (reward.max_failure_rate)."""
    lock: RunLock | None = None
    """This run's exclusive hold on run_dir (thinkrl.checkpoint.lock); close() frees it."""
    critic: CriticWorker | CriticHandle | None = None
    """PPO's value model and its update (algorithm.adv_estimator=gae); None otherwise."""

    def close(self) -> None:
        """Stop the scoring workers and the Ray workers, close the logger sinks,
        free the run directory."""
        try:
            self.reward.close()
            self.metrics_log.close()
        finally:
            self.close_workers()
            if self.lock is not None:
                self.lock.release()

    @property
    def recomputes_rollout_logprobs(self) -> bool:
        """The engine samples from its own copy of the weights (vllm), or the
        drift is corrected: the trainer recomputes the log-probs of every
        sampled token to measure (and with rollout_is, correct) the gap."""
        return self.cfg.actor_rollout_ref.rollout.name != "native" or self.cfg.algorithm.rollout_is

    @property
    def on_policy(self) -> bool:
        """One optimizer step per training step on fresh samples: pi_old is
        the current policy, so the old log-probs need no extra forward pass."""
        return self.sizes.optimizer_steps_per_step == 1


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
        from thinkrl.rollout.vllm_engine import check_vllm_usable, engine_parallel_problem
        problem = engine_parallel_problem(rollout, execution_backend(cfg))
        if problem is not None:
            raise SetupError(*problem)
        # On the driver; each rank checks again on its own device at start.
        device = cfg.trainer.device
        check_vllm_usable(device if device != "auto" else resolve_device("auto").type)


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


@dataclass(frozen=True)
class Roles:
    """What the driver calls: the plain roles of one PolicyRank in this
    process (local backend), or the driver-side handles of a Ray worker
    group with one rank per device (ray backend)."""

    actor: ActorWorker | ActorHandle
    reference: ReferenceWorker | ReferenceHandle | None
    engine: RolloutEngine
    sync: Callable[[], None]
    """Waits for the device's queued work (a no-op when Ray calls already waited)."""
    close: Callable[[], None]
    """Stops the workers (ray backend)."""
    critic: CriticWorker | CriticHandle | None = None
    """The value model (algorithm.adv_estimator=gae), or None."""


def build_roles(spec: RankSpec, *, log=print) -> Roles:
    if execution_backend(spec.cfg) == "local":
        rank = PolicyRank(spec)
        return Roles(rank.actor, rank.reference, rank.engine, synchronizer(rank.device),
                     close=getattr(rank.engine, "close", lambda: None), critic=rank.critic)
    from thinkrl.workers.ray_group import RayWorkerGroup
    group = RayWorkerGroup.start(spec, log=log)
    return Roles(group.actor, group.reference, group.engine, sync=lambda: None, close=group.close,
                 critic=group.critic)


def total_training_steps(cfg: Config, *, batches_per_epoch: int) -> int:
    """trainer.total_training_steps, else total_epochs full passes over the prompts."""
    return cfg.trainer.total_training_steps or cfg.trainer.total_epochs * batches_per_epoch


def tokenizer_path(cfg: Config, model_path: str) -> str:
    """data.tokenizer, else actor_rollout_ref.model.tokenizer_path, else the model's own."""
    return cfg.data.tokenizer or cfg.actor_rollout_ref.model.tokenizer_path or model_path


def tokenizer_options(cfg: Config) -> dict:
    """How the run's tokenizer is loaded (`load_tokenizer` keyword arguments)."""
    model = cfg.actor_rollout_ref.model
    return dict(trust_remote_code=model.trust_remote_code or cfg.data.trust_remote_code,
                custom_chat_template=model.custom_chat_template)


def run_tokenizer(cfg: Config, model_path: str):
    return load_tokenizer(tokenizer_path(cfg, model_path), **tokenizer_options(cfg))


def prompt_set(cfg: Config, tokenizer, *, files, key: str, template: str, log=print,
               model_path: str | None = None) -> list[Prompt]:
    """The prompts of `files` (the value of config `key`), rendered with
    `template` and checked against the data.* length settings; image rows
    with the image processor of `model_path` (default: the config's model)."""
    data = cfg.data
    return load_prompts(builtin.resolve_data_files(files, log=log), tokenizer, key=key,
                        template=template, prompt_key=data.prompt_key,
                        reward_fn_key=data.reward_fn_key, max_prompt_length=data.max_prompt_length,
                        filter_overlong=data.filter_overlong_prompts, truncation=data.truncation,
                        chat_kwargs=data.apply_chat_template_kwargs,
                        media_keys=(data.image_key, data.video_key),
                        images=run_image_encoder(cfg, tokenizer, model_path=model_path),
                        log=log)


def run_stop_ids(cfg: Config, tokenizer, generation_config) -> list[int]:
    """The ids that end a response: the model's EOS ids, plus the stop words
    of the run's templates (qwen_r1: <|im_end|>, MindSpeed-RL's stop word)."""
    stops = stop_token_ids((cfg.data.template, cfg.data.val_template), tokenizer)
    return eos_token_ids(tokenizer, generation_config) + stops


def native_engine(cfg: Config, model, tokenizer, *, autocast) -> NativeEngine:
    """The rollout engine; its sampling seed derives from trainer.seed and rollout.seed."""
    return NativeEngine(model, eos_token_ids=run_stop_ids(cfg, tokenizer, model.generation_config),
                        pad_token_id=tokenizer.pad_token_id,
                        seed=sampling_seed(cfg),
                        autocast=autocast)


def _kl_controller(cfg: Config) -> KLController | None:
    if not cfg.algorithm.use_kl_in_reward:
        return None
    ctrl = cfg.algorithm.kl_ctrl
    return KLController(value=ctrl.kl_coef, adaptive=ctrl.type == "adaptive",
                        target_kl=ctrl.target_kl, horizon=ctrl.horizon)


def validation_sampling(cfg: Config, *, max_tokens: int) -> SamplingParams:
    """Sampling for validation and `thinkrl eval`: actor_rollout_ref.rollout.val_kwargs."""
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    return SamplingParams(n=val.n, max_tokens=max_tokens, temperature=val.temperature,
                          top_p=val.top_p, top_k=val.top_k, do_sample=val.do_sample)


def val_batch_size(cfg: Config, n_prompts: int) -> int:
    """Prompts per validation generate call: data.val_batch_size, else as many
    as keep rollout.max_num_seqs sequences in flight."""
    if cfg.data.val_batch_size:
        return cfg.data.val_batch_size
    per_prompt = max(1, cfg.actor_rollout_ref.rollout.val_kwargs.n)
    return max(1, min(n_prompts, math.floor(cfg.actor_rollout_ref.rollout.max_num_seqs / per_prompt)))
