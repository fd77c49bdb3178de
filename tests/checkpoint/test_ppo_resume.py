"""PPO with a critic in checkpoints: a run stopped at step 2 and resumed to step 4
equals an unbroken 4-step run, metric for metric, critic metrics included.

The critic is trained on two shuffled mini-batches per step, so its weights,
AdamW state, LR schedule and shuffle generator all shape the next steps'
values, advantages and policy updates; a cosine schedule makes the position
of the schedule matter too. trainer.critic_warmup=2: step 1 trains only the
critic, steps 2-4 both.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from thinkrl.checkpoint.verify import DamagedCheckpoint, verify_checkpoint
from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
STEPS = 4


def _config(model_dir: Path, run_dir: Path):
    return load_config(recipe_path("ppo"), [
        f"actor_rollout_ref.model.path={model_dir}", f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "critic.ppo_mini_batch_size=2", "critic.shuffle=True", "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.warmup_style=cosine", "critic.optim.lr=1e-3", "trainer.critic_warmup=2",
        "data.max_response_length=12", "data.val_batch_size=100", "trainer.val_before_train=False",
        f"trainer.total_training_steps={STEPS}", "trainer.test_freq=-1", "trainer.save_freq=1",
        "trainer.progress_bar=False", "trainer.logger=[]", "reward.num_workers=0"])


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing_s/", "perf/"))}
            for line in lines]


@pytest.fixture(scope="module")
def straight(asset_cache, tiny_model_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("ppo-straight") / "run"
    train(_config(tiny_model_dir, run_dir), log=lambda *_: None)
    return run_dir


def test_the_checkpoint_holds_the_critic_and_verifies_it(straight, tmp_path):
    step2 = straight / "global_step_2"
    assert (step2 / "critic" / "model.safetensors").is_file() and (step2 / "critic_optimizer.pt").is_file()
    listed = json.loads((step2 / "meta.json").read_text())["files"]
    assert "critic/model.safetensors" in listed and "critic_optimizer.pt" in listed
    assert verify_checkpoint(step2)
    damaged = tmp_path / "global_step_2"
    shutil.copytree(step2, damaged)
    with (damaged / "critic_optimizer.pt").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00" * 8)
    with pytest.raises(DamagedCheckpoint, match="critic_optimizer.pt does not match"):
        verify_checkpoint(damaged)


def test_warmup_trains_only_the_critic_first(straight):
    records = _records(straight)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert "actor/pg_loss" not in records[0] and "critic/vf_loss" in records[0]
    assert all("actor/pg_loss" in r and "critic/vf_loss" in r for r in records[1:])
    assert records[0]["critic/lr"] == 1e-3 > records[3]["critic/lr"]  # cosine decay


def test_stop_at_2_and_resume_to_4_equals_the_unbroken_run(straight, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copytree(straight / "global_step_2", run_dir / "global_step_2")
    shutil.copy(straight / "metrics.jsonl", run_dir / "metrics.jsonl")  # the resume drops steps 3-4
    messages: list[str] = []
    train(_config(tiny_model_dir, run_dir), log=messages.append)
    assert any("resuming from" in m for m in messages)
    assert not any("config differs" in m for m in messages)
    assert _records(run_dir) == _records(straight)
