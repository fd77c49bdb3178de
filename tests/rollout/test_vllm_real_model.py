"""A real pretrained model through vLLM's CPU build: SmolLM2-135M-Instruct
(`builtin:smollm2-135m-instruct`, its own tokenizer, ChatML template and EOS)
for one GRPO step with rollout.name=vllm. Skipped where vLLM or the model's
package is absent (the vLLM group's venv has both)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytest.importorskip("gguf")
try:  # the weights' package, found as the builder finds it
    from thinkrl.models.smollm2 import gguf_path

    gguf_path()
except ValueError as err:
    pytest.skip(str(err), allow_module_level=True)
pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_one_grpo_step_of_smollm2_on_vllm_ends_at_its_own_eos_and_attests_the_sync(asset_cache, tmp_path):
    from thinkrl.config import load_config
    from thinkrl.trainer import train

    arr = "actor_rollout_ref"
    run_dir = tmp_path / "run"
    reward = tmp_path / "length_reward.py"  # differs within a group, so the step has a gradient
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 5) / 4\n")
    train(load_config("tiny", [
        f"{arr}.model.path=builtin:smollm2-135m-instruct", f"trainer.default_local_dir={run_dir}",
        f"{arr}.rollout.name=vllm", f"{arr}.rollout.dtype=float32", f"{arr}.rollout.enforce_eager=True",
        "data.max_prompt_length=256", "data.max_response_length=192", "data.train_batch_size=2",
        f"{arr}.rollout.n=2", f"{arr}.actor.ppo_mini_batch_size=2", f"{arr}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{arr}.actor.optim.lr=1e-6", "trainer.total_training_steps=1", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.progress_bar=False", "trainer.logger=[]",
        "algorithm.rollout_is=True", f"custom_reward_function.path={reward}"]), log=lambda *_: None)
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["response_length/clip_ratio"] < 1, record  # responses end at <|im_end|>, not at the budget
    assert record["rollout/logprob_diff_max"] < 0.05  # float32 both sides, 30 layers of CPU kernels
    assert record["rollout/probs_corr"] > 0.99
    assert record["response_length/min"] < record["response_length/max"]  # uneven lengths
    assert record["timing_s/weight_attest"] >= 0 and record["actor/grad_norm"] > 0
