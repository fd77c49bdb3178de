"""A random tiny Qwen3-MoE (the test model's tokenizer) trains 2 GRPO steps
padding-free with router replay R3 on one process and on 2 Ray ranks (FSDP2
shards, the experts' fused tensors among them), and with R2; each logs how
often the trainer's routing agreed with the rollout's. Every Ray wait has a
120 s deadline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from thinkrl.cli import recipe_path
from thinkrl.config import load_config
from thinkrl.trainer import train

pytestmark = pytest.mark.slow
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # conftest: loopback only


@pytest.fixture(scope="module")
def moe_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = tmp_path_factory.mktemp("moe") / "qwen3-moe"
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=64 * -(-len(tokenizer) // 64), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, norm_topk_prob=True, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 0.1)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _run(moe_dir: Path, run_dir: Path, *extra: str) -> list[dict]:
    cfg = load_config(recipe_path("tiny"), [
        f"actor_rollout_ref.model.path={moe_dir}", f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "data.max_response_length=12",
        "actor_rollout_ref.model.use_remove_padding=True", "trainer.total_training_steps=2",
        "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.progress_bar=False",
        "trainer.logger=[]", "reward.num_workers=0", "trainer.ray_wait_timeout_s=120", *extra])
    train(cfg, log=lambda *_: None)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("ranks", [1, 2])
def test_r3_trains_and_logs_the_routing_agreement(asset_cache, moe_dir, tmp_path, ranks):
    if ranks > 1:
        pytest.importorskip("ray")
    records = _run(moe_dir, tmp_path / "run", "actor_rollout_ref.actor.router_replay.mode=R3",
                   f"trainer.n_gpus_per_node={ranks}")
    for record in records:
        assert 0.9 <= record["routing/agreement"] <= 1.0  # float32 both sides: (almost) always the same
        assert {"routing/agreement/layer_0", "routing/agreement/layer_1"} <= record.keys()
        assert record["actor/grad_norm"] > 0


def test_r2_and_verls_megatron_spelling_train(asset_cache, moe_dir, tmp_path):
    records = _run(moe_dir, tmp_path / "run", "actor_rollout_ref.actor.megatron.router_replay.mode=R2")
    assert len(records) == 2 and all("routing/agreement" not in r for r in records)


def test_router_replay_on_a_dense_model_stops_at_start(asset_cache, tiny_model_dir, tmp_path):
    from thinkrl.build import build_run
    from thinkrl.errors import UserError

    cfg = load_config(recipe_path("tiny"), [f"actor_rollout_ref.model.path={tiny_model_dir}",
                                            f"trainer.default_local_dir={tmp_path}",
                                            "actor_rollout_ref.actor.router_replay.mode=R3"])
    with pytest.raises(UserError, match="has no experts"):
        build_run(cfg, log=lambda *_: None)


def test_the_routers_load_balancing_loss_is_added_when_the_config_asks(asset_cache, moe_dir, tmp_path):
    records = _run(moe_dir, tmp_path / "run", "+actor_rollout_ref.model.override_config.output_router_logits=True",
                   "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.01")
    assert all(record["actor/router_aux_loss"] > 0.9 for record in records)  # ~1 for a balanced router


def test_lora_trains_a_mixture_of_experts_attention(asset_cache, moe_dir, tmp_path):
    """model.lora_rank on Qwen3-MoE: the attention's projections adapted (the
    lean forward takes them), with R3; all-linear, which PEFT turns into LoRA on
    the fused experts' parameters, is refused with what to name instead."""
    pytest.importorskip("peft")
    from thinkrl.errors import UserError

    lora = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
            "actor_rollout_ref.actor.optim.lr=1e-3"]
    records = _run(moe_dir, tmp_path / "run", *lora, "actor_rollout_ref.actor.router_replay.mode=R3",
                   "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj]")
    assert all(r["actor/grad_norm"] > 0 and 0.9 <= r["routing/agreement"] <= 1.0 for r in records)
    with pytest.raises(UserError, match="fused parameters"):
        _run(moe_dir, tmp_path / "all", *lora)
