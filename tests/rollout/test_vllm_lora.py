"""LoRA runs with vLLM as the engine (CPU build), both ways it gets the
policy: serving the adapter itself (the default: the base once, the adapter
alone after each update) or the base with the adapter merged in
(model.lora.merge=True). Every sync is attested (a run whose engine served
anything else would stop); the engine samples from the trained policy (the
trainer's log-probs of vLLM's tokens agree every step) and decodes greedily
as the native engine does on the actor's own LoRA module."""

import json

import pytest
import torch

vllm = pytest.importorskip("vllm")
pytest.importorskip("peft")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from test_vllm_engine import (LOGPROB_TOLERANCE, assert_engine_holds, grpo_overrides,  # noqa: E402,F401
                              tiny_vllm_model)


@pytest.mark.parametrize("merge", [False, True], ids=["adapter", "merged"])
def test_the_engine_serves_the_trained_adapter(asset_cache, tiny_vllm_model, tmp_path, merge):
    from transformers import AutoModelForCausalLM

    from thinkrl.build import build_run
    from thinkrl.config import load_config
    from thinkrl.data.dataset import collate
    from thinkrl.rollout.native import NativeEngine
    from thinkrl.trainer import train_run

    arr = "actor_rollout_ref"
    overrides = grpo_overrides(tiny_vllm_model, tmp_path / "run") + [
        f"{arr}.model.lora_rank=8", f"{arr}.model.lora_alpha=16", f"{arr}.actor.optim.lr=1e-2",
        f"{arr}.model.lora.merge={merge}"]
    notes = []
    run = build_run(load_config("tiny", overrides), log=notes.append)
    try:
        actor = run.roles.actor.group.rank.actor
        train_run(run, log=lambda *_: None)
        merged = AutoModelForCausalLM.from_pretrained(tiny_vllm_model, dtype=torch.float32).eval()
        before = {k: v.clone() for k, v in merged.state_dict().items()}
        merged.load_state_dict(dict(actor.weights()))
        assert max((v - before[k]).abs().max().item() for k, v in merged.state_dict().items()) > 1e-3
        engine = run.roles.engine.group.rank.engine
        if merge:
            assert_engine_holds(engine, merged)
            assert engine._adapter is None and any("merged in" in str(n) for n in notes)
        else:  # the adapter's units were attested at each sync beside the base's
            served = engine.served()[0].units
            assert engine._adapter is not None and any("serves the adapter itself" in str(n) for n in notes)
            assert sum(u.endswith(("lora_A", "lora_B")) for u in served) == 2 * 4 * 2  # 2 layers

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


def test_two_ray_ranks_with_a_tp2_engine_serve_the_sharded_adapter(asset_cache, tiny_vllm_model, tmp_path):
    """FSDP2 shards the base and the adapter over 2 Ray ranks; one vLLM engine
    over both (TP 2) holds each rank's slice of the adapter. Each sync gathers
    the adapter alone and the attestation adds the ranks' slices up: 2 steps
    run (a wrong slice would stop the run) and the log-prob gap stays small."""
    pytest.importorskip("ray")
    from thinkrl.config import load_config
    from thinkrl.trainer import train

    arr = "actor_rollout_ref"
    overrides = grpo_overrides(tiny_vllm_model, tmp_path / "run") + [
        f"{arr}.model.lora_rank=8", f"{arr}.model.lora_alpha=16", f"{arr}.actor.optim.lr=1e-2",
        "trainer.n_gpus_per_node=2", f"{arr}.rollout.tensor_model_parallel_size=2",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu=8", "trainer.save_freq=-1",
        "reward.num_workers=0", "trainer.ray_wait_timeout_s=300"]
    result = train(load_config("tiny", overrides), log=lambda *_: None)
    assert result.steps == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in records if "rollout/logprob_diff_max" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/logprob_diff_max"] < LOGPROB_TOLERANCE for r in steps)
