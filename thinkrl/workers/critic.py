"""The critic: PPO's value model, its value pass and its update (algorithm.adv_estimator=gae).

`compute_values` gives V_t for every response token at rollout time (no
grad). `update_on` is the value regression: the actor's update loop
(`thinkrl.workers.learner.Learner`: ppo_epochs, mini- and micro-batches,
token budgets with critic.use_dynamic_bsz, clip, skip on a non-finite
gradient) minimising the clipped value loss (`thinkrl.algos.gae.value_loss`),
normalised by the whole mini-batch's `LossScale`.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, ContextManager

import torch
from torch import Tensor

from thinkrl.builtin import resolve_model_path
from thinkrl.algos.gae import value_loss
from thinkrl.algos.losses import LossScale
from thinkrl.checkpoint.adapter import load_adapter, refuse_adapter_checkpoint_for_full_run, save_adapter
from thinkrl.checkpoint.sharded import CRITIC_FILES, is_sharded_checkpoint
from thinkrl.config.critic_checks import CriticSizes
from thinkrl.config.schema import CriticConfig
from thinkrl.errors import UserError
from thinkrl.models.forward import in_micro_batches
from thinkrl.models.loading import check_model_fits
from thinkrl.models.lora import Lora, LoraSettings, attach_lora, lora_of
from thinkrl.models.value import load_value_model, response_values, value_head_name, value_model_skeleton
from thinkrl.parallel import fsdp
from thinkrl.records import CriticBatch
from thinkrl.workers.learner import Learner, critic_update_spec
from thinkrl.workers.mini_batches import MiniBatch


class CriticWorker:
    """The value model: its value pass and its update (a `Learner` with the
    clipped value loss)."""

    def __init__(self, model: torch.nn.Module, cfg: CriticConfig, sizes: CriticSizes, *,
                 total_steps: int, response_length: int,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None, lora: Lora | None = None,
                 base_model: str = "") -> None:
        self.model, self.cfg, self.sizes = model, cfg, sizes
        # critic.model.lora_rank > 0: the decoder's adapters and the value head train and are saved
        self.lora, self.base_model = lora, base_model
        self.device = device or next(model.parameters()).device
        self.autocast = autocast
        # Token budget per value forward (critic.use_dynamic_bsz); None: fixed row counts.
        self.forward_max_tokens = cfg.forward_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        self.learner = Learner(model, cfg.optim,
                               critic_update_spec(cfg, sizes, response_length=response_length),
                               self._micro_batch_loss, files=CRITIC_FILES, total_steps=total_steps,
                               device=self.device, autocast=autocast,
                               save_optimizer="optimizer" in cfg.checkpoint.save_contents)
        self.model.train()

    def compute_values(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                       *, response_length: int) -> Tensor:
        """V_t of every response token [N, R] on the CPU, `forward_micro_batch_size` rows at a
        time (`in_micro_batches`: a collective with several ranks). Padding tokens get whatever
        the head says there; callers mask them (verl zeroes them)."""
        dev = self.device

        def values(rows: slice) -> Tensor:
            return response_values(self.model, input_ids[rows].to(dev), attention_mask[rows].to(dev),
                                   position_ids[rows].to(dev), response_length=response_length)

        return in_micro_batches(self.model, values, attention_mask,
                                micro_batch_size=self.sizes.forward_micro_batch_size_per_device,
                                max_tokens=self.forward_max_tokens, width=response_length, device=dev,
                                autocast=self.autocast)

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        """This rank's share of each planned mini-batch. Metrics are the mean over
        the mini-batches (verl sums critic/vf_loss over them instead)."""
        return self.learner.update_on(minis)

    def _micro_batch_loss(self, micro: CriticBatch, scale: LossScale) -> tuple[Tensor, dict]:
        dev = self.device
        with self.autocast():
            vpreds = response_values(self.model, micro.input_ids.to(dev), micro.attention_mask.to(dev),
                                     micro.position_ids.to(dev), response_length=micro.response_length)
        loss, metrics = value_loss(
            vpreds, micro.returns.to(dev), micro.values.to(dev), micro.response_mask.to(dev),
            cliprange_value=self.cfg.cliprange_value, loss_agg_mode=self.sizes.loss_agg_mode,
            scale=scale)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the critic's value loss is {loss.item()}. The update is abandoned before it touches "
                "the weights; lower critic.optim.lr or check the rewards for inf/NaN.")
        return loss, metrics

    def save(self, folder: Path) -> None:
        """Weights and AdamW's state in the layout that fits the model (as the actor's,
        `thinkrl.checkpoint.sharded.CRITIC_FILES`): shards under folder/critic_dcp (every
        rank calls this), or a Hugging Face folder (folder/critic, loadable as
        critic.model.path) and folder/critic_optimizer.pt. With LoRA, the adapter
        and the value head (`thinkrl.checkpoint.adapter`)."""
        if self.lora is not None:
            save_adapter(self.model, self.learner.optimizer if self.learner.save_optimizer else None,
                         self.lora, folder, base_model=self.base_model,
                         files=CRITIC_FILES)
            return
        self.learner.save(folder)

    def load(self, folder: Path) -> None:
        """Weights and optimizer state of a checkpoint in either layout (read before set)."""
        if not ((folder / CRITIC_FILES.hf_dir).is_dir() or is_sharded_checkpoint(folder, CRITIC_FILES)):
            raise UserError(f"{folder}: the checkpoint holds no critic (saved by a run without "
                             "algorithm.adv_estimator=gae); resume a PPO run from its own checkpoints, or "
                             "start afresh with trainer.resume_mode=disable")
        if self.lora is not None:
            load_adapter(self.model, self.learner.optimizer, self.lora, folder, CRITIC_FILES)
            return
        refuse_adapter_checkpoint_for_full_run(folder, CRITIC_FILES)
        self.learner.load(folder)


def build_critic(spec, *, device: torch.device, autocast: Callable[[], ContextManager],
                 compute_dtype: torch.dtype, param_offload: bool) -> CriticWorker:
    """The critic of a rank (`spec` is its `thinkrl.workers.policy_rank.RankSpec`): the value
    model of critic.model.path (the actor's model path when unset), sharded over the ranks
    like the actor when there are several, and its optimizer."""
    cfg, critic = spec.cfg, spec.cfg.critic
    path = spec.model_path if critic.model.path is None else resolve_model_path(critic.model.path)
    trust = critic.model.trust_remote_code
    options = dict(dtype=torch.float32, override_config=critic.model.override_config,
                   trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code if trust is None else trust,
                   gradient_checkpointing=critic.model.enable_gradient_checkpointing)

    # critic.model.lora_rank: adapters on the decoder; the fresh value head trains whole.
    settings = LoraSettings.of(critic.model, key="critic.model")

    def with_lora(model: torch.nn.Module) -> torch.nn.Module:
        if settings is not None:
            head = value_head_name(model)
            attach_lora(model, settings.excluding(head))
            getattr(model, head).requires_grad_(True)
        return model

    def load(on: torch.device) -> torch.nn.Module:
        return with_lora(load_value_model(path, device=on, seed=cfg.trainer.seed, **options))

    # Over several ranks rank 0 reads the weights into host memory (and draws the fresh
    # head); every rank builds the skeleton and receives its shards from rank 0's copy.
    model = fsdp.build_model(
        load, lambda: with_lora(value_model_skeleton(path, **options)),
        prepare=lambda m: check_model_fits(m, spec.tokenizer_size, spec.sizes, model_path=path),
        shard=lambda m: fsdp.parallelize(m, compute_dtype=compute_dtype, param_offload=param_offload),
        device=device, param_offload=param_offload)
    return CriticWorker(model, critic, spec.sizes.critic, total_steps=spec.total_steps,
                        response_length=spec.sizes.response_length,
                        autocast=autocast, device=device, lora=lora_of(model), base_model=path)
