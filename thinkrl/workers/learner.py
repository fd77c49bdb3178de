"""A trained role: its model, AdamW, LR schedule and update loop, shared by
the actor (policy loss) and the critic (value loss).

`Learner.update` is PPO's inner loop: `UpdateSpec.epochs` passes over the
step's responses, each cut into mini-batches (one optimizer step each) and
those into micro-batches (gradient accumulation: fixed row counts, or with
`max_tokens` as many rows as fit a token budget, verl's use_dynamic_bsz).
Every loss term is normalised by a `LossScale` measured over the whole
mini-batch (across ranks too: `thinkrl.workers.mini_batches`), so the
gradient depends neither on the micro-batch size nor on the device count.
The driver plans the mini-batches (`UpdateSpec.plan`, in
`thinkrl.workers.handles.ShardedUpdate`, which also keeps the shuffle
generator), whatever the backend; each rank runs `update_on` with its share.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager

import torch
from torch import Tensor

from thinkrl.progress import tell
from thinkrl.algos.losses import LossScale
from thinkrl.checkpoint.sharded import RoleFiles, load_role_state, save_role_shards
from thinkrl.config.sizes import DerivedSizes
from thinkrl.config.critic_checks import CriticSizes
from thinkrl.config.schema import ActorConfig, CriticConfig, OptimConfig
from thinkrl.models.forward import idle_pass
from thinkrl.models.micro_batches import agreed_micro_batches, micro_batch_rows
from thinkrl.parallel.distributed import sum_over_ranks
from thinkrl.parallel.fsdp import full_tensor, is_sharded
from thinkrl.records import CriticBatch, TrainBatch
from thinkrl.workers.mini_batches import MiniBatch, plan_mini_batches

Batch = TrainBatch | CriticBatch
LossFn = Callable[[Batch, LossScale], tuple[Tensor, dict[str, float]]]
"""(micro-batch, the mini-batch's normalisers) -> (its share of the
mini-batch loss, its share of each metric: summed over micro-batches and ranks)."""


@dataclass(frozen=True)
class UpdateSpec:
    """How a role's update cuts one step's responses (RESPONSES unless said)."""

    role: str
    """"actor" or "critic": the metric prefix (actor/grad_norm, critic/lr, ...)."""
    responses_per_mini_batch: int
    epochs: int
    shuffle: bool
    micro_batch_size: int
    """Rows per device per forward/backward."""
    max_tokens: int | None
    """Token budget per device per forward (use_dynamic_bsz); None: fixed row counts."""
    grad_clip: float
    response_length: int
    """The configured maximum, not this batch's longest response: Dr. GRPO's
    and seq-mean-token-sum-norm's divisor must stay constant from step to step."""

    def plan(self, batch: Batch, generator: torch.Generator | None) -> list[MiniBatch]:
        """The step's mini-batches: `epochs` passes, shuffled by `generator` when `shuffle`."""
        return plan_mini_batches(batch, mini_batch_size=self.responses_per_mini_batch,
                                 epochs=self.epochs, shuffle=self.shuffle, generator=generator,
                                 response_length=self.response_length)


def actor_update_spec(actor: ActorConfig, sizes: DerivedSizes) -> UpdateSpec:
    """actor_rollout_ref.actor.* and the derived sizes, resolved once."""
    return UpdateSpec("actor", responses_per_mini_batch=sizes.responses_per_mini_batch,
                      epochs=actor.ppo_epochs, shuffle=actor.shuffle,
                      micro_batch_size=sizes.micro_batch_size_per_device,
                      max_tokens=actor.ppo_max_token_len_per_gpu if actor.use_dynamic_bsz else None,
                      grad_clip=actor.grad_clip, response_length=sizes.response_length)


def critic_update_spec(critic: CriticConfig, sizes: CriticSizes, *, response_length: int) -> UpdateSpec:
    """critic.* and the critic's derived sizes (None keys already resolved to
    the actor's), in the same spec as the actor's."""
    return UpdateSpec("critic", responses_per_mini_batch=sizes.responses_per_mini_batch,
                      epochs=sizes.ppo_epochs, shuffle=sizes.shuffle,
                      micro_batch_size=sizes.micro_batch_size_per_device,
                      max_tokens=critic.ppo_max_token_len_per_gpu if critic.use_dynamic_bsz else None,
                      grad_clip=critic.grad_clip, response_length=response_length)


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


