"""The critic: PPO's value model, its optimizer and its update (algorithm.adv_estimator=gae).

`compute_values` gives V_t for every response token at rollout time (no
grad). `update_critic` is the value regression: ppo_epochs passes over the
step's responses, each cut into mini-batches (one optimizer step each) and
those into micro-batches (gradient accumulation), minimising the clipped
value loss (`thinkrl.algos.gae.value_loss`). As in the actor, every loss is
normalised by a `LossScale` of the whole mini-batch, so the gradient does not
depend on the micro-batch size.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, ContextManager

import torch
from torch import Tensor

from thinkrl.algos.gae import value_loss
from thinkrl.algos.losses import LossScale
from thinkrl.checkpoint.sharded import CRITIC_FILES, is_sharded_checkpoint, load_actor_state, save_actor_shards
from thinkrl.config.critic_checks import CriticSizes
from thinkrl.config.schema import CriticConfig
from thinkrl.models.forward import idle_pass
from thinkrl.models.micro_batches import agreed_micro_batches
from thinkrl.models.value import response_values
from thinkrl.parallel.distributed import sum_over_ranks
from thinkrl.parallel.fsdp import full_tensor, is_sharded
from thinkrl.records import CriticBatch
from thinkrl.workers.actor import ResumableUpdate, make_adamw, make_lr_schedule
from thinkrl.workers.mini_batches import MiniBatch, plan_mini_batches


class CriticWorker(ResumableUpdate):
    def __init__(self, model: torch.nn.Module, cfg: CriticConfig, sizes: CriticSizes, *,
                 total_steps: int, response_length: int, seed: int,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None) -> None:
        self.model, self.cfg, self.sizes = model, cfg, sizes
        # The configured maximum (the constant divisor of seq-mean-token-sum-norm).
        self.response_length = response_length
        self.device = device or next(model.parameters()).device
        self.autocast = autocast
        self.optimizer = make_adamw(model, cfg.optim)
        # One schedule step per training step, as the actor's (verl steps both once per step).
        self.scheduler = make_lr_schedule(self.optimizer, cfg.optim, total_steps=total_steps)
        self.shuffle_generator = torch.Generator().manual_seed(seed)
        self.model.train()

    @torch.no_grad()
    def compute_values(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                       *, response_length: int) -> Tensor:
        """V_t of every response token [N, R] on the CPU, `forward_micro_batch_size` rows at a time.
        Padding tokens get whatever the head says there; callers mask them (verl zeroes them)."""
        was_training = self.model.training
        self.model.eval()
        step = self.sizes.forward_micro_batch_size_per_device
        chunks = [torch.zeros(0, response_length)]
        cuts = [slice(start, start + step) for start in range(0, input_ids.shape[0], step)]
        try:
            for rows in agreed_micro_batches(cuts, device=self.device):
                if rows is None:  # another rank has more micro-batches: join its collectives
                    with self.autocast():
                        idle_pass(self.model, device=self.device)
                    continue
                with self.autocast():
                    values = response_values(self.model, input_ids[rows].to(self.device),
                                             attention_mask[rows].to(self.device),
                                             position_ids[rows].to(self.device),
                                             response_length=response_length)
                chunks.append(values.float().cpu())
        finally:
            self.model.train(was_training)
        return torch.cat(chunks)

    def plan(self, batch: CriticBatch, *, generator: torch.Generator | None = None) -> list[MiniBatch]:
        """critic.ppo_epochs passes over `batch`, cut into mini-batches of
        critic.ppo_mini_batch_size prompts (shuffled when critic.shuffle)."""
        return plan_mini_batches(batch, mini_batch_size=self.sizes.responses_per_mini_batch,
                                 epochs=self.sizes.ppo_epochs, shuffle=self.sizes.shuffle,
                                 generator=generator or self.shuffle_generator,
                                 response_length=self.response_length)

    def update_critic(self, batch: CriticBatch) -> dict[str, float]:
        """The value regression on `batch` (N responses): `update_on(plan(batch))`."""
        return self.update_on(self.plan(batch))

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        """One optimizer step per mini-batch (this rank's share of it, with the whole
        mini-batch's normalisers), then one LR-schedule step. Metrics are the mean over
        the mini-batches (verl sums critic/vf_loss over them instead)."""
        totals: dict[str, float] = {}
        for mini in minis:
            for key, value in self._train_mini_batch(mini.batch, mini.scale).items():
                totals[key] = totals.get(key, 0.0) + value
        result = {key: value / len(minis) for key, value in totals.items()}
        result["critic/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this step used
        self.scheduler.step()
        return result

    def _train_mini_batch(self, mini: CriticBatch, scale: LossScale) -> dict[str, float]:
        self.optimizer.zero_grad(set_to_none=True)
        metrics: dict[str, float] = {}
        micro_size = self.sizes.micro_batch_size_per_device
        cuts = [slice(start, start + micro_size) for start in range(0, len(mini), micro_size)]
        for rows in agreed_micro_batches(cuts, device=self.device):
            dev = self.device
            if rows is None:  # another rank has more micro-batches: join its collectives
                with self.autocast():
                    idle_pass(self.model, device=dev, backward=True)
                continue
            micro = mini.select(rows)
            with self.autocast():
                vpreds = response_values(self.model, micro.input_ids.to(dev), micro.attention_mask.to(dev),
                                         micro.position_ids.to(dev), response_length=micro.response_length)
            loss, micro_metrics = value_loss(
                vpreds, micro.returns.to(dev), micro.values.to(dev), micro.response_mask.to(dev),
                cliprange_value=self.cfg.cliprange_value, loss_agg_mode=self.sizes.loss_agg_mode,
                scale=scale)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"the critic's value loss is {loss.item()}. The update is abandoned before it touches "
                    "the weights; lower critic.optim.lr or check the rewards for inf/NaN.")
            loss.backward()
            for key, value in micro_metrics.items():  # shares of the mini-batch: sum them
                metrics[key] = metrics.get(key, 0.0) + value
        metrics = sum_over_ranks(metrics, device=self.device)  # every rank's share
        # Over the whole model: with sharded parameters the norm is a DTensor.
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:  # as verl: skip the step, keep the weights
            self.optimizer.zero_grad(set_to_none=True)
        metrics["critic/grad_norm"] = float(grad_norm)
        return metrics

    def save(self, folder: Path) -> None:
        """Weights and AdamW's state in the layout that fits the model (as the actor's,
        `thinkrl.checkpoint.sharded.CRITIC_FILES`): shards under folder/critic_dcp (every
        rank calls this), or a Hugging Face folder (folder/critic, loadable as
        critic.model.path) and folder/critic_optimizer.pt."""
        if is_sharded(self.model):
            save_actor_shards(self.model, self.optimizer, folder, CRITIC_FILES)
            return
        self.model.save_pretrained(folder / CRITIC_FILES.hf_dir)
        torch.save(self.optimizer.state_dict(), folder / CRITIC_FILES.optimizer_file)

    def load(self, folder: Path) -> None:
        """Weights and optimizer state of a checkpoint in either layout (read before set)."""
        if not ((folder / CRITIC_FILES.hf_dir).is_dir() or is_sharded_checkpoint(folder, CRITIC_FILES)):
            raise ValueError(f"{folder}: the checkpoint holds no critic (saved by a run without "
                             "algorithm.adv_estimator=gae); resume a PPO run from its own checkpoints, or "
                             "start afresh with trainer.resume_mode=disable")
        load_actor_state(self.model, self.optimizer, folder, CRITIC_FILES)


def build_critic(spec, *, device: torch.device, autocast: Callable[[], ContextManager],
                 compute_dtype: torch.dtype, param_offload: bool) -> CriticWorker:
    """The critic of a rank (`spec` is its `thinkrl.workers.policy_rank.RankSpec`): the value
    model of critic.model.path (the actor's model path when unset), sharded over the ranks
    like the actor when there are several, and its optimizer."""
    from thinkrl import builtin
    from thinkrl.models.loading import check_model_fits
    from thinkrl.models.value import load_value_model
    from thinkrl.parallel import fsdp

    cfg, critic = spec.cfg, spec.cfg.critic
    path = spec.model_path if critic.model.path is None else builtin.resolve_model_path(critic.model.path)
    trust = critic.model.trust_remote_code
    model = load_value_model(
        path, dtype=torch.float32, device=device,
        trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code if trust is None else trust,
        override_config=critic.model.override_config,
        gradient_checkpointing=critic.model.enable_gradient_checkpointing, seed=cfg.trainer.seed)
    check_model_fits(model, spec.tokenizer_size, spec.sizes, model_path=path)
    if spec.world_size > 1:
        fsdp.parallelize(model, compute_dtype=compute_dtype, param_offload=param_offload)
    return CriticWorker(model, critic, spec.sizes.critic, total_steps=spec.total_steps,
                        response_length=spec.sizes.response_length, seed=critic.data_loader_seed,
                        autocast=autocast, device=device)
