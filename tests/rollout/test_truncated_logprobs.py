"""Truncated sampling (top_p, top_k, min_p): both engines report the
trainer's distribution, softmax(logits / T) over the whole vocabulary, so the
engine gap stays at float tolerance and rollout_is's ratio at 1 on-policy;
where vLLM cannot (truncation at T != 1) the run is refused where the
log-probs enter the update, unless the bias is accepted."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.config.checks import validate
from thinkrl.rollout.vllm_engine import logprobs_mode

ARR = "actor_rollout_ref"


@pytest.mark.parametrize("top_p, top_k, min_p, temperature, mode", [
    (1.0, -1, 0.0, 0.7, "processed_logprobs"),  # no truncation: after temperature
    (0.7, 20, 0.0, 1.0, "raw_logprobs"),         # truncation at T = 1: before any processing
    (1.0, -1, 0.05, 1.0, "raw_logprobs"),
    (0.7, -1, 0.0, 0.7, "processed_logprobs"),   # refused or accepted by the config check
])
def test_vllm_is_asked_for_the_trainers_distribution(top_p, top_k, min_p, temperature, mode):
    rollout = SimpleNamespace(top_p=top_p, top_k=top_k, min_p=min_p, temperature=temperature)
    assert logprobs_mode(rollout) == mode


def test_truncation_at_another_temperature_is_refused_where_vllms_logprobs_enter_the_update():
    base = [f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.top_p=0.7", f"{ARR}.rollout.temperature=0.8"]
    with pytest.raises(ValueError, match=r"off by log\(kept mass\).*accept_truncated_logprobs=True"):
        validate(load_config("tiny", [*base, "algorithm.rollout_is=True"]))
    with pytest.raises(ValueError, match="use_rollout_log_probs=True puts their ratio"):
        validate(load_config("tiny", [*base, f"{ARR}.actor.use_rollout_log_probs=True"]))
    validate(load_config("tiny", [*base, "algorithm.rollout_is=True", f"{ARR}.rollout.accept_truncated_logprobs=True"]))
    validate(load_config("tiny", [*base[:2], "algorithm.rollout_is=True"]))  # temperature 1
    validate(load_config("tiny", base))  # only the gap metrics see them


@pytest.mark.slow
def test_native_truncated_sampling_keeps_the_gap_at_float_tolerance(asset_cache, tiny_model_dir, tmp_path,
                                                                    monkeypatch):
    import thinkrl.trainer
    from thinkrl.trainer import train

    batches = []
    real_update = thinkrl.trainer.update_actor

    def update(actor, engine, batch, **kwargs):  # what reaches the actor
        batches.append(batch)
        return real_update(actor, engine, batch, **kwargs)
    monkeypatch.setattr(thinkrl.trainer, "update_actor", update)

    run_dir = tmp_path / "run"
    train(load_config(recipe_path("tiny"), [
        f"{ARR}.model.path={tiny_model_dir}", f"trainer.default_local_dir={run_dir}",
        f"{ARR}.rollout.top_p=0.7", f"{ARR}.rollout.top_k=20", f"{ARR}.rollout.temperature=0.9",
        "algorithm.rollout_is=True", "data.train_batch_size=4", f"{ARR}.rollout.n=4",
        f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16",
        "data.max_response_length=16", "trainer.total_training_steps=2",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]"]), log=lambda *_: None)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert len(records) == 2
    for batch in batches:  # rollout_is's weights ride with the batch into every loss
        assert batch.rollout_is_weights is not None and batch.rollout_is_weights.shape == batch.advantages.shape
    for r in records:
        assert r["rollout/logprob_diff_max"] < 1e-4
        assert abs(r["rollout_is/mean"] - 1) < 1e-4 and abs(r["rollout_is/max"] - 1) < 1e-3
