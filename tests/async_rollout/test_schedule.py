"""Async training's schedule and checks without processes: the staleness
window, the staleness metrics on hand-made version stamps, the config checks."""

from __future__ import annotations

import pytest
import torch

from thinkrl.async_rollout.sampler import Window, staleness_metrics
from thinkrl.async_rollout.server import NO_VERSION, Generated
from thinkrl.config import Config, load_config
from thinkrl.config.checks import validate
from thinkrl.config.inactive import inactive_settings
from thinkrl.records import Rollouts


@pytest.mark.parametrize("mode,threshold,every,cap", [
    ("fully_async", 0.0, 1, 1),   # the synchronous algorithm
    ("fully_async", 1.0, 1, 2),   # one batch ahead
    ("fully_async", 0.1, 4, 4),   # verl's defaults: floor(1.1 * 4)
    ("fully_async", 0.5, 4, 6),
    ("one_step_off", 0.1, 4, 2),  # always: sync every step, one batch ahead
])
def test_the_window_is_verls_rule_in_whole_batches(mode, threshold, every, cap):
    window = Window.of(mode, staleness_threshold=threshold, sync_every=every)
    assert window.cap == cap and window.sync_every == (1 if mode == "one_step_off" else every)


def generated(versions: list[list[int]], continued: int = 0) -> Generated:
    v = torch.tensor(versions)
    mask = (v != NO_VERSION).long()
    n = len(versions)
    rollouts = Rollouts(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.long),
                        torch.zeros_like(v), mask, torch.zeros(v.shape), ["stop"] * n,
                        torch.zeros(n, dtype=torch.long), [None] * n)
    return Generated(rollouts, v, 1.0, continued)


def test_a_streamed_batch_reports_the_epoch_its_newest_prompt_was_drawn_in():
    batch = generated([[3, 3], [4, 4]])
    assert "training/epoch" not in staleness_metrics(batch, trainer_version=5)
    batch.origins = [[1, 61, 3], [2, 0, 7]]  # (epoch, position, row) per group
    assert staleness_metrics(batch, trainer_version=5)["training/epoch"] == 2.0


def test_staleness_is_the_lag_of_each_responses_oldest_token():
    # Trainer at version 5. Row 0: all of version 4 (lag 1); row 1: versions 3 then 5
    # (partial; lag 2, span 2); row 2: all 5 (lag 0); row 3: no tokens (left out).
    g = generated([[4, 4, -1], [3, 3, 5], [5, -1, -1], [-1, -1, -1]], continued=1)
    m = staleness_metrics(g, trainer_version=5)
    assert m["fully_async/staleness/mean"] == pytest.approx(1.0)
    assert m["fully_async/staleness/max"] == 2
    assert m["fully_async/count/stale_trajectory_processed"] == 2
    assert m["fully_async/partial/max_partial_span"] == 2
    assert m["fully_async/partial/partial_ratio"] == pytest.approx(1 / 3)
    assert (m["fully_async/samples_per_lag/0"], m["fully_async/samples_per_lag/1"],
            m["fully_async/samples_per_lag/2"]) == (1, 1, 1)


def problems_of(*overrides: str) -> str:
    with pytest.raises(ValueError) as err:
        validate(load_config("tiny", list(overrides)))
    return str(err.value)


def test_what_async_training_does_not_support_yet_is_refused_with_the_fix():
    text = problems_of("async_training.mode=one_step_off", "actor_rollout_ref.rollout.name=vllm",
                       "algorithm.adv_estimator=remax", "trainer.n_gpus_per_node=2")
    assert "rollout.name=vllm: the rollout process runs the native engine" in text
    assert "algorithm.adv_estimator=remax: ReMax's greedy baselines" in text
    assert "trainer.backend=ray: async training runs one trainer process" in text
    assert "or set async_training.mode=off" in text
    assert "async_training.mode=sometimes: use one of: off, one_step_off, fully_async" in \
        problems_of("async_training.mode=sometimes")
    assert "async_training.staleness_threshold=-0.5: must be >= 0" in \
        problems_of("async_training.mode=fully_async", "async_training.staleness_threshold=-0.5")
    assert "set data.train_batch_size=64 (verl's fully-async lines set it to 0)" in problems_of(
        "async_training.mode=fully_async", "async_training.require_batches=2")
    assert "trainer.critic_warmup=2: steps without an actor update send no weights" in problems_of(
        "async_training.mode=one_step_off", "algorithm.adv_estimator=gae", "trainer.critic_warmup=2")
    assert "async_training.streaming=True: streams the rollout process's responses: set " \
        "async_training.mode=fully_async" in problems_of("async_training.streaming=True")


def test_a_batch_with_tokens_of_older_weights_is_off_policy_whatever_the_window():
    """The tokens' versions decide, per batch: at window 1 (streaming can still
    train tokens of the previous version) as at one-step-off; a batch with none
    is the synchronous algorithm."""
    from thinkrl.build import step_settings

    def settings(*overrides):
        cfg = load_config("tiny", list(overrides))
        return step_settings(cfg, validate(cfg))
    for window in (("async_training.mode=fully_async", "async_training.staleness_threshold=0",
                    "async_training.trigger_parameter_sync_step=1", "async_training.streaming=True"),
                   ("async_training.mode=one_step_off",)):
        each = settings(*window)
        assert each.for_batch(behind=False) == (False, None)  # the synchronous algorithm
        off_policy, correction = each.for_batch(behind=True)
        assert off_policy and correction is not None and correction.threshold == 2.0
        assert each.recompute_old_logprobs  # the engine-gap metrics, and pi_old when behind
    bypass = settings("async_training.mode=one_step_off", "actor_rollout_ref.actor.use_rollout_log_probs=True")
    assert bypass.off_policy and bypass.old_from_rollout and not bypass.recompute_old_logprobs
    assert bypass.for_batch(behind=True) == (True, None)
    explicit = settings("algorithm.rollout_is=True")
    assert explicit.for_batch(behind=False)[1] is not None  # rollout_is: every batch


def test_async_keys_with_mode_off_are_noted_as_changing_nothing():
    cfg = load_config("tiny", ["async_training.staleness_threshold=0.5"])
    notes = inactive_settings(cfg)
    assert any(n.startswith("async_training.staleness_threshold=0.5 has no effect: "
                            "async_training.mode=off") for n in notes)
    assert not [n for n in inactive_settings(Config()) if "async_training" in n]
