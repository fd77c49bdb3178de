"""The actor: the policy being trained, its optimizer and its update.

`update_policy` is PPO's inner loop: ppo_epochs passes over the step's
responses, each split into mini-batches (one optimizer step each) and those
into micro-batches (gradient accumulation). Every loss term is normalised by
a `LossScale` measured over the whole mini-batch (across ranks too: see
`thinkrl.workers.mini_batches`), so the gradient depends neither on the
micro-batch size nor on the device count. With several ranks the driver
plans the mini-batches and each rank runs `update_on` with its share.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Callable, ContextManager, Iterable

import torch
from torch import Tensor

from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.losses import LossScale, agg_loss, masked_share
from thinkrl.algos.policy_losses import build_policy_loss
from thinkrl.checkpoint.sharded import (ACTOR_DIR, OPTIMIZER_FILE, load_actor_state,
                                        save_actor_shards)
from thinkrl.config.schema import ActorConfig, OptimConfig
from thinkrl.models.forward import batched_response_logprobs, idle_pass, response_logprobs
from thinkrl.models.micro_batches import agreed_micro_batches, micro_batch_rows
from thinkrl.parallel.distributed import sum_over_ranks
from thinkrl.parallel.fsdp import full_tensor, is_sharded, parameter_stats
from thinkrl.records import ModelInputs, TrainBatch
from thinkrl.rollout.weight_sync import full_state_tensors
from thinkrl.workers.mini_batches import MiniBatch, plan_mini_batches


def make_adamw(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters, with the role's optim.* settings."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                             betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)


def make_lr_schedule(optimizer: torch.optim.Optimizer, cfg: OptimConfig, *, total_steps: int):
    """Linear warmup, then constant or cosine decay to `min_lr_ratio`."""
    warmup = cfg.lr_warmup_steps
    if warmup < 0:
        warmup = int(cfg.lr_warmup_steps_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.warmup_style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * cfg.num_cycles * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def restore_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict, *, lr: float) -> None:
    """Put a saved schedule position back, with `lr` (this run's optim.lr) as
    its base rate, and set every group's rate to where the schedule stands."""
    scheduler.load_state_dict(state)
    groups = scheduler.optimizer.param_groups
    scheduler.base_lrs = [lr] * len(groups)
    step = scheduler.last_epoch
    for group, factor in zip(groups, scheduler.lr_lambdas):
        group["lr"], group["initial_lr"] = lr * factor(step), lr


class ResumableUpdate:
    """What a trained role (the actor, the critic) keeps apart from weights
    and optimizer (those go through its `save`): the LR schedule's position
    and the generator that shuffles its mini-batches. The role provides
    `scheduler`, `shuffle_generator` and `cfg.optim`."""

    scheduler: torch.optim.lr_scheduler.LambdaLR
    shuffle_generator: torch.Generator

    def state_dict(self) -> dict:
        """Tensors and plain values only."""
        return {"scheduler": self.scheduler.state_dict(),
                "shuffle_generator": self.shuffle_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.load_schedule(state["scheduler"])
        self.shuffle_generator.set_state(state["shuffle_generator"])

    def load_schedule(self, scheduler_state: dict) -> None:
        """The LR schedule's position, with its base rate from this run's
        optim.lr: a resume with a changed lr continues the schedule at the new
        rate (an exact continuation, with the same lr, changes nothing)."""
        restore_schedule(self.scheduler, scheduler_state, lr=self.cfg.optim.lr)


class ActorWorker(ResumableUpdate):
    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, *, total_steps: int,
                 micro_batch_size: int, log_prob_micro_batch_size: int, temperature: float,
                 max_response_length: int, seed: int,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None, remove_padding: bool = False,
                 fused_head: bool = False, log_prob_max_tokens: int | None = None) -> None:
        self.model, self.cfg = model, cfg
        self.remove_padding = remove_padding  # model.use_remove_padding: the shared-prompt pass
        self.fused_head = fused_head  # model.use_fused_kernels: the output head a chunk at a time
        # Token budgets per forward (verl's dynamic batch sizes); None: fixed row counts.
        self.log_prob_max_tokens = log_prob_max_tokens
        self.max_tokens = cfg.ppo_max_token_len_per_gpu if cfg.use_dynamic_bsz else None
        self.micro_batch_size = micro_batch_size
        self.log_prob_micro_batch_size = log_prob_micro_batch_size
        self.temperature = temperature
        # The configured maximum, not this batch's longest response: Dr. GRPO's
        # divisor must stay constant from step to step.
        self.max_response_length = max_response_length
        # Where the forward runs: the parameters' device, unless FSDP2 keeps
        # the shards on the host (offload) and gathers them onto `device`.
        self.device = device or next(model.parameters()).device
        self.autocast = autocast
        self.optimizer = make_adamw(model, cfg.optim)
        self.scheduler = make_lr_schedule(self.optimizer, cfg.optim, total_steps=total_steps)
        self.kl_estimator = get_kl_estimator(cfg.kl_loss_type) if cfg.use_kl_loss else None
        self.policy_loss = build_policy_loss(cfg)  # policy_loss.loss_mode, settings bound
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.model.train()

    def compute_log_prob(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                         *, response_length: int, model_inputs: ModelInputs | None = None
                         ) -> Tensor:
        """Log-probs of the response tokens under the current policy, no grad. [N, R]."""
        return batched_response_logprobs(
            self.model, input_ids, attention_mask, position_ids,
            response_length=response_length, temperature=self.temperature,
            micro_batch_size=self.log_prob_micro_batch_size, autocast=self.autocast,
            device=self.device, model_inputs=model_inputs, remove_padding=self.remove_padding,
            fused_head=self.fused_head, max_tokens=self.log_prob_max_tokens)

    def weights(self) -> Iterable[tuple[str, Tensor]]:
        """The policy's (name, tensor) pairs for a rollout engine, one at a
        time: every state-dict entry (tied weights under each name), whole
        (gathered from the shards when sharded: a collective), and for an
        unsharded module the live tensors, so an engine sharing it copies nothing."""
        return full_state_tensors(self.model)

    def weight_stats(self) -> dict:
        """For the divergence guard and the save check: `parameter_stats` of
        the weights this process holds, and the vocabulary size."""
        return {**parameter_stats(self.model),
                "vocab_size": self.model.get_output_embeddings().weight.shape[0]}

    def plan(self, batch: TrainBatch, *, mini_batch_size: int) -> list[MiniBatch]:
        """The step's mini-batches (ppo_epochs passes, shuffled when actor.shuffle)."""
        return plan_mini_batches(batch, mini_batch_size=mini_batch_size,
                                 epochs=self.cfg.ppo_epochs, shuffle=self.cfg.shuffle,
                                 generator=self.shuffle_generator,
                                 response_length=self.max_response_length)

    def update_policy(self, batch: TrainBatch, *, mini_batch_size: int) -> dict[str, float]:
        """PPO epochs over `batch` (N responses); `mini_batch_size` counts responses."""
        return self.update_on(self.plan(batch, mini_batch_size=mini_batch_size))

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        """One optimizer step per mini-batch (this rank's share of it), then
        the LR schedule's step. Metrics are averaged over the mini-batches."""
        totals: dict[str, float] = {}
        for mini in minis:
            for key, value in self._train_mini_batch(mini.batch, mini.scale).items():
                totals[key] = totals.get(key, 0.0) + value
        result = {key: value / len(minis) for key, value in totals.items()}
        result["actor/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this step used
        self.scheduler.step()
        if self.kl_estimator is not None:
            result["actor/kl_coef"] = self.cfg.kl_loss_coef
        return result

    def save(self, folder: Path) -> None:
        """Weights and AdamW's state in the layout of thinkrl.checkpoint.sharded
        that fits this model: shards under folder/actor_dcp (every rank calls
        this), or a Hugging Face folder (folder/actor) and folder/optimizer.pt."""
        if is_sharded(self.model):
            save_actor_shards(self.model, self.optimizer, folder)
            return
        self.model.save_pretrained(folder / ACTOR_DIR)
        torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)

    def load(self, folder: Path) -> None:
        """Weights and optimizer state of a checkpoint in either layout. The
        optimizer restores each group's lr as the schedule last set it;
        `load_state_dict` then restores the schedule itself."""
        load_actor_state(self.model, self.optimizer, folder)

    def _train_mini_batch(self, mini: TrainBatch, scale: LossScale) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        cuts = micro_batch_rows(mini.attention_mask.sum(-1), micro_batch_size=self.micro_batch_size,
                                max_tokens=self.max_tokens)
        for rows in agreed_micro_batches(cuts, device=self.device):
            if rows is None:  # another rank has more micro-batches: join its collectives
                with self.autocast():
                    idle_pass(self.model, device=self.device, backward=True)
                continue
            micro = mini.select(rows)
            loss, micro_metrics = self._micro_batch_loss(micro, scale)
            loss.backward()
            for key, value in micro_metrics.items():  # shares of the mini-batch: sum them
                metrics[key] = metrics.get(key, 0.0) + value
        metrics = sum_over_ranks(metrics, device=self.device)  # every rank's share
        # Over the whole model: with sharded parameters the norm is a DTensor.
        grad_norm = full_tensor(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            metrics["actor/skipped_updates"] = 0.0
        else:  # one bad batch must not poison the weights; the trainer stops on repeats
            self.optimizer.zero_grad(set_to_none=True)
            metrics["actor/skipped_updates"] = 1.0
        metrics["actor/grad_norm"] = float(grad_norm)
        return metrics

    def _micro_batch_loss(self, micro: TrainBatch, scale: LossScale) -> tuple[Tensor, dict]:
        cfg, dev = self.cfg, self.device
        mask = micro.response_mask.to(dev)
        with self.autocast():
            logprob, entropy = response_logprobs(
                self.model, micro.input_ids.to(dev), micro.attention_mask.to(dev),
                micro.position_ids.to(dev), response_length=micro.response_length,
                temperature=self.temperature, with_entropy=True,
                entropy_grad=cfg.entropy_coeff != 0, model_inputs=micro.model_inputs,
                remove_padding=self.remove_padding, fused_head=self.fused_head)
        # Exactly on-policy (one pass, one mini-batch): pi_old is this very
        # forward, so the ratio is 1 and only its gradient matters.
        old = logprob.detach() if micro.old_logprobs is None else micro.old_logprobs.to(dev)
        pg_loss, metrics = self.policy_loss(logprob, old, micro.advantages.to(dev), mask, scale=scale)
        loss = pg_loss
        metrics["actor/entropy"] = masked_share(entropy, mask, scale)
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * agg_loss(entropy, mask, cfg.loss_agg_mode, scale)
        if self.kl_estimator is not None:
            kl = self.kl_estimator(logprob, micro.ref_logprobs.to(dev))  # [n, R]
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, scale)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the actor loss is {loss.item()} (pg_loss {pg_loss.item()}). The update is "
                "abandoned before it touches the weights; lower actor_rollout_ref.actor.optim.lr, "
                "check the rewards for inf/NaN, or use a float32/bfloat16 model dtype.")
        return loss, metrics

