"""The actor: the policy being trained, its optimizer and its update.

`update_policy` is PPO's inner loop: ppo_epochs passes over the step's
responses, each split into mini-batches (one optimizer step each) and those
into micro-batches (gradient accumulation). Every loss term is normalised by
a `LossScale` measured over the whole mini-batch, so the gradient does not
depend on the micro-batch size.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, ContextManager

import torch
from torch import Tensor

from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.losses import LossScale, agg_loss, masked_share
from thinkrl.algos.policy_losses import build_policy_loss
from thinkrl.config.schema import ActorConfig, OptimConfig
from thinkrl.models.forward import batched_response_logprobs, response_logprobs
from thinkrl.records import TrainBatch


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


class ActorWorker:
    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, *, total_steps: int,
                 micro_batch_size: int, log_prob_micro_batch_size: int, temperature: float,
                 max_response_length: int, seed: int,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext) -> None:
        self.model, self.cfg = model, cfg
        self.micro_batch_size = micro_batch_size
        self.log_prob_micro_batch_size = log_prob_micro_batch_size
        self.temperature = temperature
        # The configured maximum, not this batch's longest response: Dr. GRPO's
        # divisor must stay constant from step to step.
        self.max_response_length = max_response_length
        self.device = next(model.parameters()).device
        self.autocast = autocast
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=cfg.optim.lr,
            betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay)
        self.scheduler = make_lr_schedule(self.optimizer, cfg.optim, total_steps=total_steps)
        self.kl_estimator = get_kl_estimator(cfg.kl_loss_type) if cfg.use_kl_loss else None
        self.policy_loss = build_policy_loss(cfg)  # policy_loss.loss_mode, settings bound
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.model.train()

    def compute_log_prob(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                         *, response_length: int) -> Tensor:
        """Log-probs of the response tokens under the current policy, no grad. [N, R]."""
        return batched_response_logprobs(
            self.model, input_ids, attention_mask, position_ids,
            response_length=response_length, temperature=self.temperature,
            micro_batch_size=self.log_prob_micro_batch_size, autocast=self.autocast)

    def update_policy(self, batch: TrainBatch, *, mini_batch_size: int) -> dict[str, float]:
        """PPO epochs over `batch` (N responses); `mini_batch_size` counts responses."""
        totals: dict[str, float] = {}
        updates = 0
        for _ in range(self.cfg.ppo_epochs):
            order = (torch.randperm(len(batch), generator=self.shuffle_generator)
                     if self.cfg.shuffle else torch.arange(len(batch)))
            for start in range(0, len(batch), mini_batch_size):
                metrics = self._train_mini_batch(batch.select(order[start:start + mini_batch_size]))
                for key, value in metrics.items():
                    totals[key] = totals.get(key, 0.0) + value
                updates += 1
        result = {key: value / updates for key, value in totals.items()}
        result["actor/lr"] = self.scheduler.get_last_lr()[0]  # the rate this step used
        self.scheduler.step()
        if self.kl_estimator is not None:
            result["actor/kl_coef"] = self.cfg.kl_loss_coef
        return result

    def state_dict(self) -> dict:
        """The actor's state apart from its weights (saved as safetensors):
        AdamW moments and step counts, the LR schedule's position and the
        generator that shuffles mini-batches. Tensors and plain values only."""
        return {"optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "shuffle_generator": self.shuffle_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        # The optimizer first: it restores each group's lr as the schedule last set it.
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.shuffle_generator.set_state(state["shuffle_generator"])

    def _train_mini_batch(self, mini: TrainBatch) -> dict[str, float]:
        scale = LossScale.of(mini.response_mask, response_length=self.max_response_length)
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        for start in range(0, len(mini), self.micro_batch_size):
            micro = mini.select(slice(start, start + self.micro_batch_size))
            loss, micro_metrics = self._micro_batch_loss(micro, scale)
            loss.backward()
            for key, value in micro_metrics.items():  # shares of the mini-batch: sum them
                metrics[key] = metrics.get(key, 0.0) + value
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
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
                entropy_grad=cfg.entropy_coeff != 0)
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

