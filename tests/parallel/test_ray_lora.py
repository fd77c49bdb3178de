"""LoRA on the ray backend: 2 Ray workers (gloo, FSDP2 shards of the base and
the adapters) against one process, on the pretrained test model (responses
end at EOS after different numbers of tokens, so the ranks decode unevenly).
Tolerances as in test_ray_backend.py. Every wait has a 120 s deadline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.cli import recipe_path
from thinkrl.config import load_config

from train_batches import random_advantage_batch

pytestmark = pytest.mark.slow
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only
ray = pytest.importorskip("ray")
pytest.importorskip("peft")


def _cfg(model_dir: Path, run_dir: Path, *extra: str):
    return load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        "trainer.device=cpu", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "data.max_response_length=48",
        "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
        "data.val_batch_size=100", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]", "trainer.val_before_train=False",
        "reward.num_workers=0", "trainer.ray_wait_timeout_s=120", *extra])


def test_two_ranks_train_the_adapter_as_one_process_does(asset_cache, tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from thinkrl.checkpoint.state import save_checkpoint
    from thinkrl.run import Progress

    local = build_run(_cfg(tiny_model_dir, tmp_path / "local"), log=lambda *_: None)
    # The ranks take the lean shared-prompt pass (LoRA kept factored on shards), one process the padded one.
    sharded = build_run(_cfg(tiny_model_dir, tmp_path / "ray", "trainer.n_gpus_per_node=2",
                             "actor_rollout_ref.model.use_remove_padding=True"), log=lambda *_: None)
    try:
        shards = sharded.roles.actor.group.call_all("test", "sharding")
        assert all(s["local"] < s["total"] for s in shards)  # base and adapters split 2 ways
        # the same initial adapter on both (rank 0's, broadcast)
        assert local.roles.actor.full_weights().keys() == sharded.roles.actor.full_weights().keys()

        rollouts = local.roles.engine.generate(local.state.train_loader.next_batch(), local.spec.sampling)
        lengths = rollouts.response_mask.sum(-1)
        assert lengths.min() < lengths.max()  # uneven: ranks stop decoding at different steps
        seqs, r = rollouts.sequences(), rollouts.response_ids.shape[1]
        real = rollouts.response_mask.bool()  # the shared-prompt pass leaves padding columns 0
        old_local = local.roles.actor.compute_log_prob(*seqs, response_length=r)
        torch.testing.assert_close(sharded.roles.actor.compute_log_prob(*seqs, response_length=r)[real],
                                   old_local[real], rtol=0, atol=1e-5)
        batch = random_advantage_batch(rollouts, old_local)
        m_local = local.roles.actor.update_policy(batch)
        m_ray = sharded.roles.actor.update_policy(batch)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/lr"):
            assert m_ray[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-7), key
        # the reference (adapter off) is still the base on both
        ref_local = local.roles.reference.compute_ref_log_prob(*seqs, response_length=r)
        torch.testing.assert_close(sharded.roles.reference.compute_ref_log_prob(*seqs, response_length=r)[real],
                                   ref_local[real], rtol=0, atol=1e-5)
        torch.testing.assert_close(ref_local, old_local, rtol=0, atol=1e-6)
        # merged weights (what an engine is sent) agree
        after_local, after_ray = local.roles.actor.full_weights(), sharded.roles.actor.full_weights()
        assert not any("lora_" in name or "base_layer" in name for name in after_ray)
        for name, tensor in after_local.items():
            torch.testing.assert_close(after_ray[name], tensor, rtol=0, atol=1e-5, msg=name)

        local_dir = save_checkpoint(local, Progress(step=1), log=lambda *_: None)
        ray_dir = save_checkpoint(sharded, Progress(step=1), log=lambda *_: None)
        assert (ray_dir / "actor_dcp" / ".metadata").is_file()
        ours, theirs = (load_file(d / "actor" / "adapter_model.safetensors") for d in (local_dir, ray_dir))
        assert ours.keys() == theirs.keys()
        for name in ours:
            torch.testing.assert_close(theirs[name], ours[name], rtol=0, atol=1e-5, msg=name)

        # the sharded engine decodes unevenly ending rows on both ranks (a hang fails at 120 s)
        generated = sharded.roles.engine.generate(sharded.state.train_loader.next_batch(),
                                                  sharded.spec.sampling)
        assert len(generated) == 16
        # resume: another update moves both, then each loads the other layout's checkpoint
        local.roles.actor.update_policy(batch)
        sharded.roles.actor.update_policy(batch)
        second = local.roles.actor.full_weights()
        local.roles.actor.load(ray_dir)  # the 2-rank shards (DCP) on one process
        sharded.roles.actor.load(local_dir)  # one process's adapter folder on 2 ranks
        for name, tensor in after_local.items():
            torch.testing.assert_close(local.roles.actor.full_weights()[name], after_ray[name],
                                       rtol=0, atol=1e-5, msg=name)
            torch.testing.assert_close(sharded.roles.actor.full_weights()[name], tensor,
                                       rtol=0, atol=1e-5, msg=name)
        # AdamW's state came back too: the next update repeats the second one
        for run in (local, sharded):
            run.roles.actor.update_policy(batch)
            repeated = run.roles.actor.full_weights()
            for name, tensor in second.items():
                torch.testing.assert_close(repeated[name], tensor, rtol=0, atol=1e-5, msg=name)
    finally:
        local.close()
        sharded.close()
