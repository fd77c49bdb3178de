"""Async training end to end on the tiny test model, one trainer process and
one rollout process: zero staleness is the synchronous algorithm, one-step-off
trains one version behind, a checkpoint keeps the queue (an exact resume), a
hung or dead rollout process is named within its deadline."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.errors import WorkerFailed
from thinkrl.trainer import train, train_run

pytestmark = pytest.mark.slow

SHARED_METRICS = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                  "actor/grad_norm", "actor/pg_clipfrac", "response_length/mean",
                  "critic/advantages/mean")


def overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.optim.lr=1e-3",  # so that the versions differ visibly
            "data.max_response_length=16", "trainer.total_training_steps=3",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
            "trainer.progress_bar=False", "trainer.logger=[]", *extra]


def length_reward(folder: Path) -> str:
    """A reward that differs within every group (the tiny test model scores 0
    on the task), so every step moves the weights."""
    path = folder / "length_reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(len(solution_str) % 5) / 4\n")
    return f"custom_reward_function.path={path}"


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def one_thread():
    """Both sides and the synchronous run on one thread each: the same kernels."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_zero_staleness_is_the_synchronous_algorithm(asset_cache, tiny_model_dir, tmp_path, one_thread):
    quiet = dict(log=lambda *_: None)
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "sync",
                                                     length_reward(tmp_path))), **quiet)
    train(load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "async", "async_training.mode=fully_async", length_reward(tmp_path),
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
        "async_training.rollout_threads=1")), **quiet)
    sync, asynchronous = metrics(tmp_path / "sync"), metrics(tmp_path / "async")
    assert [r["step"] for r in asynchronous] == [1, 2, 3]
    for a, b in zip(sync, asynchronous):
        assert b["fully_async/staleness/max"] == 0 and b["fully_async/count/current_param_version"] == a["step"] - 1
        assert b["rollout/logprob_diff_max"] < 1e-4  # the rollout's copy is the trainer's policy
        for key in SHARED_METRICS:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_a_lora_run_s_rollout_process_samples_from_the_merged_adapter(asset_cache, tiny_model_dir, tmp_path,
                                                                     one_thread):
    """The rollout process holds a plain model; it is sent the base with the
    trained adapter merged in (attested at every sync): at zero staleness its
    log-probs are the trainer's LoRA policy's and the run is the synchronous one."""
    pytest.importorskip("peft")
    quiet = dict(log=lambda *_: None)
    lora = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.actor.optim.lr=1e-2", length_reward(tmp_path))
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "sync", *lora)), **quiet)
    train(load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "async", *lora, "async_training.mode=fully_async",
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
        "async_training.rollout_threads=1")), **quiet)
    sync, asynchronous = metrics(tmp_path / "sync"), metrics(tmp_path / "async")
    assert [r["step"] for r in asynchronous] == [1, 2, 3]
    assert sync[-1]["actor/kl_loss"] > 1e-4  # the adapter moved the policy away from the base
    for a, b in zip(sync, asynchronous):
        assert b["rollout/logprob_diff_max"] < 1e-4 and b["timing_s/weight_attest"] >= 0
        for key in SHARED_METRICS:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_one_step_off_trains_one_version_behind_and_learns_the_same_way(asset_cache, tiny_model_dir,
                                                                        tmp_path):
    quiet = dict(log=lambda *_: None)
    result = train(load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "run", "async_training.mode=one_step_off",
        length_reward(tmp_path))), **quiet)
    records = metrics(tmp_path / "run")
    assert result.steps == 3
    assert [r["fully_async/staleness/max"] for r in records] == [0, 1, 1]
    assert [r["fully_async/samples_per_lag/1"] for r in records[1:]] == [16, 16]
    for r in records[1:]:  # behaviour and trainer policies differ, and rollout_is corrects it
        assert r["rollout/logprob_diff_max"] > 1e-3
        assert "rollout_is/mean" in r and r["timing_s/weight_attest"] >= 0


