"""The training driver: one named call per stage, in the order of the algorithm.

Variant: GRPO with outcome rewards (DeepSeekMath / R1-Zero). For each of B
prompts, sample G responses; score each with a rule; advantage = score minus
the group mean, divided by the group std (`norm_adv_by_std_in_grpo`); update
the policy with the PPO clipped objective plus a KL loss to the frozen
reference (`use_kl_loss`, k3 by default) instead of a KL penalty in the
reward. All normalisers span the whole mini-batch (see `thinkrl.algos.losses`).
Other estimators and losses are chosen once at build (`thinkrl.algos`);
`algorithm.adv_estimator=gae` is PPO with a critic (`thinkrl.ppo_critic`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from thinkrl.algos.gae import AdvantageResult
from thinkrl.algos.kl import get_kl_estimator
from thinkrl.algos.rollout_correction import logprob_gap_metrics, rollout_is_weights
from thinkrl.build import build_run
from thinkrl.checkpoint.resume import should_save
from thinkrl.checkpoint.state import Progress, save_checkpoint
from thinkrl.checkpoint.store import kept_on_disk
from thinkrl.config import Config
from thinkrl.evaluation import run_validation
from thinkrl.generations import log_train_generations, log_val_generations
from thinkrl.guard import DivergenceGuard
from thinkrl.metrics import StageTimer, rollout_metrics, throughput_metrics
from thinkrl.ppo_critic import actor_updates, critic_values, update_critic
from thinkrl.records import Rollouts, TrainBatch
from thinkrl.run import Run
from thinkrl.rewards.scoring import token_level_rewards

MAX_SKIPPED_UPDATES = 3


@dataclass
class TrainResult:
    run_dir: str
    first_val: dict[str, float]
    last_val: dict[str, float]
    steps: int


def train(cfg: Config, *, log=print) -> TrainResult:
    run = build_run(cfg, log=log)
    try:
        return train_run(run, log=log)
    finally:  # scoring workers and logger sinks outlive no run
        run.close()


def train_run(run: Run, *, log=print) -> TrainResult:
    cfg = run.cfg
    log(f"run directory: {run.run_dir}")
    log(run.sizes.table())
    log(f"training for {run.total_steps} steps "
        f"({run.train_loader.batches_per_epoch} steps per epoch)")
    start = run.progress.step  # 0, or the step of the checkpoint resumed from
    first_val, last_val = validation_records(run.metrics_log.kept)
    # A resumed run validated before its first step already (and a sampled
    # validation would move the engine's generator off the straight run's).
    if cfg.trainer.val_only or (cfg.trainer.val_before_train and start == 0):
        first_val = last_val = validate(run, step=start)
        run.metrics_log.log(first_val, step=start)
    if cfg.trainer.val_only:
        return TrainResult(str(run.run_dir), first_val, first_val, start)
    if start >= run.total_steps:
        log(f"the checkpoint resumed from is of step {start}, the run's last "
            f"({run.total_steps}): nothing left to train. Raise trainer.total_training_steps "
            "(or total_epochs) to train on, or set trainer.resume_mode=disable to start afresh")
        return TrainResult(str(run.run_dir), first_val, last_val, start)

    skipped_in_a_row = run.progress.skipped_updates_in_a_row
    bar = ProgressBar(run)
    guard = DivergenceGuard(run)
    for step in range(start + 1, run.total_steps + 1):
        metrics = train_step(run, step)
        guard.check(metrics, step=step)  # a destroyed policy is neither validated nor saved
        skipped_in_a_row = skipped_in_a_row + 1 if metrics.get("actor/skipped_updates") else 0
        if skipped_in_a_row >= MAX_SKIPPED_UPDATES:
            raise FloatingPointError(
                f"step {step}: the gradient norm was not finite for {skipped_in_a_row} steps in "
                f"a row; those updates were skipped, so the weights in memory are those after step "
                f"{step - skipped_in_a_row} (not saved by this stop). {kept_on_disk(run.run_dir)} "
                "Lower actor_rollout_ref.actor.optim.lr or check the rewards.")
        test_freq = cfg.trainer.test_freq  # <= 0: never (verl's rule, the last step included)
        if test_freq > 0 and (step % test_freq == 0 or step == run.total_steps):
            last_val = validate(run, step=step)
            metrics.update(last_val)
        run.metrics_log.log(metrics, step=step)
        if should_save(cfg.trainer, step, run.total_steps):
            save_checkpoint(run, Progress(step, skipped_in_a_row), log=log)
        bar.update(metrics, last_val)
    bar.close()
    return TrainResult(str(run.run_dir), first_val, last_val, run.total_steps)


def validate(run: Run, *, step: int) -> dict[str, float]:
    """Validation metrics; a few generations saved when trainer.log_val_generations > 0."""
    result = run_validation(run)
    log_val_generations(run.run_dir, step, result.generations,
                        count=run.cfg.trainer.log_val_generations)
    return result.metrics()


def train_step(run: Run, step: int) -> dict[str, float]:
    """Generate, score, estimate advantages, update the critic (PPO with a
    critic only), update the actor, sync weights."""
    timer = StageTimer(run.sync)
    with timer("step"):
        sampled = run.sample(run, timer)  # gen + reward (ReMax's baselines, DAPO's sampling)
        rollouts, texts, scored = sampled.rollouts, sampled.texts, sampled.scored
        run.zero_reward_watch.update(scored.scores, failures=scored.errors + scored.timeouts)
        check_reward_failures(run, scored, step=step)  # before an update on failed scores
        save_train_generations(run, step, rollouts, texts=texts, scores=scored.scores)
        sequences = rollouts.sequences()  # prompt + response, built once per step
        with timer("old_log_prob"):
            old_logprobs = old_policy_logprobs(run, rollouts, sequences)
        with timer("ref"):
            ref_logprobs = reference_logprobs(run, rollouts, sequences)
        values = critic_values(run, rollouts, sequences, timer)  # None without a critic (gae)
        with timer("adv"):
            rewards, kl_metrics = shaped_rewards(run, rollouts, scores=scored.scores,
                                                 old_logprobs=old_logprobs,
                                                 ref_logprobs=ref_logprobs)
            estimated = compute_advantages(run, rollouts, rewards, values=values,
                                           reward_baselines=sampled.reward_baselines)
            advantages, drift_metrics = rollout_drift(run, rollouts, estimated.advantages,
                                                      old_logprobs)
        batch = train_batch(run, rollouts, sequences, advantages=advantages,
                            old_logprobs=old_logprobs, ref_logprobs=ref_logprobs)
        critic_metrics = update_critic(run, batch, returns=estimated.returns, values=values,
                                       timer=timer)
        actor_metrics = update_actor(run, batch, step=step, timer=timer)
    metrics = {**actor_metrics, **critic_metrics, **kl_metrics, **drift_metrics, **timer.metrics(),
               **rollout_metrics(rollouts, scores=scored.scores, rewards=rewards,
                                 advantages=advantages),
               **throughput_metrics(rollouts, step_seconds=timer.seconds["step"],
                                    world_size=run.sizes.world_size),
               **scored.metrics(), **sampled.metrics,
               "training/epoch": float(run.train_loader.epoch)}
    return metrics


Sequences = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # Rollouts.sequences()


def old_policy_logprobs(run: Run, rollouts: Rollouts, sequences: Sequences
                        ) -> torch.Tensor | None:
    """log pi_old [N, R]: None when the update is exactly on-policy (pi_old is
    then the actor's own forward) unless the KL-in-reward needs it."""
    if run.on_policy and not run.cfg.algorithm.use_kl_in_reward and not run.recomputes_rollout_logprobs:
        return None
    return run.actor.compute_log_prob(*sequences,
                                      response_length=rollouts.response_ids.shape[1],
                                      **image_inputs(rollouts))


def reference_logprobs(run: Run, rollouts: Rollouts, sequences: Sequences
                       ) -> torch.Tensor | None:
    """log pi_ref [N, R], when a KL term needs it."""
    if run.reference is None:
        return None
    return run.reference.compute_ref_log_prob(*sequences,
                                              response_length=rollouts.response_ids.shape[1],
                                              **image_inputs(rollouts))


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


def compute_advantages(run: Run, rollouts: Rollouts, rewards: torch.Tensor, *,
                       values: torch.Tensor | None = None,
                       reward_baselines: torch.Tensor | None = None) -> AdvantageResult:
    """run.advantage_fn (settings bound at build); the step's own inputs bound
    here: ReMax's greedy baselines, GAE's critic values (and its returns come back)."""
    step_inputs = {name: value for name, value in (("reward_baselines", reward_baselines),
                                                   ("values", values)) if value is not None}
    return run.advantage_fn(rewards, rollouts.response_mask.float(), rollouts.group_ids, **step_inputs)


def rollout_drift(run: Run, rollouts: Rollouts, advantages: torch.Tensor,
                  old_logprobs: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
    """The engine's log-probs against the trainer's (logged whenever both
    exist); with algorithm.rollout_is, the advantages times the truncated
    importance weights pi_trainer / pi_rollout. A positive per-token weight
    factors out of PPO's clipped objective, so this weights each token's
    policy-gradient loss exactly as verl's rollout_is does."""
    if old_logprobs is None:
        return advantages, {}
    mask = rollouts.response_mask.float()
    metrics = logprob_gap_metrics(rollouts.rollout_logprobs, old_logprobs, mask)
    algo = run.cfg.algorithm
    if algo.rollout_is:
        weights, is_metrics = rollout_is_weights(old_logprobs, rollouts.rollout_logprobs, mask,
                                                 threshold=algo.rollout_is_threshold,
                                                 level=algo.rollout_is_level, mode=algo.rollout_is_mode)
        advantages = advantages * weights
        metrics.update(is_metrics)
    return advantages, metrics


def update_actor(run: Run, batch: TrainBatch, *, step: int, timer: StageTimer) -> dict[str, float]:
    """The policy update, then the weight sync to the engine; neither during
    the critic's warmup (trainer.critic_warmup, PPO with a critic)."""
    if not actor_updates(run, step):
        return {}
    with timer("update_actor"):
        metrics = run.actor.update_policy(batch)
    with timer("update_weights"):
        run.engine.sync_weights()
    return metrics


def train_batch(run: Run, rollouts: Rollouts, sequences: Sequences, *, advantages: torch.Tensor,
                old_logprobs: torch.Tensor | None, ref_logprobs: torch.Tensor | None) -> TrainBatch:
    input_ids, attention_mask, position_ids = sequences
    return TrainBatch(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, response_mask=rollouts.response_mask.float(),
                      advantages=advantages,
                      old_logprobs=None if run.on_policy else old_logprobs,
                      ref_logprobs=ref_logprobs if run.cfg.actor_rollout_ref.actor.use_kl_loss else None,
                      model_inputs=rollouts.model_inputs)


def image_inputs(rollouts: Rollouts) -> dict:
    """The log-prob passes' `model_inputs` keyword: the prompts' images (VL models)."""
    return {} if rollouts.model_inputs is None else {"model_inputs": rollouts.model_inputs}


def check_reward_failures(run: Run, scored, *, step: int) -> None:
    """reward.max_failure_rate: RunStopped when most responses fail to score."""
    if run.reward_breaker is not None:
        run.reward_breaker.update(errors=scored.errors, timeouts=scored.timeouts,
                                  unscored=scored.unscored, responses=len(scored.scores), step=step,
                                  first_error=run.reward.first_error, run_dir=run.run_dir)


def save_train_generations(run: Run, step: int, rollouts: Rollouts, *, texts: list[str],
                           scores: torch.Tensor) -> None:
    """trainer.log_train_generations responses, every trainer.generations_log_freq steps."""
    trainer = run.cfg.trainer
    log_train_generations(run.run_dir, step, rollouts, texts=texts, scores=scores.tolist(),
                          count=trainer.log_train_generations, every=trainer.generations_log_freq)


def validation_records(records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """The validation metrics before training and the latest ones, from the
    metrics.jsonl records of the run being resumed (none for a fresh run)."""
    found = [{k: v for k, v in r.items() if k.startswith("val-")} for r in records]
    found = [values for values in found if values]
    first = found[0] if records and records[0]["step"] == 0 and found else {}
    return first, (found[-1] if found else {})


class ProgressBar:
    """Step, reward and time left on one line (tqdm), when enabled."""

    def __init__(self, run: Run) -> None:
        self.bar = None
        if run.cfg.trainer.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=run.total_steps, initial=run.progress.step,
                            desc=run.cfg.algorithm.adv_estimator,
                            unit="step", dynamic_ncols=True)

    def update(self, metrics: dict, last_val: dict) -> None:
        """Training reward of this step, and the latest validation accuracy."""
        if self.bar is None:
            return
        shown = {"reward": f"{metrics['critic/score/mean']:.3f}"}
        accuracies = [v for k, v in last_val.items() if k.startswith("val-core/") and "/acc/" in k]
        if accuracies:
            shown["val_acc"] = f"{sum(accuracies) / len(accuracies):.3f}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
