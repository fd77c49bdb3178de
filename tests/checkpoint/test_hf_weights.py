"""Reading a checkpoint's Hugging Face folder back into a model of the run,
where transformers saves a layout other than the module's (a mixture of
experts' fused experts, saved one tensor per expert)."""

from __future__ import annotations

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from thinkrl.checkpoint.hf_weights import copy_weights, read_weights


def test_a_mixture_of_experts_reads_back_into_its_fused_experts(tmp_path):
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                            num_experts=4, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=8)
    torch.manual_seed(0)
    trained = Qwen3MoeForCausalLM(config)
    trained.save_pretrained(tmp_path)
    from safetensors.torch import load_file
    saved = load_file(tmp_path / "model.safetensors")
    assert not saved.keys() <= trained.state_dict().keys()  # the layouts differ (else nothing to test)
    torch.manual_seed(1)
    fresh = Qwen3MoeForCausalLM(config)
    copy_weights(fresh, read_weights(fresh, tmp_path), tmp_path)
    for name, tensor in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
