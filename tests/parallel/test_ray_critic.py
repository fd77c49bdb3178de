"""PPO's critic on the ray backend (2 CPU ranks, gloo, FSDP2) against one process.

Tolerances as in test_ray_backend.py: float32 throughout; the same model in
other batch shapes sums in another order (1e-5).
"""

from __future__ import annotations

import os

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.checkpoint.state import load_checkpoint, save_checkpoint
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.run import Progress
from thinkrl.stages.critic import critic_values, update_critic
from thinkrl.metrics import StageTimer
from thinkrl.stages.update import train_batch

pytestmark = pytest.mark.slow
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only
ray = pytest.importorskip("ray")


def _cfg(model_dir, run_dir, *extra):
    return load_config(recipe_path("ppo"), [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=1", "critic.optim.lr=1e-3",
        "data.max_response_length=12", "data.val_batch_size=100", "trainer.total_training_steps=2",
        "trainer.test_freq=-1", "trainer.progress_bar=False", "trainer.logger=[]",
        "trainer.val_before_train=False", "reward.num_workers=0", *extra])


def test_two_rank_critic_equals_one_process_and_its_shards_resume_on_one(asset_cache, tiny_model_dir,
                                                                        tmp_path):
    local = build_run(_cfg(tiny_model_dir, tmp_path / "local"), log=lambda *_: None)
    sharded = build_run(_cfg(tiny_model_dir, tmp_path / "ray", "trainer.n_gpus_per_node=2"),
                        log=lambda *_: None)
    try:
        assert sharded.roles.critic.group.world_size == 2
        rollouts = local.roles.engine.generate(local.state.train_loader.next_batch(), local.spec.sampling)
        seqs, timer = rollouts.sequences(), StageTimer()
        values_local = critic_values(local.roles.critic, rollouts, seqs, timer)
        values_ray = critic_values(sharded.roles.critic, rollouts, seqs, timer)
        torch.testing.assert_close(values_ray, values_local, rtol=0, atol=1e-5)

        rewards = torch.zeros_like(values_local)
        rewards[:, 0] = torch.arange(len(rollouts)) % 2  # something to regress on
        batch = train_batch(rollouts, seqs, advantages=torch.zeros_like(values_local),
                            old_logprobs=None, ref_logprobs=None, off_policy=False, kl_loss=False)
        returns = local.spec.advantage_fn(rewards, rollouts.response_mask.float(), rollouts.group_ids,
                                     values=values_local).returns
        m_local = update_critic(local.roles.critic, batch, returns=returns, values=values_local, timer=timer)
        m_ray = update_critic(sharded.roles.critic, batch, returns=returns, values=values_local, timer=timer)
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
                    "critic/lr", "critic/vf_explained_var"):
            assert m_ray[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-7), key
        after_local = critic_values(local.roles.critic, rollouts, seqs, timer)
        torch.testing.assert_close(critic_values(sharded.roles.critic, rollouts, seqs, timer), after_local,
                                   rtol=0, atol=1e-5)

        # the critic's shards in a checkpoint (DCP), loaded by one process (resharded)
        folder = save_checkpoint(sharded, Progress(step=1), log=lambda *_: None)
        assert (folder / "critic_dcp" / ".metadata").is_file()
        fresh = build_run(_cfg(tiny_model_dir, tmp_path / "fresh"), log=lambda *_: None)
        try:
            load_checkpoint(fresh, folder, log=lambda *_: None)
            torch.testing.assert_close(critic_values(fresh.roles.critic, rollouts, seqs, timer), after_local,
                                       rtol=0, atol=1e-5)
            optimizer = fresh.roles.critic.group.rank.critic.learner.optimizer
            assert optimizer.state_dict()["state"][0]["step"].item() == 2  # two mini-batches
        finally:
            fresh.close()
    finally:
        local.close()
        sharded.close()


def test_a_two_rank_ppo_run_trains_and_saves_its_critic(asset_cache, tiny_model_dir, tmp_path):
    import json

    from thinkrl.trainer import train
    result = train(_cfg(tiny_model_dir, tmp_path / "run", "trainer.n_gpus_per_node=2", "trainer.save_freq=2"),
                   log=lambda *_: None)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and result.steps == 2
    for record in records:
        assert record["critic/grad_norm"] == record["critic/grad_norm"] and "actor/pg_loss" in record
        assert "critic/vf_explained_var" in record and "critic/values/mean" in record
    state = torch.load(tmp_path / "run" / "global_step_2" / "trainer_state.pt", weights_only=True)
    assert state["critic"]["scheduler"]["last_epoch"] == 2  # one schedule step per training step
    assert (tmp_path / "run" / "global_step_2" / "critic_dcp" / ".metadata").is_file()