def test_one_step_off_s_defaults_repeat_a_seeded_run_past_a_decoding_chunk(asset_cache, tiny_model_dir,
                                                                          tmp_path):
    """Responses of 72 tokens, past one 64-token chunk: with the defaults (no
    partial rollout) two seeded runs log the same metrics. Partial rollout,
    asked for, decodes in chunks of 16 and still trains (its repeat depends
    on timing, which is why it is off unless set)."""
    quiet = dict(log=lambda *_: None)
    mode = ("async_training.mode=one_step_off", "data.max_response_length=72",
            "trainer.total_training_steps=2", length_reward(tmp_path))
    for name in ("first", "second"):
        train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / name, *mode)), **quiet)
    first, second = metrics(tmp_path / "first"), metrics(tmp_path / "second")
    assert [r["response_length/max"] for r in first] == [72, 72]  # the random tiny model never stops
    for a, b in zip(first, second, strict=True):
        for key in SHARED_METRICS + ("rollout/logprob_diff_mean",):
            assert a[key] == b[key], key
    train(load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "partial", *mode, "async_training.partial_rollout=True",
        "async_training.partial_chunk_tokens=16")), **quiet)
    partial = metrics(tmp_path / "partial")
    assert len(partial) == 2 and all("fully_async/partial/total_partial_num" in r for r in partial)


def test_a_resumed_one_step_off_run_equals_the_straight_one(asset_cache, tiny_model_dir, tmp_path):
    """The checkpoint of step 2 holds batch 3, generated with step 1's weights
    while step 2 trained: the resumed run trains on it, not on a new batch."""
    quiet = dict(log=lambda *_: None)
    mode = ("async_training.mode=one_step_off", "trainer.save_freq=2", length_reward(tmp_path))
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "straight", *mode)),
          **quiet)
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "broken", *mode,
                                                     "trainer.total_training_steps=2")), **quiet)
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "broken", *mode)),
          **quiet)
    straight, resumed = metrics(tmp_path / "straight")[-1], metrics(tmp_path / "broken")[-1]
    assert straight["step"] == resumed["step"] == 3
    assert resumed["fully_async/staleness/max"] == 1
    for key in SHARED_METRICS + ("rollout/logprob_diff_mean",):
        assert resumed[key] == pytest.approx(straight[key], rel=1e-5, abs=1e-7), key


def test_a_resumed_streaming_run_equals_the_straight_one(asset_cache, tiny_model_dir, tmp_path):
    """Streaming rollout: the checkpoint of step 2 holds the rollout process's
    snapshot (responses in flight, batches emitted but not taken, its loader
    and generator); the resumed run goes on exactly as the straight one."""
    quiet = dict(log=lambda *_: None)
    mode = ("async_training.mode=fully_async", "async_training.streaming=True",
            "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1",
            "data.max_response_length=24", "trainer.save_freq=2", length_reward(tmp_path))
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "straight", *mode)),
          **quiet)
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "broken", *mode,
                                                     "trainer.total_training_steps=2")), **quiet)
    train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / "broken", *mode)),
          **quiet)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "broken")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    assert resumed[-1]["fully_async/staleness/max"] >= 1
    for a, b in zip(straight, resumed):
        for key in SHARED_METRICS + ("rollout/logprob_diff_mean", "fully_async/staleness/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)


def test_a_hung_rollout_process_is_named_within_its_deadline(asset_cache, tiny_model_dir, tmp_path):
    cfg = load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "run", "async_training.mode=one_step_off"))
    run = build_run(cfg, log=lambda *_: None)
    run.roles.engine.process.timeout_s = 5  # trainer.ray_wait_timeout_s, after the model loaded
    pid = run.roles.engine.process.process.pid
    try:
        os.kill(pid, signal.SIGSTOP)  # alive, answering nothing
        with pytest.raises(WorkerFailed, match=r"rollout process \(pid \d+\) did not answer generate "
                                               r"within trainer.ray_wait_timeout_s=5"):
            train_run(run, log=lambda *_: None)
    finally:
        os.kill(pid, signal.SIGCONT)
        run.close()
    assert not run.roles.engine.process.process.is_alive()


def test_a_killed_rollout_process_is_named_and_nothing_is_left_behind(asset_cache, tiny_model_dir,
                                                                      tmp_path):
    cfg = load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "run", "async_training.mode=one_step_off"))
    run = build_run(cfg, log=lambda *_: None)
    process = run.roles.engine.process.process
    try:
        os.kill(process.pid, signal.SIGKILL)
        with pytest.raises(WorkerFailed, match=r"rollout process \(pid \d+\) died with exit code -9"):
            train_run(run, log=lambda *_: None)
    finally:
        run.close()
    assert not process.is_alive()


