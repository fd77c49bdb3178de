"""The tool loop with vLLM as the engine (CPU build): two GRPO steps of the
calculator task in which the model calls the calculator; the trainer's
forward over every multi-turn response gives the log-probs vLLM sampled with
(`rollout/logprob_diff_max`, over sampled tokens only), so the response the
trainer reads is token for token the one vLLM generated."""

import json

import pytest
import torch

vllm = pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vllm_engine import LOGPROB_TOLERANCE  # noqa: E402


@pytest.fixture(scope="module")
def calc_vllm_model(tmp_path_factory):
    """A small calculator model with vLLM-sized heads (2 x 32) that always calls the tool first."""
    from thinkrl.models.tiny_calc import CalcModelSpec, build_calc_model
    spec = CalcModelSpec(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                         pretrain_problems=300, pretrain_steps=200, batch_size=16, tool_rate=1.0)
    threads = torch.get_num_threads()
    out = build_calc_model(tmp_path_factory.mktemp("models") / "calc", spec, log=lambda *_: None)
    torch.set_num_threads(threads)
    return out


def test_two_steps_of_tool_calls_through_vllm(asset_cache, calc_vllm_model, tmp_path):
    from thinkrl.cli import main

    run_dir = tmp_path / "run"
    arr = "actor_rollout_ref"
    assert main(["train", "--config", "calculator", "--skip-doctor", f"{arr}.model.path={calc_vllm_model}",
                 f"trainer.default_local_dir={run_dir}", f"{arr}.rollout.name=vllm",
                 f"{arr}.rollout.dtype=float32", f"{arr}.rollout.enforce_eager=True",
                 f"{arr}.rollout.load_format=dummy_dtensor", f"{arr}.rollout.temperature=0.7",
                 "data.train_batch_size=4", f"{arr}.actor.ppo_mini_batch_size=4",
                 f"{arr}.actor.ppo_micro_batch_size_per_gpu=8", f"{arr}.rollout.n=4",
                 "data.max_response_length=64", "trainer.total_training_steps=2",
                 "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.progress_bar=False",
                 "trainer.logger=[]", "algorithm.rollout_is=True", f"{arr}.actor.optim.lr=1e-3"]) == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["multi_turn/tool_calls/mean"] > 0.5 and r["num_turns/mean"] > 2.5, r
        assert r["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE
