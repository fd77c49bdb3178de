"""The ray backend on CPU: 2 Ray workers (gloo, FSDP2) against the local backend.

Tolerances: float32 throughout. Log-probs of the same tokens agree to 1e-5
(the same model in other batch shapes sums in another order); the update's
loss metrics to 1e-5 relative and the weights after one AdamW step to 1e-5
absolute (AdamW's first step moves each weight by ~lr whatever the gradient's
size, so 1e-5 at lr 1e-3 would still show a wrong sign or a missing term).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

from thinkrl.build import build_run
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

from train_batches import random_advantage_batch

pytestmark = pytest.mark.slow
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only
ray = pytest.importorskip("ray")


def _overrides(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        "trainer.device=cpu", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "data.max_response_length=12",
        "data.val_batch_size=100", "trainer.total_training_steps=2", "trainer.test_freq=-1",
        "trainer.progress_bar=False", "trainer.logger=[]", "trainer.val_before_train=False",
        "reward.num_workers=0", *extra]


def _cfg(model_dir, run_dir, *extra):
    return load_config(recipe_path("tiny"), _overrides(model_dir, run_dir, *extra))


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    # validation runs at each run's last step, so the interrupted run has one more
    return [{k: v for k, v in json.loads(line).items()
             if not k.startswith(("timing_s/", "perf/", "val-"))} for line in lines]


def test_two_ranks_update_equals_one_process(asset_cache, tiny_model_dir, tmp_path):
    local = build_run(_cfg(tiny_model_dir, tmp_path / "local"), log=lambda *_: None)
    sharded = build_run(_cfg(tiny_model_dir, tmp_path / "ray", "trainer.n_gpus_per_node=2"),
                        log=lambda *_: None)
    try:
        assert sharded.spec.sizes.world_size == 2 and sharded.roles.actor.group.world_size == 2
        shards = sharded.roles.actor.group.call_all("test", "sharding")
        assert all(s["local"] < s["total"] for s in shards)  # DTensors split 2 ways
        assert sum(s["local"] for s in shards) == shards[0]["total"]

        rollouts = local.roles.engine.generate(local.state.train_loader.next_batch(), local.spec.sampling)
        seqs = rollouts.sequences()
        r = rollouts.response_ids.shape[1]
        old_local = local.roles.actor.compute_log_prob(*seqs, response_length=r)
        old_ray = sharded.roles.actor.compute_log_prob(*seqs, response_length=r)
        torch.testing.assert_close(old_ray, old_local, rtol=0, atol=1e-5)
        ref_ray = sharded.roles.reference.compute_ref_log_prob(*seqs, response_length=r)
        torch.testing.assert_close(ref_ray, old_local, rtol=0, atol=1e-5)  # no update yet

        batch = random_advantage_batch(rollouts, old_local)
        m_local = local.roles.actor.update_policy(batch)
        m_ray = sharded.roles.actor.update_policy(batch)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                    "actor/pg_clipfrac", "actor/lr"):
            assert m_ray[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-7), key
        after = sharded.roles.actor.full_weights()
        for name, tensor in local.roles.actor.group.rank.actor.model.state_dict().items():
            torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-5, msg=name)

        # a sharded checkpoint, exported as one Hugging Face folder without a process group
        from safetensors.torch import load_file

        from thinkrl.checkpoint.export import export_checkpoint
        from thinkrl.checkpoint.state import save_checkpoint
        from thinkrl.run import Progress
        folder = save_checkpoint(sharded, Progress(step=1), log=lambda *_: None)
        assert sorted(p.name for p in (folder / "actor_dcp").iterdir()) == [
            ".metadata", "__0_0.distcp", "__1_0.distcp"]
        exported = load_file(export_checkpoint(folder, tmp_path / "hf", log=lambda *_: None)
                             / "model.safetensors")
        for name, tensor in exported.items():
            assert torch.equal(tensor, after[name]), name
    finally:
        local.close()
        sharded.close()


def test_ranks_whose_responses_end_at_different_steps_train_and_validate(
        asset_cache, tiny_model_dir, tmp_path):
    """The pretrained test model stops at EOS after 2 to 48 tokens, so one
    rank's rollout ends while the other still decodes (the run used to hang
    there, in an FSDP2 all-gather). Token budgets (use_dynamic_bsz) then give
    the ranks different micro-batch counts; the update must still equal the
    fixed cut on one process (the padded forward there, the shared-prompt pass
    on the ranks). Every wait has a 120 s deadline: a hang fails."""
    from thinkrl.trainer import train_run
    from thinkrl.models.micro_batches import micro_batch_rows
    from thinkrl.workers.mini_batches import plan_mini_batches
    from thinkrl.workers.handles import row_shares

    budget = ("actor_rollout_ref.actor.use_dynamic_bsz=True",
              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=160",
              "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=160",
              "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
              "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=160")
    sizes = ("data.max_response_length=48", "data.train_batch_size=2",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.ray_wait_timeout_s=120")
    local = build_run(_cfg(tiny_model_dir, tmp_path / "local", *sizes), log=lambda *_: None)
    # The sharded run also takes the shared-prompt pass (use_remove_padding) in
    # every forward: against the padded one on one process below.
    sharded = build_run(_cfg(tiny_model_dir, tmp_path / "ray", *sizes, *budget,
                             "actor_rollout_ref.model.use_remove_padding=True",
                             "trainer.n_gpus_per_node=2", "trainer.test_freq=1",
                             "trainer.val_before_train=True", "data.val_batch_size=16"),
                        log=lambda *_: None)
    try:
        group = sharded.roles.actor.group
        widths, one = [], dataclasses.replace(sharded.spec.sampling, n=1)
        while len(widths) < 8 and not any(a != b for a, b in widths):
            prompts = sharded.state.train_loader.next_batch()  # per rank: the tokens its engine decoded
            parts = group.call_all("gen", "generate", [(prompts.select(share), one)
                                                       for share in row_shares_of(prompts)])
            widths.append([part.response_ids.shape[1] for part in parts])
        assert any(a != b for a, b in widths), widths  # the ranks stopped at different steps

        # Deliberately uneven lengths, the same on every machine: 3 responses
        # of 48 tokens, 5 of 1 (sampled tokens, masks chosen here).
        rollouts = local.roles.engine.generate(local.state.train_loader.next_batch(),
                                         dataclasses.replace(local.spec.sampling, ignore_eos=True))
        r = rollouts.response_ids.shape[1]
        lengths = torch.tensor([r, 1, 1, r, 1, r, 1, 1])[:, None]
        rollouts.response_mask = (torch.arange(r)[None, :] < lengths).long()
        seqs = rollouts.sequences()
        old = local.roles.actor.compute_log_prob(*seqs, response_length=r)
        real = rollouts.response_mask.bool()  # the shared-prompt pass leaves padding columns 0
        torch.testing.assert_close(sharded.roles.actor.compute_log_prob(*seqs, response_length=r)[real],
                                   old[real], rtol=0, atol=1e-5)
        batch = random_advantage_batch(rollouts, old)
        [mini] = plan_mini_batches(batch, mini_batch_size=8, epochs=1, shuffle=False,
                                   generator=None, response_length=48)
        counts = [len(micro_batch_rows(mini.batch.attention_mask[rows].sum(-1), micro_batch_size=8,
                                       max_tokens=160))
                  for rows in row_shares(group, mini.batch.attention_mask)]
        assert counts[0] != counts[1], counts  # one rank runs idle passes
        m_local = local.roles.actor.update_policy(batch)  # fixed cut, one process
        m_ray = sharded.roles.actor.update_policy(batch)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy"):
            assert m_ray[key] == pytest.approx(m_local[key], rel=1e-5, abs=1e-7), key
        # AdamW's first step moves a weight by lr * g / (|g| + eps): for the few
        # gradients near eps the two passes' float32 summation orders show (seen:
        # 1 weight of 8192 off by 1.6e-5 at lr 1e-3); a wrong sign would be 2e-3.
        after = sharded.roles.actor.full_weights()
        for name, tensor in local.roles.actor.group.rank.actor.model.state_dict().items():
            torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-4, msg=name)

        result = train_run(sharded, log=lambda *_: None)  # 2 steps, validated before and after each
        assert result.steps == 2
        assert [r["step"] for r in _records(tmp_path / "ray")] == [0, 1, 2]
    finally:
        local.close()
        sharded.close()


def row_shares_of(prompts) -> list[torch.Tensor]:
    """The engine handle's cut of a prompt batch: consecutive prompts per rank."""
    from thinkrl.workers.mini_batches import contiguous_shares
    return contiguous_shares(len(prompts), 2)


def test_a_rank_s_setup_error_reaches_the_user_whole(asset_cache, tiny_model_dir, tmp_path):
    from thinkrl.errors import SetupError

    # 500 + 96 prompt tokens exceed the tiny model's 512 positions: found by each rank's loader
    with pytest.raises(SetupError) as err:
        build_run(_cfg(tiny_model_dir, tmp_path / "run", "trainer.n_gpus_per_node=2",
                       "data.max_response_length=500"), log=lambda *_: None)
    assert "max_position_embeddings 512" in err.value.problem and err.value.fix == "lower one of them"
    assert not ray.is_initialized()  # the cluster this run started is gone


def test_two_rank_run_resumes_exactly_on_two_and_on_one(asset_cache, tiny_model_dir, tmp_path):
    ray_args = ("trainer.n_gpus_per_node=2", "trainer.save_freq=2")
    train(_cfg(tiny_model_dir, tmp_path / "straight", *ray_args,
               "trainer.total_training_steps=4"), log=lambda *_: None)
    train(_cfg(tiny_model_dir, tmp_path / "broken", *ray_args), log=lambda *_: None)
    assert (tmp_path / "broken" / "global_step_2" / "actor_dcp" / ".metadata").is_file()
    train(_cfg(tiny_model_dir, tmp_path / "broken", *ray_args, "trainer.total_training_steps=4"),
          log=lambda *_: None)
    straight, resumed = _records(tmp_path / "straight"), _records(tmp_path / "broken")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["step"], key)
    # the same sharded checkpoint on one process (DCP reshards): it trains on
    one = _cfg(tiny_model_dir, tmp_path / "one", "trainer.resume_mode=resume_path",
               f"trainer.resume_from_path={tmp_path / 'broken' / 'global_step_2'}",
               "trainer.total_training_steps=3")
    train(one, log=lambda *_: None)
    [third] = _records(tmp_path / "one")
    assert third["step"] == 3 and third["training/epoch"] == straight[2]["training/epoch"]
    assert third["critic/score/mean"] >= 0


