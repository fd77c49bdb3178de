"""The GRPO driver: one named call per stage, in the order of the algorithm.

Variant: GRPO with outcome rewards (DeepSeekMath / R1-Zero). For each of B
prompts, sample G responses; score each with a rule; advantage = score minus
the group mean, divided by the group std (`norm_adv_by_std_in_grpo`); update
the policy with the PPO clipped objective plus a KL loss to the frozen
reference (`use_kl_loss`, k3 by default) instead of a KL penalty in the
reward. All normalisers span the whole mini-batch (see `thinkrl.algos.losses`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thinkrl.algos.kl import get_kl_estimator
from thinkrl.build import Run, build_run
from thinkrl.config import Config
from thinkrl.evaluation import validate
from thinkrl.metrics import StageTimer, rollout_metrics, throughput_metrics
from thinkrl.records import Rollouts, TrainBatch
from thinkrl.rewards.scoring import score_rollouts, token_level_rewards

MAX_SKIPPED_UPDATES = 3


@dataclass
class TrainResult:
    run_dir: str
    first_val: dict[str, float]
    last_val: dict[str, float]
    steps: int


def train(cfg: Config, *, log=print) -> TrainResult:
    run = build_run(cfg, log=log)
    log(f"run directory: {run.run_dir}")
    log(run.sizes.table())
    log(f"training for {run.total_steps} steps "
        f"({run.train_loader.batches_per_epoch} steps per epoch)")
    first_val: dict[str, float] = {}
    if cfg.trainer.val_before_train or cfg.trainer.val_only:
        first_val = validate(run)
        run.metrics_log.log(first_val, step=0)
    if cfg.trainer.val_only:
        return TrainResult(str(run.run_dir), first_val, first_val, 0)

    last_val, skipped_in_a_row = first_val, 0
    progress = ProgressBar(run)
    for step in range(1, run.total_steps + 1):
        metrics = grpo_step(run)
        skipped_in_a_row = skipped_in_a_row + 1 if metrics["actor/skipped_updates"] else 0
        if skipped_in_a_row >= MAX_SKIPPED_UPDATES:
            raise FloatingPointError(
                f"step {step}: the gradient norm was not finite for {skipped_in_a_row} steps in "
                "a row (those updates were skipped, the weights are the last good ones). "
                "Lower actor_rollout_ref.actor.optim.lr or check the rewards.")
        test_freq = cfg.trainer.test_freq
        if step == run.total_steps or (test_freq > 0 and step % test_freq == 0):
            last_val = validate(run)
            metrics.update(last_val)
        run.metrics_log.log(metrics, step=step)
        progress.update(metrics, step)
    progress.close()
    return TrainResult(str(run.run_dir), first_val, last_val, run.total_steps)


def grpo_step(run: Run) -> dict[str, float]:
    """Generate, score, estimate advantages, update the actor, sync weights."""
    timer = StageTimer(run.sync)
    with timer("step"):
        prompts = run.train_loader.next_batch()
        with timer("gen"):
            rollouts = run.engine.generate(prompts, run.sampling)
        with timer("reward"):
            scored = score_rollouts(rollouts, run.tokenizer, scorer_for=run.scorer_for)
        sequences = rollouts.sequences()  # prompt + response, built once per step
        with timer("old_log_prob"):
            old_logprobs = old_policy_logprobs(run, rollouts, sequences)
        with timer("ref"):
            ref_logprobs = reference_logprobs(run, rollouts, sequences)
        with timer("adv"):
            rewards, kl_metrics = shaped_rewards(run, rollouts, scores=scored.scores,
                                                 old_logprobs=old_logprobs,
                                                 ref_logprobs=ref_logprobs)
            advantages = compute_advantages(run, rollouts, rewards)
        batch = train_batch(run, rollouts, sequences, advantages=advantages,
                            old_logprobs=old_logprobs, ref_logprobs=ref_logprobs)
        with timer("update_actor"):
            actor_metrics = run.actor.update_policy(
                batch, mini_batch_size=run.sizes.responses_per_mini_batch)
        with timer("update_weights"):
            run.engine.update_weights(run.actor.model.named_parameters())
    metrics = {**actor_metrics, **kl_metrics, **timer.metrics(),
               **rollout_metrics(rollouts, scores=scored.scores, rewards=rewards,
                                 advantages=advantages),
               **throughput_metrics(rollouts, step_seconds=timer.seconds["step"],
                                    world_size=run.sizes.world_size),
               "reward/errors": float(scored.errors),
               "training/epoch": float(run.train_loader.epoch)}
    return metrics


Sequences = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # Rollouts.sequences()


def old_policy_logprobs(run: Run, rollouts: Rollouts, sequences: Sequences
                        ) -> torch.Tensor | None:
    """log pi_old [N, R]: None when the update is exactly on-policy (pi_old is
    then the actor's own forward) unless the KL-in-reward needs it."""
    if run.on_policy and not run.cfg.algorithm.use_kl_in_reward:
        return None
    return run.actor.compute_log_prob(*sequences,
                                      response_length=rollouts.response_ids.shape[1])


def reference_logprobs(run: Run, rollouts: Rollouts, sequences: Sequences
                       ) -> torch.Tensor | None:
    """log pi_ref [N, R], when a KL term needs it."""
    if run.reference is None:
        return None
    return run.reference.compute_ref_log_prob(*sequences,
                                              response_length=rollouts.response_ids.shape[1])


def shaped_rewards(run: Run, rollouts: Rollouts, *, scores: torch.Tensor,
                   old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """Scores on the last token [N, R]; with algorithm.use_kl_in_reward, minus
    beta * KL(pi_old || pi_ref) on every response token."""
    rewards = token_level_rewards(scores, rollouts.response_mask)
    if run.kl_controller is None:
        return rewards, {}
    mask = rollouts.response_mask.float()
    kl = get_kl_estimator(run.cfg.algorithm.kl_penalty)(old_logprobs, ref_logprobs) * mask
    beta = run.kl_controller.value
    mean_kl = (kl.sum(-1) / mask.sum(-1).clamp(min=1)).mean().item()
    run.kl_controller.update(mean_kl, n_sequences=len(rollouts))
    return rewards - beta * kl, {"actor/reward_kl_penalty": mean_kl,
                                 "actor/reward_kl_penalty_coeff": beta}


def compute_advantages(run: Run, rollouts: Rollouts, rewards: torch.Tensor) -> torch.Tensor:
    return run.advantage_fn(rewards, rollouts.response_mask.float(), rollouts.group_ids,
                            norm_adv_by_std_in_grpo=run.cfg.algorithm.norm_adv_by_std_in_grpo)


def train_batch(run: Run, rollouts: Rollouts, sequences: Sequences, *, advantages: torch.Tensor,
                old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None) -> TrainBatch:
    input_ids, attention_mask, position_ids = sequences
    return TrainBatch(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, response_mask=rollouts.response_mask.float(),
                      advantages=advantages,
                      old_logprobs=None if run.on_policy else old_logprobs,
                      ref_logprobs=ref_logprobs if run.actor.kl_estimator is not None else None)


class ProgressBar:
    """Step, reward and time left on one line (tqdm), when enabled."""

    def __init__(self, run: Run) -> None:
        self.bar = None
        if run.cfg.trainer.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=run.total_steps, desc="GRPO", unit="step", dynamic_ncols=True)

    def update(self, metrics: dict, step: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix(reward=f"{metrics['critic/score/mean']:.3f}", refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