@pytest.mark.parametrize("streaming", [False, True])
def test_saving_and_validating_change_nothing_an_async_run_trains(asset_cache, tiny_model_dir, tmp_path,
                                                                  streaming):
    """A sync every 2 steps and a window of 3 batches: a checkpoint at step 3
    finds the rollout process holding step 2's weights (streaming: kept in
    the checkpoint, attested when restored), one at step 2 the trainer's own
    (applied or not yet); none sends weights. Validation generates on the
    trainer's engine. A run that validates and saves at every step trains
    exactly what a run doing neither trains, and so do runs resumed from
    step 2's and step 3's checkpoints."""
    quiet = dict(log=lambda *_: None)
    mode = ("async_training.mode=fully_async", "async_training.trigger_parameter_sync_step=2",
            "async_training.staleness_threshold=0.5", "trainer.total_training_steps=4",
            "data.max_response_length=24", length_reward(tmp_path),
            *(["async_training.streaming=True"] if streaming else ["async_training.partial_rollout=False"]))
    observed = ("trainer.save_freq=1", "trainer.test_freq=1", "trainer.val_before_train=True")

    def run(name: str, *extra: str) -> None:
        train(load_config(recipe_path("tiny"), overrides(tiny_model_dir, tmp_path / name, *mode, *extra)),
              **quiet)
    run("plain")
    run("observed", *observed)
    saved = {}
    for k in (2, 3):
        run(f"resumed-{k}", *observed, f"trainer.total_training_steps={k}")
        saved[k] = torch.load(tmp_path / f"resumed-{k}" / f"global_step_{k}" / "trainer_state.pt",
                              weights_only=True)["engine_generator"]
        run(f"resumed-{k}", *observed)
    assert [saved[k]["sent_version"] for k in (2, 3)] == [2, 2]
    assert [saved[k]["trainer_version"] for k in (2, 3)] == [2, 3]
    if streaming:  # left out: the trainer's own weights (its checkpoint has them) and the initial ones
        for k, state in saved.items():
            held, pending = state["stream"]["held_weights"], state["stream"]["pending"]
            assert (held is None) == (state["stream"]["version"] in (0, k)), k
            assert all((weights is None) == (v == k) for v, weights in pending.items()), k
    plain = metrics(tmp_path / "plain")
    assert max(r["fully_async/staleness/max"] for r in plain) >= 1
    for name in ("observed", "resumed-2", "resumed-3"):
        records = [r for r in metrics(tmp_path / name) if r["step"] >= 1]
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        assert all(any(k.startswith("val-") for k in r) for r in records)  # validated every step
        for a, b in zip(plain, records):
            for key in SHARED_METRICS + ("rollout/logprob_diff_mean", "fully_async/staleness/mean"):
                assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), (name, a["step"], key)


def test_streaming_at_window_one_corrects_the_tokens_of_the_previous_version(asset_cache, tiny_model_dir,
                                                                            tmp_path):
    """Zero staleness and a sync every step still let responses that were
    decoding when batch m was emitted join a later batch, partly sampled by
    version m - 1: such a batch is trained off-policy (pi_old a trainer
    forward, rollout_is's weights pi_old / pi_behaviour on each token's loss),
    a batch without such tokens on-policy."""
    quiet = dict(log=lambda *_: None)
    train(load_config(recipe_path("tiny"), overrides(
        tiny_model_dir, tmp_path / "run", "async_training.mode=fully_async", "async_training.streaming=True",
        "async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1",
        "data.max_response_length=24", "trainer.total_training_steps=4", length_reward(tmp_path))), **quiet)
    records = metrics(tmp_path / "run")
    behind = [r for r in records if r["fully_async/staleness/max"] >= 1]
    assert behind, [r["fully_async/staleness/max"] for r in records]
    for r in records:
        if r in behind:  # weights pi_old / pi_behaviour, off 1 on the previous version's tokens
            assert "rollout_is/mean" in r
            assert abs(r["rollout_is/max"] - 1) > 1e-3 or abs(r["rollout_is/min"] - 1) > 1e-3
        else:
            assert "rollout_is/mean" not in r
