"""The actor: the policy being trained, its log-prob pass and its update.

`update_on` is PPO's inner loop (`thinkrl.workers.learner.Learner`: mini-
and micro-batches, clip, skip on a non-finite gradient) with the clipped
policy loss plus entropy bonus and KL loss of `_micro_batch_loss`. Every loss
term is normalised by the whole mini-batch's `LossScale`, so the gradient
depends neither on the micro-batch size nor on the device count.

Shapes: N responses, P prompt tokens, R response tokens.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, ContextManager, Iterable

import torch
from torch import Tensor

from thinkrl.algos.distillation import DistillSettings, distillation_loss
from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.moe_aux import load_balancing_loss
from thinkrl.algos.losses import LossScale, agg_loss, masked_share
from thinkrl.algos.policy_losses import build_policy_loss
from thinkrl.checkpoint.adapter import load_adapter, refuse_adapter_checkpoint_for_full_run, save_adapter
from thinkrl.checkpoint.sharded import ACTOR_FILES
from thinkrl.config.schema import ActorConfig
from thinkrl.models.forward import batched_response_logprobs, response_logprobs
from thinkrl.models.lora import Lora, base_tensors, is_adapter_tensor, merged_tensors
from thinkrl.models.routing import RouteTape, set_replay
from thinkrl.parallel.distributed import rank
from thinkrl.parallel.fsdp import is_sharded, parameter_stats
from thinkrl.records import ModelInputs, TrainBatch
from thinkrl.rollout.weight_sync import full_state_tensors
from thinkrl.workers.learner import Learner, UpdateSpec
from thinkrl.workers.mini_batches import MiniBatch


class ActorWorker:
    """The policy: its log-prob pass, its weights for the engine, and its
    update (a `Learner` with the policy loss)."""

    def __init__(self, model: torch.nn.Module, cfg: ActorConfig, spec: UpdateSpec, *,
                 total_steps: int, log_prob_micro_batch_size: int, temperature: float,
                 autocast: Callable[[], ContextManager] = contextlib.nullcontext,
                 device: torch.device | None = None, remove_padding: bool = False,
                 fused_head: bool = False, log_prob_max_tokens: int | None = None,
                 lora: Lora | None = None, base_model: str = "",
                 distill: DistillSettings | None = None, route_tape: RouteTape | None = None,
                 router_aux_coef: float = 0.0) -> None:
        self.model, self.cfg = model, cfg
        self.route_tape = route_tape  # router replay: the passes given routes replay them
        self.recorded_routes: Tensor | None = None
        self.router_aux_coef = router_aux_coef  # > 0: the routers' load-balancing loss (`algos.moe_aux`)
        self.distill = distill  # distillation.enabled: the teacher's term (thinkrl.algos.distillation)
        # LoRA: only the adapter trains, is saved and resumed; engines get it merged.
        self.lora, self.base_model = lora, base_model
        self.remove_padding = remove_padding  # model.use_remove_padding: the shared-prompt pass
        self.fused_head = fused_head  # model.use_fused_kernels: the output head a chunk at a time
        # Token budget per log-prob forward (verl's dynamic batch sizes); None: fixed row counts.
        self.log_prob_max_tokens = log_prob_max_tokens
        self.log_prob_micro_batch_size = log_prob_micro_batch_size
        self.temperature = temperature
        # Where the forward runs: the parameters' device, unless FSDP2 keeps
        # the shards on the host (offload) and gathers them onto `device`.
        self.device = device or next(model.parameters()).device
        self.autocast = autocast
        self.kl_estimator = get_kl_estimator(cfg.kl_loss_type) if cfg.use_kl_loss else None
        self.policy_loss = build_policy_loss(cfg)  # policy_loss.loss_mode, settings bound
        self.learner = Learner(model, cfg.optim, spec, self._micro_batch_loss, files=ACTOR_FILES,
                               total_steps=total_steps, device=self.device,
                               autocast=autocast,
                               save_optimizer="optimizer" in cfg.checkpoint.save_contents)
        self.learner.before_idle = lambda: set_replay(self.route_tape, None)
        self.model.train()

    def compute_log_prob(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                         *, response_length: int, model_inputs: ModelInputs | None = None,
                         routed_experts: Tensor | None = None, record: bool = False) -> Tensor:
        """Log-probs of the response tokens under the current policy, no grad. [N, R].
        With `routed_experts` [N, P + R, L, k] the passes replay them (router
        replay R3); with `record` (R2) the routes they take are kept for
        `take_recorded_routes`."""
        tape = self.route_tape
        self.recorded_routes = None if not record else torch.zeros(
            *input_ids.shape, tape.layers, tape.top_k, dtype=torch.int16)
        return batched_response_logprobs(
            self.model, input_ids, attention_mask, position_ids,
            response_length=response_length, temperature=self.temperature,
            micro_batch_size=self.log_prob_micro_batch_size, autocast=self.autocast,
            device=self.device, model_inputs=model_inputs, remove_padding=self.remove_padding,
            fused_head=self.fused_head, max_tokens=self.log_prob_max_tokens,
            routes=routed_experts, tape=tape, record_into=self.recorded_routes)

    def take_recorded_routes(self) -> Tensor | None:
        """The routes of the last recording log-prob pass (R2), [N, P + R, L, k]; then forgotten."""
        routes, self.recorded_routes = self.recorded_routes, None
        return routes

    def weights(self) -> Iterable[tuple[str, Tensor]]:
        """The policy's (name, tensor) pairs for a rollout engine, one at a
        time: every state-dict entry (tied weights under each name), whole
        (gathered from the shards when sharded: a collective), and for an
        unsharded module the live tensors, so an engine sharing it copies nothing.
        With LoRA, the base's names with each adapter merged in (the engine
        holds a plain model)."""
        if self.lora is not None:
            return merged_tensors(full_state_tensors(self.model), self.lora.scalings())
        return full_state_tensors(self.model)

    def base_weights(self) -> Iterable[tuple[str, Tensor]]:
        """With LoRA: the frozen base's (name, tensor) pairs under a plain
        model's names, without the adapter (for an engine that serves it)."""
        return base_tensors(full_state_tensors(self.model))

    def adapter_weights(self) -> Iterable[tuple[str, Tensor]]:
        """With LoRA: the adapter's A and B tensors (module names), whole;
        only they are gathered from the shards."""
        return full_state_tensors(self.model, keep=is_adapter_tensor)

    def weight_stats(self) -> dict:
        """For the divergence guard and the save check: `parameter_stats` of
        the weights this process holds, and the vocabulary size."""
        return {**parameter_stats(self.model),
                "vocab_size": self.model.get_output_embeddings().weight.shape[0]}

    def update_on(self, minis: list[MiniBatch]) -> dict[str, float]:
        """This rank's share of each mini-batch the driver planned
        (`thinkrl.workers.handles.ShardedUpdate`), through `Learner.update_on`."""
        try:
            result = self.learner.update_on(minis)
        finally:  # an update that raised must leave no routes or collected probabilities behind
            set_replay(self.route_tape, None)
            if self.route_tape is not None:
                self.route_tape.take_aux()
        if self.kl_estimator is not None and self._task_loss_kept:
            result["actor/kl_coef"] = self.cfg.kl_loss_coef
        return result

    def save(self, folder: Path) -> None:
        """Weights and AdamW's state: shards under folder/actor_dcp (every rank
        calls this; rank 0 adds the model's config, so that `thinkrl export`
        can rebuild a Hugging Face folder), or a Hugging Face folder
        (folder/actor) and folder/optimizer.pt. With LoRA, the adapter alone
        (`thinkrl.checkpoint.adapter`)."""
        if self.lora is not None:
            save_adapter(self.model, self.learner.optimizer if self.learner.save_optimizer else None,
                         self.lora, folder, base_model=self.base_model)
            return
        self.learner.save(folder)
        if is_sharded(self.model) and rank() == 0:
            self.model.config.save_pretrained(folder / ACTOR_FILES.hf_dir)
            if self.model.generation_config is not None:
                self.model.generation_config.save_pretrained(folder / ACTOR_FILES.hf_dir)

    def load(self, folder: Path) -> None:
        if self.lora is not None:
            load_adapter(self.model, self.learner.optimizer, self.lora, folder)
            return
        refuse_adapter_checkpoint_for_full_run(folder)
        self.learner.load(folder)

    def _micro_batch_loss(self, micro: TrainBatch, scale: LossScale) -> tuple[Tensor, dict]:
        cfg, dev = self.cfg, self.device
        mask = micro.response_mask.to(dev)
        set_replay(self.route_tape, micro.routed_experts)  # until the next micro-batch: the backward may recompute
        aux = self.router_aux_coef > 0  # the routers' own choices, token by token as the mask has them
        if aux:
            self.route_tape.collect_aux = True
        with self.autocast():
            logprob, entropy = response_logprobs(
                self.model, micro.input_ids.to(dev), micro.attention_mask.to(dev),
                micro.position_ids.to(dev), response_length=micro.response_length,
                temperature=self.temperature, with_entropy=True,
                entropy_grad=cfg.entropy_coeff != 0 and self._task_loss_kept, model_inputs=micro.model_inputs,
                remove_padding=self.remove_padding, fused_head=self.fused_head)
        aux_loss = self._router_aux_loss(micro, mask, scale) if aux else None
        # Exactly on-policy (one pass, one mini-batch): pi_old is this very
        # forward, so the ratio is 1 and only its gradient matters.
        old = logprob.detach() if micro.old_logprobs is None else micro.old_logprobs.to(dev)
        weights = None if micro.rollout_is_weights is None else micro.rollout_is_weights.to(dev)
        if self._task_loss_kept:
            loss, metrics = self._task_loss(micro, logprob, old, entropy, mask, scale, weights)
        else:  # pure OPD: verl drops the task loss whole (its entropy bonus and KL loss too)
            loss, metrics = logprob.new_zeros(()), {}
        if self.distill is not None:
            distill, distill_metrics = distillation_loss(
                logprob, old, micro.teacher_logprobs.to(dev), mask, settings=self.distill,
                loss_agg_mode=cfg.loss_agg_mode, scale=scale, rollout_is_weights=weights)
            loss = loss + self.distill.weight * distill
            metrics.update(distill_metrics)
        metrics["actor/entropy"] = masked_share(entropy, mask, scale)
        if aux_loss is not None:
            loss = loss + self.router_aux_coef * aux_loss
            metrics["actor/router_aux_loss"] = float(aux_loss.detach())
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the actor loss is {loss.item()} ({_parts(metrics)}). The update is "
                "abandoned before it touches the weights; lower actor_rollout_ref.actor.optim.lr, "
                "check the rewards for inf/NaN, or use a float32/bfloat16 model dtype.")
        return loss, metrics

    @property
    def _task_loss_kept(self) -> bool:
        """False in pure on-policy distillation (verl drops the task loss whole)."""
        return self.distill is None or self.distill.use_task_rewards

    def _router_aux_loss(self, micro: TrainBatch, mask: Tensor, scale: LossScale) -> Tensor:
        """This micro-batch's load-balancing loss over its real tokens, weighed by
        its share of the mini-batch's response tokens (transformers computes it
        per forward; the shares add up to a mean over the mini-batch's micro-batches)."""
        probs, chosen = self.route_tape.take_aux()
        tokens = micro.attention_mask.to(self.device).reshape(-1)
        return load_balancing_loss(probs, chosen, tokens) * (mask.sum() / scale.num_tokens)

    def _task_loss(self, micro: TrainBatch, logprob: Tensor, old: Tensor, entropy: Tensor, mask: Tensor,
                   scale: LossScale, weights: Tensor | None) -> tuple[Tensor, dict]:
        """The policy loss on the task's advantages, minus the entropy bonus,
        plus the KL loss to the reference (verl's ppo_loss)."""
        cfg, dev = self.cfg, self.device
        loss, metrics = self.policy_loss(logprob, old, micro.advantages.to(dev), mask, scale=scale,
                                         rollout_is_weights=weights)
        if cfg.entropy_coeff != 0:
            loss = loss - cfg.entropy_coeff * agg_loss(entropy, mask, cfg.loss_agg_mode, scale)
        if self.kl_estimator is not None:
            kl = self.kl_estimator(logprob, micro.ref_logprobs.to(dev))  # [n, R]
            kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, scale)
            loss = loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return loss, metrics


def _parts(metrics: dict[str, float]) -> str:
    """The loss terms of a non-finite loss, for its error."""
    names = ("actor/pg_loss", "actor/kl_loss", "distillation/loss")
    return ", ".join(f"{name.split('/')[1]} {metrics[name]}" for name in names if name in metrics)