class Learner:
    """`model` trained by `loss` under `spec`: one optimizer step per
    mini-batch, one LR-schedule step per training step (verl steps both
    roles' schedules once per step)."""

    def __init__(self, model: torch.nn.Module, optim: OptimConfig, spec: UpdateSpec, loss: LossFn, *,
                 files: RoleFiles, total_steps: int, device: torch.device,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 save_optimizer: bool = True) -> None:
        self.model, self.optim, self.spec, self.loss, self.files = model, optim, spec, loss, files
        self.save_optimizer = save_optimizer  # checkpoint.save_contents names "optimizer"
        self.device, self.autocast = device, autocast
        self.optimizer = make_adamw(model, optim)
        self.scheduler = make_lr_schedule(self.optimizer, optim, total_steps=total_steps)
        self.before_idle: Callable[[], None] = lambda: None
        """Called before an idle pass (the actor: its routes were the last micro-batch's)."""

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        """One optimizer step per mini-batch (this rank's share of it), then
        the LR schedule's step. Metrics are averaged over the mini-batches."""
        totals: dict[str, float] = {}
        for index, mini in enumerate(minis):
            where = f"mini-batch {index + 1}/{len(minis)}, " if len(minis) > 1 else ""
            for key, value in self._step(mini.batch, mini.scale, where).items():
                totals[key] = totals.get(key, 0.0) + value
        result = {key: value / len(minis) for key, value in totals.items()}
        result[f"{self.spec.role}/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this step used
        self.scheduler.step()
        return result

    def _step(self, mini: Batch, scale: LossScale, where: str = "") -> dict[str, float]:
        role = self.spec.role
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        cuts = micro_batch_rows(mini.attention_mask.sum(-1), micro_batch_size=self.spec.micro_batch_size,
                                max_tokens=self.spec.max_tokens)
        agreed = agreed_micro_batches(cuts, device=self.device)  # idle passes where another rank has more
        for count, rows in enumerate(agreed, 1):
            tell(lambda: f"{where}micro-batch {count}/{len(agreed)}")
            if rows is None:  # another rank has more micro-batches: join its collectives
                self.before_idle()
                with self.autocast():
                    idle_pass(self.model, device=self.device, backward=True)
                continue
            loss, micro_metrics = self.loss(mini.select(rows), scale)
            loss.backward()
            for key, value in micro_metrics.items():  # shares of the mini-batch: sum them
                metrics[key] = metrics.get(key, 0.0) + value
        metrics = sum_over_ranks(metrics, device=self.device)  # every rank's share
        # Over the whole model: with sharded parameters the norm is a DTensor.
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                               self.spec.grad_clip))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
            metrics[f"{role}/skipped_updates"] = 0.0
        else:  # one bad batch must not poison the weights; the trainer stops on repeats
            self.optimizer.zero_grad(set_to_none=True)
            metrics[f"{role}/skipped_updates"] = 1.0
        metrics[f"{role}/grad_norm"] = float(grad_norm)
        return metrics

    def save(self, folder: Path) -> None:
        """Weights and AdamW's state (unless `save_optimizer` is off) in the
        layout that fits the model (`thinkrl.checkpoint.sharded`): shards under
        folder/<files.dcp_dir> (every rank calls this), or a Hugging Face
        folder and the optimizer file."""
        optimizer = self.optimizer if self.save_optimizer else None
        if is_sharded(self.model):
            save_role_shards(self.model, optimizer, folder, self.files)
            return
        self.model.save_pretrained(folder / self.files.hf_dir)
        if optimizer is not None:
            torch.save(optimizer.state_dict(), folder / self.files.optimizer_file)

    def load(self, folder: Path) -> None:
        """Weights and optimizer state of a checkpoint in either layout. The
        optimizer restores each group's lr as the schedule last set it;
        `load_state_dict` then restores the schedule itself."""
        load_role_state(self.model, self.optimizer, folder, self.files)

    def load_schedule(self, scheduler_state: dict) -> None:
        """The LR schedule's position, with its base rate from this run's
        optim.lr: a resume with a changed lr continues the schedule at the new
        rate (an exact continuation, with the same lr, changes nothing)."""
        restore_schedule(self.scheduler, scheduler_state, lr=self.optim.lr)
