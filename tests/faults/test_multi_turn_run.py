"""Multi-turn training end to end: the calculator task with the tool loop,
through the command line, on the local and the ray backend; a seeded run
repeats itself, and a kill -9 after a checkpoint resumes to the same metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from fault_helpers import spawn

from thinkrl.cli import main

pytestmark = pytest.mark.slow
STEPS = 3


def argv(model_dir: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "--config", "calculator", "--skip-doctor", f"actor_rollout_ref.model.path={model_dir}",
            f"trainer.default_local_dir={run_dir}", "data.train_batch_size=4",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "data.max_response_length=64",
            "actor_rollout_ref.rollout.temperature=0.7", "actor_rollout_ref.actor.optim.lr=1e-3",
            f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=False",
            "trainer.test_freq=-1", "trainer.progress_bar=False", "trainer.logger=[]", *extra]


def records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def test_seeded_multi_turn_run_repeats_and_resumes_exactly_after_kill_9(asset_cache, calc_model_dir, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(argv(calc_model_dir, first)) == 0
    assert main(argv(calc_model_dir, second)) == 0
    got = records(first)
    assert got == records(second)
    assert all(r["num_turns/mean"] > 2.5 and r["multi_turn/tool_calls/mean"] > 0.5 for r in got), got
    assert any(r["multi_turn/tool_token_ratio"] > 0 for r in got)

    broken = tmp_path / "broken"
    command = argv(calc_model_dir, broken, "trainer.save_freq=1")[:]
    process = spawn(command, output=tmp_path / "broken-log")
    deadline = time.monotonic() + 300
    while not (broken / "global_step_1" / "meta.json").exists() and time.monotonic() < deadline:
        assert process.poll() is None, Path(f"{tmp_path / 'broken-log'}.err").read_text()[-3000:]
        time.sleep(0.2)
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=60)
    resumed = spawn(command, output=tmp_path / "resumed-log")
    try:
        assert resumed.wait(timeout=600) == 0, Path(f"{tmp_path / 'resumed-log'}.err").read_text()[-3000:]
    except subprocess.TimeoutExpired:
        resumed.kill()
        raise
    for a, b in zip(got, records(broken)):
        assert b == pytest.approx(a, rel=1e-5, abs=1e-7), a["step"]
    assert [r["step"] for r in records(broken)] == list(range(1, STEPS + 1))


def test_two_ray_ranks_run_the_tool_loop(asset_cache, calc_model_dir, tmp_path):
    """Ranks whose responses take different numbers of turns and lengths never wait on each other."""
    pytest.importorskip("ray")
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    run_dir = tmp_path / "ray"
    assert main(argv(calc_model_dir, run_dir, "trainer.n_gpus_per_node=2", "trainer.backend=ray",
                     "trainer.total_training_steps=2", "reward.num_workers=0")) == 0
    got = records(run_dir)
    assert len(got) == 2 and all(r["multi_turn/tool_calls/mean"] > 0.5 for r in got)
