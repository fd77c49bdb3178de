"""Assemble a run from its config: device, tokenizer, models, data, roles.

Everything a user can get wrong is checked here, before the first step, so
the driver (`thinkrl.trainer`) only ever sees a run that can start.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import yaml

from thinkrl import builtin
from thinkrl.algos.advantages import build_advantage_estimator
from thinkrl.algos.kl_control import KLController
from thinkrl.checkpoint.resume import checkpoint_to_resume
from thinkrl.checkpoint.state import Progress, load_checkpoint
from thinkrl.config import Config, DerivedSizes, inactive_settings, validate
from thinkrl.config.loading import config_to_dict
from thinkrl.data.dataset import Prompt, PromptLoader, load_prompts
from thinkrl.dynamic_sampling import generation_batch_size
from thinkrl.errors import SetupError
from thinkrl.metrics import MetricsLog
from thinkrl.models.loading import eos_token_ids, load_causal_lm, load_tokenizer
from thinkrl.parallel.device import autocast, compute_dtype, resolve_device, synchronizer
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rewards.watch import ZeroRewardWatch
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine
from thinkrl.workers.actor import ActorWorker
from thinkrl.workers.reference import ReferenceWorker


@dataclass
class Run:
    cfg: Config
    sizes: DerivedSizes
    run_dir: Path
    model_path: str
    """actor_rollout_ref.model.path with `builtin:` names resolved to folders."""
    tokenizer: object
    actor: ActorWorker
    reference: ReferenceWorker | None
    engine: NativeEngine
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

    def close(self) -> None:
        """Stop the scoring workers and close the logger sinks."""
        self.reward.close()
        self.metrics_log.close()

    @property
    def on_policy(self) -> bool:
        """One optimizer step per training step on fresh samples: pi_old is
        the current policy, so the old log-probs need no extra forward pass."""
        return self.sizes.optimizer_steps_per_step == 1


def check_backend(cfg: Config, sizes: DerivedSizes) -> None:
    if cfg.trainer.backend == "ray":
        raise SetupError("trainer.backend=ray is not implemented in this release",
                         "use trainer.backend=local (one process, one device)")
    if sizes.world_size != 1:
        raise SetupError(
            f"trainer.n_gpus_per_node={cfg.trainer.n_gpus_per_node} x trainer.nnodes="
            f"{cfg.trainer.nnodes} asks for {sizes.world_size} devices, but the local backend "
            "drives one device",
            "set trainer.n_gpus_per_node=1 trainer.nnodes=1 (multi-device training through "
            "Ray and FSDP2 comes in a later release)")
    if cfg.actor_rollout_ref.rollout.name != "native":
        raise SetupError(f"actor_rollout_ref.rollout.name={cfg.actor_rollout_ref.rollout.name} "
                         "is not available in this release", "use rollout.name=native")


def check_model_fits(model, tokenizer, sizes: DerivedSizes, *, model_path: str) -> None:
    """The tokenizer's ids and the run's sequence length must fit the model:
    otherwise the first forward pass fails with an index error deep inside."""
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        raise SetupError(
            f"the tokenizer has {len(tokenizer)} tokens but the model {model_path} embeds only "
            f"{vocab}: they do not belong together",
            "point actor_rollout_ref.model.tokenizer_path (or data.tokenizer) at the model's "
            "own tokenizer")
    limit = getattr(model.config, "max_position_embeddings", None)
    needed = sizes.prompt_length + sizes.response_length
    if limit is not None and needed > limit:
        raise SetupError(
            f"data.max_prompt_length {sizes.prompt_length} + data.max_response_length "
            f"{sizes.response_length} = {needed} tokens exceed the model's "
            f"max_position_embeddings {limit} ({model_path})", "lower one of them")


def build_run(cfg: Config, *, log=print) -> Run:
    sizes = validate(cfg)
    check_backend(cfg, sizes)
    for note in inactive_settings(cfg):
        log(f"note: {note}")
    arr = cfg.actor_rollout_ref
    device = resolve_device(cfg.trainer.device)
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
    reward = RewardScorer.from_config(cfg)  # a bad custom reward file stops the run here
    # An unknown data_source stops the run here, not at step 1.
    reward.check_sources(p.sample.data_source for p in train_prompts + val_prompts)

    train_loader = PromptLoader(train_prompts, batch_size=generation_batch_size(cfg),
                                shuffle=data.shuffle, seed=data.seed,
                                pad_token_id=tokenizer.pad_token_id)
    total_steps = total_training_steps(cfg, batches_per_epoch=train_loader.batches_per_epoch)
    arr.actor.optim.total_training_steps = total_steps

    mixed_precision = autocast(device, compute_dtype(device, arr.model.dtype))
    model = load_causal_lm(model_path, dtype=torch.float32, device=device,
                           trust_remote_code=arr.model.trust_remote_code,
                           override_config=arr.model.override_config,
                           gradient_checkpointing=arr.model.enable_gradient_checkpointing)
    check_model_fits(model, tokenizer, sizes, model_path=model_path)
    rollout = arr.rollout
    actor = ActorWorker(model, arr.actor, total_steps=total_steps,
                        micro_batch_size=sizes.micro_batch_size_per_device,
                        log_prob_micro_batch_size=sizes.log_prob_micro_batch_size_per_device,
                        temperature=rollout.temperature,
                        max_response_length=sizes.response_length, seed=cfg.trainer.seed,
                        autocast=mixed_precision)
    reference = None
    if arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        reference = ReferenceWorker.frozen_copy_of(
            model, micro_batch_size=sizes.ref_log_prob_micro_batch_size_per_device,
            temperature=rollout.temperature, autocast=mixed_precision)
    engine = native_engine(cfg, model, tokenizer, autocast=mixed_precision)
    sampling = SamplingParams(n=rollout.n, max_tokens=sizes.response_length,
                              temperature=rollout.temperature, top_p=rollout.top_p,
                              top_k=rollout.top_k, do_sample=rollout.do_sample,
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
              kl_controller=_kl_controller(cfg), sync=synchronizer(device))
    try:
        if resume_from is not None:  # after the reference copied the *initial* weights
            run.progress = load_checkpoint(run, resume_from, log=log)
        # Only now, with the checkpoint loaded, may metrics.jsonl change; it is
        # continued only when the checkpoint belongs to this run directory.
        own = resume_from is not None and resume_from.parent == run_dir
        metrics_log.begin(resume_step=run.progress.step if own else None)
        reward.start()  # worker start-up is not charged to the first step's timings
    except BaseException:
        run.close()
        raise
    return run


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


def prompt_set(cfg: Config, tokenizer, *, files, key: str, template: str, log=print) -> list[Prompt]:
    """The prompts of `files` (the value of config `key`), rendered with
    `template` and checked against the data.* length settings."""
    data = cfg.data
    return load_prompts(builtin.resolve_data_files(files, log=log), tokenizer, key=key,
                        template=template, prompt_key=data.prompt_key,
                        reward_fn_key=data.reward_fn_key, max_prompt_length=data.max_prompt_length,
                        filter_overlong=data.filter_overlong_prompts, truncation=data.truncation,
                        chat_kwargs=data.apply_chat_template_kwargs,
                        media_keys=(data.image_key, data.video_key), log=log)


def native_engine(cfg: Config, model, tokenizer, *, autocast) -> NativeEngine:
    """The rollout engine; its sampling seed derives from trainer.seed and rollout.seed."""
    return NativeEngine(model, eos_token_ids=eos_token_ids(tokenizer, model),
                        pad_token_id=tokenizer.pad_token_id,
                        seed=cfg.trainer.seed * 1000 + cfg.actor_rollout_ref.rollout.seed,
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
