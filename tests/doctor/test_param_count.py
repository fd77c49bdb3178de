"""The doctor's parameter count from a config against the models transformers
builds from it (dense, Qwen3's q/k norms, mixtures of experts with dense
layers among them and a shared expert), and Qwen3-30B-A3B's real config."""

from __future__ import annotations

import json

import pytest
from transformers import (AutoConfig, AutoModelForCausalLM, Qwen2Config, Qwen2MoeConfig, Qwen3Config,
                          Qwen3MoeConfig)

from thinkrl.doctor.context import estimate_param_count

from conftest import SHARED_DATA

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("config", [
    Qwen2Config(**SMALL, tie_word_embeddings=True),
    Qwen3Config(**SMALL, head_dim=16),
    Qwen3MoeConfig(**SMALL, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=8,
                   mlp_only_layers=[0], decoder_sparse_step=1),
    Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                   shared_expert_intermediate_size=16, decoder_sparse_step=2),
], ids=["qwen2-tied", "qwen3", "qwen3-moe-first-layer-dense", "qwen2-moe-every-second-layer"])
def test_the_count_is_the_built_model_s(config):
    model = AutoModelForCausalLM.from_config(config)
    assert estimate_param_count(config) == sum(p.numel() for p in model.parameters())


def test_qwen3_30b_a3b_counts_every_expert():
    folder = SHARED_DATA / "models" / "qwen3-30b-a3b-config"
    if not (folder / "config.json").is_file():
        pytest.skip("../shared/data/models/qwen3-30b-a3b-config is not here")
    config = AutoConfig.from_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["num_experts"] == 128
    assert estimate_param_count(config) == pytest.approx(30.5e9, rel=0.01)  # its model card: 30.5B
