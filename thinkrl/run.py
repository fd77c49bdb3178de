"""A built run, in three parts, as the driver, its stages, the checkpoint
code and the guard see it:

- `RunSpec`: what the run is, fixed at build (sizes, paths, sampling, the
  settings the step's stages read, the bound advantage estimator);
- `Roles`: the handles of the run's ranks (one in this process, or a Ray
  worker group), the same for both backends;
- `RunState`: where training stands and everything that changes with it
  (progress, data position, the KL controller, the watchers, the log).

`Run` holds the three and the resources a run owns (the scorers, the lock).
Built by `thinkrl.build.build_run`; a low module, so every layer can type it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from thinkrl.algos.kl_control import KLController
from thinkrl.algos.rollout_correction import RolloutCorrection
from thinkrl.checkpoint.lock import RunLock
from thinkrl.checkpoint.store import remove_own_unfinished_saves
from thinkrl.config import Config
from thinkrl.config.distill_checks import Teacher
from thinkrl.config.sizes import DerivedSizes
from thinkrl.data.dataset import Prompt, PromptLoader
from thinkrl.metrics import MetricsLog
from thinkrl.reward_watch import FailureBreaker, ZeroRewardWatch
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import PolicyRole, ReferenceRole, RolloutRole, TeacherRole, ValueRole


@dataclass(frozen=True)
class StepSettings:
    """The settings a training step's stages read, resolved from the config
    once at build, so no stage reads the config."""

    recompute_old_logprobs: bool
    """log pi_old needs its own forward pass: the update is off-policy (more
    than one optimizer step per step), the KL penalty in the reward needs
    it, or the engine samples from its own weights (vllm) or rollout_is
    corrects the drift, so the trainer's log-probs are compared with the
    engine's."""
    old_from_rollout: bool
    """actor.use_rollout_log_probs: pi_old is the engine's log-probs of the
    sampled tokens (the behaviour policy), not a trainer forward."""
    off_policy: bool
    """More than one optimizer step per training step, or pi_old from the
    rollout (use_rollout_log_probs): every batch's update needs the old
    log-probs. A batch with tokens of older weights (async) needs them too:
    `for_batch` decides that per batch."""
    kl_loss: bool
    """actor.use_kl_loss: the reference log-probs go into the update."""
    kl_penalty: str
    """algorithm.kl_penalty: the estimator of the KL penalty in the reward."""
    rollout_correction: RolloutCorrection | None
    """algorithm.rollout_is's weights for every batch, or None."""
    behind_correction: RolloutCorrection | None
    """Async training (pi_old a trainer forward): the same weights for a batch
    holding tokens sampled by older weights than the trainer's; None otherwise."""
    critic_warmup: int
    """trainer.critic_warmup: the actor updates from this step on (with a critic)."""
    train_generations: int
    """trainer.log_train_generations responses saved ..."""
    generations_every: int
    """... every trainer.generations_log_freq steps."""
    teachers: tuple[Teacher, ...] = ()
    """distillation.enabled: the frozen teachers and the rows each scores."""
    router_replay: str = "disabled"
    """Mixture-of-experts router replay: disabled, R2 or R3 (`thinkrl.models.routing`)."""

    def for_batch(self, *, behind: bool) -> tuple[bool, RolloutCorrection | None]:
        """(off-policy, correction) for one batch: `behind` when any of its
        tokens was sampled by weights older than the trainer's (the versions
        the rollout stamped on them), whatever the window promised."""
        off_policy = self.off_policy or behind
        return off_policy, self.rollout_correction or (self.behind_correction if behind else None)


@dataclass(frozen=True)
class RunSpec:
    """What the run is: fixed at build."""

    cfg: Config
    """The config as loaded: written into every checkpoint and the report;
    the stages read `step` instead."""
    sizes: DerivedSizes
    run_dir: Path
    model_path: str
    """actor_rollout_ref.model.path with `builtin:` names resolved to folders."""
    tokenizer: object
    val_prompts: list[Prompt]
    sampling: SamplingParams
    val_sampling: SamplingParams
    val_batch_size: int
    """Prompts per validation generate call."""
    total_steps: int
    advantage_fn: Callable
    """The estimator with its settings bound (`thinkrl.algos.advantages.BoundEstimator`)."""
    step: StepSettings


@dataclass(frozen=True)
class Roles:
    """What the driver calls: the handles of the run's ranks (one
    `PolicyRank` in this process, or one Ray actor per device)."""

    actor: PolicyRole
    reference: ReferenceRole | None
    engine: RolloutRole
    sync: Callable[[], None]
    """Waits for the device's queued work (a no-op when Ray calls already waited)."""
    close: Callable[[], None]
    """Stops the workers (ray backend)."""
    critic: ValueRole | None = None
    """The value model (algorithm.adv_estimator=gae), or None."""
    teachers: TeacherRole | None = None
    """The frozen teachers of on-policy distillation (distillation.enabled), or None."""


@dataclass
class Progress:
    """Where the training loop stands after a step."""
    step: int = 0
    skipped_updates_in_a_row: int = 0


@dataclass
class RunState:
    """What changes as the run trains, and is checkpointed or logged."""

    train_loader: PromptLoader
    metrics_log: MetricsLog
    zero_reward_watch: ZeroRewardWatch
    kl_controller: KLController | None
    """beta of the KL penalty in the reward (algorithm.use_kl_in_reward), or None."""
    reward_breaker: FailureBreaker
    """Stops the run when most responses fail to score (reward.max_failure_rate)."""
    progress: Progress = field(default_factory=Progress)
    """Step 0, or the step of the checkpoint resumed from."""


@dataclass
class Run:
    spec: RunSpec
    roles: Roles
    state: RunState
    reward: RewardScorer
    """Scores responses (worker processes with a per-response timeout)."""
    sample: Callable
    """The generate-and-score stage, chosen at build (`thinkrl.stages.sampling`:
    one batch, ReMax's greedy baselines, DAPO's dynamic sampling): sample(timer)."""
    lock: RunLock | None = None
    """This run's exclusive hold on run_dir (thinkrl.checkpoint.lock)."""

    def close(self) -> None:
        """Stop the scoring workers and the Ray workers, close the logger sinks,
        free the run directory."""
        try:
            self.reward.close()
            self.state.metrics_log.close()
        finally:
            self.roles.close()
            if self.lock is not None:
                try:  # this process's saves are over (a Ray rank killed late may still add a file)
                    remove_own_unfinished_saves(self.spec.run_dir)
                finally:
                    self.lock.release()
