"""A built run, as the driver and its stages see it: the roles (`Roles`:
handles over one in-process rank or a Ray worker group), the
data, the scorers and watchers, and where training stands.

Built by `thinkrl.build.build_run`; the stages (`thinkrl.trainer`,
`thinkrl.dynamic_sampling`, `thinkrl.ppo_critic`, `thinkrl.evaluation`) take it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from thinkrl.algos.kl_control import KLController
from thinkrl.checkpoint.lock import RunLock
from thinkrl.checkpoint.state import Progress
from thinkrl.config import Config, DerivedSizes
from thinkrl.data.dataset import Prompt, PromptLoader
from thinkrl.metrics import MetricsLog
from thinkrl.reward_watch import FailureBreaker, ZeroRewardWatch
from thinkrl.rewards.scorer import RewardScorer
from thinkrl.rollout.base import SamplingParams
from thinkrl.workers.roles import PolicyRole, ReferenceRole, RolloutRole, ValueRole


@dataclass
class Run:
    cfg: Config
    sizes: DerivedSizes
    run_dir: Path
    model_path: str
    """actor_rollout_ref.model.path with `builtin:` names resolved to folders."""
    tokenizer: object
    actor: PolicyRole
    """The policy and its update: a handle over the run's ranks (one in this
    process, or one Ray actor per device: `thinkrl.workers.handles`)."""
    reference: ReferenceRole | None
    engine: RolloutRole
    train_loader: PromptLoader
    val_prompts: list[Prompt]
    reward: RewardScorer
    """Scores responses (worker processes with a per-response timeout); close() it."""
    zero_reward_watch: ZeroRewardWatch
    sample: Callable
    """The generate-and-score stage, chosen at build (`thinkrl.dynamic_sampling.build_sampler`:
    one batch, ReMax's greedy baselines, DAPO's dynamic sampling): sample(run, timer)."""
    advantage_fn: Callable
    sampling: SamplingParams
    val_sampling: SamplingParams
    total_steps: int
    metrics_log: MetricsLog
    kl_controller: KLController | None
    """beta of the KL penalty in the reward (algorithm.use_kl_in_reward)."""
    sync: Callable[[], None]
    """Waits for the device's queued work (for honest stage timings)."""
    progress: Progress = field(default_factory=Progress)
    """Where training stands: step 0, or the step of the checkpoint resumed from."""
    close_workers: Callable[[], None] = lambda: None
    """Stops the Ray workers (ray backend)."""
    reward_breaker: FailureBreaker | None = None
    """Stops the run when most responses fail to score (reward.max_failure_rate)."""
    lock: RunLock | None = None
    """This run's exclusive hold on run_dir (thinkrl.checkpoint.lock); close() frees it."""
    critic: ValueRole | None = None
    """PPO's value model and its update (algorithm.adv_estimator=gae); None otherwise."""

    def close(self) -> None:
        """Stop the scoring workers and the Ray workers, close the logger sinks,
        free the run directory."""
        try:
            self.reward.close()
            self.metrics_log.close()
        finally:
            self.close_workers()
            if self.lock is not None:
                self.lock.release()

    @property
    def recomputes_rollout_logprobs(self) -> bool:
        """The engine samples from its own copy of the weights (vllm), or the
        drift is corrected: the trainer recomputes the log-probs of every
        sampled token to measure (and with rollout_is, correct) the gap."""
        return self.cfg.actor_rollout_ref.rollout.name != "native" or self.cfg.algorithm.rollout_is

    @property
    def on_policy(self) -> bool:
        """One optimizer step per training step on fresh samples: pi_old is
        the current policy, so the old log-probs need no extra forward pass."""
        return self.sizes.optimizer_steps_per_step == 1


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