def test_two_simulated_nodes_run_two_steps(asset_cache, tiny_model_dir, tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    try:
        from thinkrl.parallel import ray_cluster
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1")
        assert ray_cluster.on_loopback()  # joined, not started: its ranks get the loopback env too
        result = train(_cfg(tiny_model_dir, tmp_path / "run", "trainer.nnodes=2",
                            "trainer.n_gpus_per_node=1", f"trainer.ray_address={cluster.address}"),
                       log=lambda *_: None)
        assert result.steps == 2
        assert [r["step"] for r in _records(tmp_path / "run")] == [1, 2]
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_a_killed_rank_stops_the_run_and_the_checkpoint_loads(asset_cache, tiny_model_dir,
                                                              tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    args = _overrides(tiny_model_dir, run_dir, "trainer.n_gpus_per_node=2", "trainer.save_freq=1",
                      "trainer.total_training_steps=500", "trainer.logger=[console]")
    proc = subprocess.Popen([sys.executable, "-m", "thinkrl", "train", "--config", "tiny",
                             "--skip-doctor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "THINKRL_CACHE": str(asset_cache)})
    try:
        deadline = time.monotonic() + 240
        while not (run_dir / "global_step_1" / "meta.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.5)
        log = (run_dir / "logs" / "rank_1.log").read_text()
        pid = int(log.split(" pid ")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        assert time.monotonic() - killed < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "rank 1" in out and "died during" in out, out[-3000:]
    # the worker's own message, whole, and how to go on (before: "a bug in thinkrl", cut short)
    assert "thinkrl: a worker failed" in out and "bug in thinkrl" not in out, out[-3000:]
    assert "trainer.resume_mode=auto" in out, out[-3000:]
    # the last complete checkpoint resumes (here on one process)
    done = sorted(int(p.name.split("_")[-1]) for p in run_dir.glob("global_step_*")
                  if (p / "meta.json").is_file())
    resumed = build_run(_cfg(tiny_model_dir, run_dir, f"trainer.total_training_steps={done[-1] + 1}"),
                        log=lambda *_: None)
    try:
        assert resumed.state.progress.step == done[-1]
    finally:
        resumed.close()


@pytest.mark.skipif(not (Path(__file__).resolve().parents[2].parent / "shared" / "seeds").is_dir(),
                    reason="../shared is absent")
def test_seed_004_launch_line_runs_one_step(asset_cache, tiny_model_dir, tmp_path):
    from thinkrl.cli import main

    shared = Path(__file__).resolve().parents[2].parent / "shared"
    text = (shared / "seeds" / "004_8fc991b6c2ee6527.txt").read_text()
    command = text[text.index("python3 -m verl.trainer.main_ppo"):].split("$@")[0]
    keys = [part for part in command.replace("\\\n", " ").split()[3:] if "=" in part]
    data = tmp_path / "gsm8k"
    assert main(["prep", "gsm8k", "--input", str(shared / "data" / "gsm8k"),
                 "--output", str(data)]) == 0
    ours = {  # paths to local files, a tiny model on 2 CPU ranks, small sizes; nothing else
        "data.train_files": str(data / "train.parquet"), "data.val_files": str(data / "test.parquet"),
        "actor_rollout_ref.model.path": str(tiny_model_dir),
        "actor_rollout_ref.rollout.name": "native", "trainer.device": "cpu",
        "trainer.n_gpus_per_node": "2", "data.train_batch_size": "4",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "data.max_prompt_length": "200",
        "data.max_response_length": "8"}
    line = [k if k.split("=")[0].lstrip("+") not in ours else None for k in keys]
    kept = [k.replace("'", "") for k in line if k is not None]
    assert len(kept) == len(keys) - len(ours)  # every other key as written
    overrides = [*kept, *(f"{k}={v}" for k, v in ours.items()),
                 "trainer.total_training_steps=1", "trainer.val_before_train=False",
                 f"trainer.default_local_dir={tmp_path / 'run'}"]
    assert main(["train", "--skip-doctor", *overrides]) == 0
    [record] = _records(tmp_path / "run")
    assert record["step"] == 1 and "actor/kl_loss" in record


def test_a_weights_only_sharded_save_exports_the_same_weights(asset_cache, tiny_model_dir, tmp_path):
    # save_contents=[model] on 2 ranks: the shards of the weights alone (no AdamW
    # state in actor_dcp/), gathered by export into what a full save gives.
    from safetensors.torch import load_file

    from thinkrl.cli import main

    folders = {}
    for name, extra in (("full", ()), ("weights", ("actor_rollout_ref.actor.checkpoint.save_contents=[model]",))):
        train(_cfg(tiny_model_dir, tmp_path / name, "trainer.n_gpus_per_node=2", "trainer.save_freq=1",
                   "trainer.total_training_steps=1", *extra), log=lambda *_: None)
        folders[name] = tmp_path / name / "global_step_1"
        assert main(["export", str(folders[name]), "--out", str(tmp_path / f"{name}-hf")]) == 0
    assert json.loads((folders["weights"] / "meta.json").read_text())["contents"] == ["model"]
    sizes = {name: sum(p.stat().st_size for p in (folder / "actor_dcp").rglob("*") if p.is_file())
             for name, folder in folders.items()}
    assert sizes["weights"] < 0.5 * sizes["full"]  # AdamW's two moments are not there
    full, weights = (load_file(tmp_path / f"{name}-hf" / "model.safetensors") for name in ("full", "weights"))
    assert full.keys() == weights.keys()
    for key in full:
        assert torch.equal(full[key], weights[key]), key
