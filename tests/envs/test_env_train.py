"""Environments end to end through `thinkrl train` on the tiny model: one
batch mixes reasoning-gym tasks (the package's scorer, no reward file), a
textarena game (the game scores) and a verl interaction file with rows that
name it, in data.mixture's proportions; metrics per task and environment
reach metrics.jsonl and validation reports per task; a seeded run repeats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")

from thinkrl.cli import main  # noqa: E402
from thinkrl.data.prep import write_splits  # noqa: E402
from thinkrl.data.prep import reasoning_gym as gym  # noqa: E402
from thinkrl.data.prep import textarena as arena  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


def mixed_data(folder: Path) -> Path:
    rows = gym.generate(gym.GymRequest(tasks=("chain_sum", "spell_backward"), size=8, test_size=2, seed=1,
                                       config={"chain_sum": {"min_terms": 2, "max_terms": 2, "max_digits": 1}}))
    games = arena.generate(("GuessTheNumber-v0",), size=8, test_size=2, seed=1)
    users = [{"data_source": "openai/gsm8k", "ability": "math",
              "prompt": [{"role": "user", "content": f"What is {a} + {a}? Write the answer after ####."}],
              "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
              "extra_info": {"index": a, "interaction_kwargs": {"name": "sums", "ground_truth": str(2 * a)}}}
             for a in range(1, 11)]
    for split, count in (("train", 8), ("test", 2)):
        rows[split] += games[split] + users[:count] if split == "train" else games[split] + users[8:]
    write_splits(rows, output=folder, overwrite=True)
    (folder / "interaction.yaml").write_text(
        "interaction:\n  - name: sums\n    class_name: verl_style_interaction.SumsInteraction\n    config: {}\n")
    return folder


def argv(model_dir: Path, data: Path, run_dir: Path) -> list[str]:
    mt = "actor_rollout_ref.rollout.multi_turn"
    return ["train", "--config", "tiny", "--skip-doctor", f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={data / 'train.parquet'}", f"data.val_files={data / 'test.parquet'}",
            f"trainer.default_local_dir={run_dir}", "data.train_batch_size=8", "data.max_prompt_length=416",
            "data.max_response_length=64", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            f"{mt}.interaction_config_path={data / 'interaction.yaml'}", f"{mt}.max_user_turns=2",
            "+data.mixture.reasoning_gym/*=2", "+data.mixture.textarena/GuessTheNumber-v0=1",
            "+data.mixture.openai/gsm8k=1", "trainer.total_training_steps=2", "trainer.test_freq=2",
            "trainer.val_before_train=False", "trainer.progress_bar=False", "trainer.logger=[]"]


def records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def test_a_mixed_batch_of_tasks_games_and_simulated_users_trains(asset_cache, tiny_model_dir, tmp_path):
    data = mixed_data(tmp_path / "data")
    assert main(argv(tiny_model_dir, data, tmp_path / "a")) == 0
    got = records(tmp_path / "a")
    step = got[0]
    # data.mixture: reasoning_gym/* 2 (two tasks share it), the game 1, the users 1, of 8 prompts
    assert step["task/textarena/GuessTheNumber-v0/share"] == 0.25 == step["task/openai/gsm8k/share"]
    assert step["task/reasoning_gym/chain_sum/share"] + step["task/reasoning_gym/spell_backward/share"] == 0.5
    assert step["env/single_turn_agent/share"] == 0.5 and step["env/textarena/share"] == 0.25
    assert step["env/sums/turns/mean"] > 2  # the simulated user answered back
    assert step["env/textarena/errors"] == 0 and "env/textarena/reward/mean" in step
    assert step["num_turns/mean"] > 2 and step["multi_turn/env_token_ratio"] > 0
    last = got[-1]
    for source in ("reasoning_gym/chain_sum", "textarena/GuessTheNumber-v0", "openai/gsm8k"):
        assert f"val-core/{source}/acc/mean@1" in last  # validation per task
    assert main(argv(tiny_model_dir, data, tmp_path / "b")) == 0
    assert records(tmp_path / "b") == got  # a seeded run repeats
