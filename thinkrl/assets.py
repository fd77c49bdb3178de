"""The run's assets from its config, loaded one way for `thinkrl train`,
`thinkrl eval` and `thinkrl doctor`: the tokenizer, the prompt sets (with the
image encoder of a vision-language model), the stop ids, the native engine,
and the sampling settings of training and validation.
"""

from __future__ import annotations

import math

from thinkrl.builtin import is_builtin, resolve_data_files
from thinkrl.config import Config
from thinkrl.data.dataset import Prompt, load_prompts
from thinkrl.data.images import ImageEncoder
from thinkrl.data.templates import stop_token_ids
from thinkrl.models.loading import eos_token_ids, load_tokenizer
from thinkrl.models.vision import is_vision_model
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine

# Rank r samples from seed + r * RANK_SEED_STRIDE: ranks must not draw the
# same stream, and rank 0 draws exactly what the local backend draws.
RANK_SEED_STRIDE = 104_729


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
               model_path: str | None = None, chat_kwargs: dict | None = None) -> list[Prompt]:
    """The prompts of `files` (the value of config `key`), rendered with
    `template` (with `chat_kwargs`, default data.apply_chat_template_kwargs)
    and checked against the data.* length settings; image rows
    with the image processor of `model_path` (default: the config's model)."""
    data = cfg.data
    return load_prompts(resolve_data_files(files, log=log), tokenizer, key=key,
                        template=template, prompt_key=data.prompt_key,
                        reward_fn_key=data.reward_fn_key, max_prompt_length=data.max_prompt_length,
                        filter_overlong=data.filter_overlong_prompts, truncation=data.truncation,
                        chat_kwargs=data.apply_chat_template_kwargs if chat_kwargs is None else chat_kwargs,
                        media_keys=(data.image_key, data.video_key),
                        images=run_image_encoder(cfg, tokenizer, model_path=model_path),
                        log=log)


def run_stop_ids(cfg: Config, tokenizer, generation_config) -> list[int]:
    """The ids that end a response: the model's EOS ids, plus the stop words
    of the run's templates (qwen_r1: <|im_end|>, MindSpeed-RL's stop word)."""
    stops = stop_token_ids((cfg.data.template, cfg.data.val_template), tokenizer)
    return eos_token_ids(tokenizer, generation_config) + stops


def run_image_encoder(cfg, tokenizer, *, model_path: str | None = None) -> ImageEncoder | None:
    """The image encoder of the run's model; None for a text-only model."""
    path = model_path or cfg.actor_rollout_ref.model.path
    if is_builtin(path) or not is_vision_model(path):
        return None
    return ImageEncoder.from_model(path, tokenizer, min_pixels=cfg.data.min_pixels,
                                   max_pixels=cfg.data.max_pixels,
                                   trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code)


def sampling_seed(cfg: Config, *, rank: int = 0) -> int:
    """The native engine's seed: from trainer.seed and rollout.seed, and the rank."""
    base = cfg.trainer.seed * 1000 + cfg.actor_rollout_ref.rollout.seed
    return base + RANK_SEED_STRIDE * rank


def native_engine(cfg: Config, model, tokenizer, *, autocast) -> NativeEngine:
    """The rollout engine; its sampling seed derives from trainer.seed and rollout.seed."""
    return NativeEngine(model, eos_token_ids=run_stop_ids(cfg, tokenizer, model.generation_config),
                        pad_token_id=tokenizer.pad_token_id,
                        seed=sampling_seed(cfg),
                        autocast=autocast)


def generation_batch_size(cfg: Config) -> int:
    """Prompts the loader serves per generation batch: data.gen_batch_size under
    dynamic sampling (algorithm.filter_groups), else data.train_batch_size."""
    if cfg.algorithm.filter_groups.enable and cfg.data.gen_batch_size:
        return cfg.data.gen_batch_size
    return cfg.data.train_batch_size


def total_training_steps(cfg: Config, *, batches_per_epoch: int) -> int:
    """trainer.total_training_steps, else total_epochs full passes over the prompts."""
    return cfg.trainer.total_training_steps or cfg.trainer.total_epochs * batches_per_epoch


def training_sampling(cfg: Config, *, max_tokens: int) -> SamplingParams:
    """Sampling for the training rollouts: actor_rollout_ref.rollout.*."""
    rollout = cfg.actor_rollout_ref.rollout
    return SamplingParams(n=rollout.n, max_tokens=max_tokens, temperature=rollout.temperature,
                          top_p=rollout.top_p, top_k=rollout.top_k, min_p=rollout.min_p,
                          do_sample=rollout.do_sample, ignore_eos=rollout.ignore_eos)


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
