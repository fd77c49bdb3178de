"""LoRA with vLLM as the engine (CPU build): the engine is sent the base with
the adapter merged in after every update (attested each sync: a run whose
engine served anything else would stop), samples from it (the trainer's
log-probs of vLLM's tokens agree every step), holds exactly the merged
weights, and decodes greedily as the native engine does on the actor's own
LoRA module."""

import json

import pytest
import torch

vllm = pytest.importorskip("vllm")
pytest.importorskip("peft")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vllm_engine import (LOGPROB_TOLERANCE, assert_engine_holds, grpo_overrides,  # noqa: E402,F401
                              tiny_vllm_model)


def test_the_engine_serves_the_trained_adapter_merged(asset_cache, tiny_vllm_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.data.dataset import collate
    from thinkrl.rollout.native import NativeEngine
    from thinkrl.trainer import train_run

    arr = "actor_rollout_ref"
    overrides = grpo_overrides(tiny_vllm_model, tmp_path / "run") + [
        f"{arr}.model.lora_rank=8", f"{arr}.model.lora_alpha=16", f"{arr}.actor.optim.lr=1e-2"]
    run = build_run(load_config("tiny", overrides), log=lambda *_: None)
    try:
        actor = run.roles.actor.group.rank.actor
        train_run(run, log=lambda *_: None)
        merged = AutoModelForCausalLM.from_pretrained(tiny_vllm_model, dtype=torch.float32).eval()
        before = {k: v.clone() for k, v in merged.state_dict().items()}
        merged.load_state_dict(dict(actor.weights()))
        assert max((v - before[k]).abs().max().item() for k, v in merged.state_dict().items()) > 1e-3
        engine = run.roles.engine.group.rank.engine
        assert_engine_holds(engine, merged)

        prompts = collate(run.spec.val_prompts[:8], pad_token_id=run.spec.tokenizer.pad_token_id)
        greedy = run.spec.val_sampling
        assert not greedy.do_sample
        native = NativeEngine(actor.model, eos_token_ids=list(engine.eos_token_ids),
                              pad_token_id=run.spec.tokenizer.pad_token_id)
        got, want = engine.generate(prompts, greedy), native.generate(prompts, greedy)
        assert got.response_ids.tolist() == want.response_ids.tolist()
    finally:
        run.close()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE for r in steps)
    saved = sorted(p.name for p in (tmp_path / "run" / "global_step_2" / "actor").iterdir())
    assert "adapter_model.safetensors" in saved and "model.safetensors" not in saved
