"""The training driver: one named call per stage, in the order of the algorithm.

Variant: GRPO with outcome rewards (DeepSeekMath / R1-Zero). For each of B
prompts, sample G responses; score each with a rule; advantage = score minus
the group mean, divided by the group std (`norm_adv_by_std_in_grpo`); update
the policy with the PPO clipped objective plus a KL loss to the frozen
reference (`use_kl_loss`, k3 by default) instead of a KL penalty in the
reward. All normalisers span the whole mini-batch (see `thinkrl.algos.losses`).
Other estimators and losses are chosen once at build (`thinkrl.algos`);
`algorithm.adv_estimator=gae` is PPO with a critic (`thinkrl.stages.critic`).
"""

from __future__ import annotations

import contextlib
import sys

from dataclasses import dataclass

from thinkrl.build import build_run
from thinkrl.checkpoint.resume import should_save
from thinkrl.checkpoint.state import save_checkpoint
from thinkrl.checkpoint.store import kept_on_disk
from thinkrl.config import Config
from thinkrl.evaluation import run_validation
from thinkrl.generations import log_train_generations, log_val_generations
from thinkrl.guard import DivergenceGuard
from thinkrl.metrics import StageTimer, breakdown_metrics, rollout_metrics, throughput_metrics
from thinkrl.progress import listening
from thinkrl.preflight import busy_machine_note
from thinkrl.run import Progress, Run
from thinkrl.stages.advantages import compute_advantages, rollout_drift, shaped_rewards
from thinkrl.stages.critic import actor_updates, critic_values, update_critic
from thinkrl.stages.logprobs import old_policy_logprobs, reference_logprobs, update_routes
from thinkrl.stages.teacher import distillation_metrics, teacher_logprobs
from thinkrl.stages.update import train_batch, update_actor

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
    spec, state, trainer = run.spec, run.state, run.spec.cfg.trainer
    log(f"run directory: {spec.run_dir}")
    log(spec.sizes.table())
    log(f"training for {spec.total_steps} steps "
        f"({state.train_loader.batches_per_epoch} steps per epoch)")
    if (busy := busy_machine_note()) is not None:
        log(busy)
    start = state.progress.step  # 0, or the step of the checkpoint resumed from
    first_val, last_val = validation_records(state.metrics_log.kept)
    # A resumed run validated before its first step already (and a sampled
    # validation would move the engine's generator off the straight run's).
    if trainer.val_only or (trainer.val_before_train and start == 0):
        first_val = last_val = validate(run, step=start)
        state.metrics_log.log(first_val, step=start)
    if trainer.val_only:
        return TrainResult(str(spec.run_dir), first_val, first_val, start)
    if start >= spec.total_steps:
        log(f"the checkpoint resumed from is of step {start}, the run's last "
            f"({spec.total_steps}): nothing left to train. Raise trainer.total_training_steps "
            "(or total_epochs) to train on, or set trainer.resume_mode=disable to start afresh")
        return TrainResult(str(spec.run_dir), first_val, last_val, start)

    skipped_in_a_row = state.progress.skipped_updates_in_a_row
    bar = ProgressBar(run)
    guard = DivergenceGuard(run)
    with bar.listening():  # the decoders and learners say how far a long step is
        for step in range(start + 1, spec.total_steps + 1):
            metrics = train_step(run, step, on_stage=bar.stage)
            guard.check(metrics, step=step)  # a destroyed policy is neither validated nor saved
            skipped_in_a_row = skipped_in_a_row + 1 if metrics.get("actor/skipped_updates") else 0
            if skipped_in_a_row >= MAX_SKIPPED_UPDATES:
                raise FloatingPointError(
                    f"step {step}: the gradient norm was not finite for {skipped_in_a_row} steps in "
                    f"a row; those updates were skipped, so the weights in memory are those after step "
                    f"{step - skipped_in_a_row} (not saved by this stop). {kept_on_disk(spec.run_dir)} "
                    "Lower actor_rollout_ref.actor.optim.lr or check the rewards.")
            test_freq = trainer.test_freq  # <= 0: never (verl's rule, the last step included)
            if test_freq > 0 and (step % test_freq == 0 or step == spec.total_steps):
                bar.stage("validation")
                last_val = validate(run, step=step)
                metrics.update(last_val)
            state.metrics_log.log(metrics, step=step)
            if should_save(trainer, step, spec.total_steps):
                bar.stage("save")
                save_checkpoint(run, Progress(step, skipped_in_a_row), log=log)
            bar.update(metrics, last_val)
    bar.close()
    return TrainResult(str(spec.run_dir), first_val, last_val, spec.total_steps)


def validate(run: Run, *, step: int) -> dict[str, float]:
    """Validation metrics; a few generations saved when trainer.log_val_generations > 0."""
    result = run_validation(run.roles.engine, run.spec, reward=run.reward)
    log_val_generations(run.spec.run_dir, step, result.generations,
                        count=run.spec.cfg.trainer.log_val_generations)
    return result.metrics()


def train_step(run: Run, step: int, *, on_stage=None) -> dict[str, float]:
    """Generate, score, estimate advantages, update the critic (PPO with a
    critic only), update the actor, sync weights. `on_stage(name)`: told
    each stage as it starts (the progress bar shows it)."""
    spec, roles, state, settings = run.spec, run.roles, run.state, run.spec.step
    timer = StageTimer(roles.sync, on_stage=on_stage)
    with timer("step"):
        sampled = run.sample(timer)  # gen + reward (ReMax's baselines, DAPO's sampling)
        rollouts, texts, scored = sampled.rollouts, sampled.texts, sampled.scored
        state.zero_reward_watch.update(scored.scores, failures=scored.errors + scored.timeouts)
        state.reward_breaker.check(scored, step=step, first_error=run.reward.first_error,
                                   run_dir=spec.run_dir)  # before an update on failed scores
        log_train_generations(spec.run_dir, step, rollouts, texts=texts, scores=scored.scores.tolist(),
                              count=settings.train_generations, every=settings.generations_every)
        sequences = rollouts.sequences()  # prompt + response, built once per step
        with timer("old_log_prob"):
            old_logprobs = old_policy_logprobs(roles.actor, rollouts, sequences,
                                               recompute=settings.recompute_old_logprobs,
                                               from_rollout=settings.old_from_rollout)
        routes, routing_metrics = update_routes(roles.actor, rollouts, sequences, mode=settings.router_replay)
        with timer("ref"):
            ref_logprobs = reference_logprobs(roles.reference, rollouts, sequences)
        teacher = teacher_logprobs(roles.teachers, settings.teachers, rollouts, sequences, timer)
        values = critic_values(roles.critic, rollouts, sequences, timer)  # gae only
        with timer("adv"):
            rewards, kl_metrics = shaped_rewards(
                rollouts, scores=scored.scores, old_logprobs=old_logprobs, ref_logprobs=ref_logprobs,
                kl_controller=state.kl_controller, kl_penalty=settings.kl_penalty)
            estimated = compute_advantages(spec.advantage_fn, rollouts, rewards, values=values,
                                           reward_baselines=sampled.reward_baselines)
            advantages = estimated.advantages
            off_policy, correction = settings.for_batch(behind=sampled.behind_trainer)
            is_weights, drift_metrics = rollout_drift(rollouts, old_logprobs, correction=correction)
        batch = train_batch(rollouts, sequences, advantages=advantages, old_logprobs=old_logprobs,
                            ref_logprobs=ref_logprobs, off_policy=off_policy,
                            kl_loss=settings.kl_loss, rollout_is_weights=is_weights, teacher_logprobs=teacher,
                            routed_experts=routes)
        critic_metrics = update_critic(roles.critic, batch, returns=estimated.returns,
                                       values=values, timer=timer)
        actor_metrics = update_actor(roles.actor, roles.engine, batch, step=step, timer=timer, updates=actor_updates(
            step, with_critic=roles.critic is not None, critic_warmup=settings.critic_warmup))
    student = rollouts.rollout_logprobs if old_logprobs is None else old_logprobs
    return {**actor_metrics, **critic_metrics, **kl_metrics, **drift_metrics, **timer.metrics(),
            **distillation_metrics(rollouts, student, teacher), **routing_metrics,
            **rollout_metrics(rollouts, scores=scored.scores, rewards=rewards, advantages=advantages),
            **breakdown_metrics(rollouts, scores=scored.scores, parts=scored.parts),
            **throughput_metrics(rollouts, step_seconds=timer.seconds["step"],
                                 world_size=spec.sizes.world_size),
            # streaming rollout's sampler gives the epoch its batch was drawn in (the trainer's loader stands still)
            **scored.metrics(), "training/epoch": float(state.train_loader.epoch), **sampled.metrics}


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
        self.name, self.current = run.spec.cfg.algorithm.adv_estimator, ""
        # Stages and their progress redraw the line on a terminal; written to a
        # file or a pipe (CI, `make demo > log`) every redraw would be a line
        # of its own, so there the bar shows once per step and nothing is told.
        self.live = sys.stderr.isatty()
        if run.spec.cfg.trainer.progress_bar:
            from tqdm import tqdm
            self.bar = tqdm(total=run.spec.total_steps, initial=run.state.progress.step,
                            desc=self.name, unit="step", dynamic_ncols=True)

    def stage(self, name: str) -> None:
        """Show the stage running now (a long step is not a hang: which part it is in shows)."""
        self.current = name
        if self.bar is not None and self.live:
            self.bar.set_description(f"{self.name} [{name}]", refresh=True)

    def detail(self, text: str) -> None:
        """How far the stage is (`thinkrl.progress`: tokens and rows, micro-batches)."""
        if self.bar is not None and self.live:
            self.bar.set_description(f"{self.name} [{self.current}: {text}]", refresh=True)

    def update(self, metrics: dict, last_val: dict) -> None:
        """Training reward of this step, and the latest validation accuracy."""
        if self.bar is None:
            return
        shown = {"reward": f"{metrics['critic/score/mean']:.3f}"}
        accuracies = [v for k, v in last_val.items() if k.startswith("val-core/") and "/acc/" in k]
        if accuracies:
            shown["val_acc"] = f"{sum(accuracies) / len(accuracies):.3f}"
        self.bar.set_postfix(shown, refresh=False)
        self.bar.set_description(self.name, refresh=False)
        self.bar.update(1)

    def listening(self):
        return listening(self.detail) if self.bar is not None and self.live else contextlib.nullcontext()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
