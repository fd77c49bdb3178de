"""Reading back the weights a vLLM engine computes with, and what they should
be for a transformers model (the vllm tests: tests/rollout, tests/vision)."""

from __future__ import annotations

import torch


def engine_weights(llm, part=lambda model: model) -> dict[str, torch.Tensor]:
    """The weights vLLM computes with, read back through each module of
    `part(vLLM's model)` (a VL model's language_model, say): a linear layer's
    matrix is its output on the identity (CPU vLLM repacks matrices for its
    kernels, so they cannot be read directly)."""
    def read(model):
        out = {}
        for name, module in part(model).named_modules():
            if hasattr(module, "quant_method") and hasattr(module, "input_size") \
                    and "embed" not in name and "lm_head" not in name:
                y = module(torch.eye(module.input_size))
                y = y[0] if isinstance(y, tuple) else y
                bias = getattr(module, "bias", None)
                if bias is not None and not module.skip_bias_add:
                    y = y - bias
                    out[name + ".bias"] = bias.detach().clone()
                out[name + ".weight"] = y.T.contiguous()
            elif name.endswith(("norm", "embed_tokens", "lm_head")) and hasattr(module, "weight") \
                    and module.weight.numel():
                out[name + ".weight"] = module.weight.detach().clone()
        return out
    return llm.apply_model(read)[0]


def expected_engine_weights(state: dict[str, torch.Tensor], layers: int,
                            prefix: str = "model.") -> dict[str, torch.Tensor]:
    """A causal LM's weights (`state`, transformers names; the decoder's under
    `prefix`) in vLLM's fused layout (q|k|v and gate|up stacked), named as
    vLLM's causal LM names them."""
    s = {k: v.detach() for k, v in state.items()}
    out = {}
    for i in range(layers):
        p, q = f"{prefix}layers.{i}.", f"model.layers.{i}."
        out[q + "self_attn.qkv_proj.weight"] = torch.cat([s[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        out[q + "self_attn.qkv_proj.bias"] = torch.cat([s[p + f"self_attn.{x}_proj.bias"] for x in "qkv"])
        out[q + "mlp.gate_up_proj.weight"] = torch.cat([s[p + "mlp.gate_proj.weight"], s[p + "mlp.up_proj.weight"]])
        for k in ("self_attn.o_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                  "post_attention_layernorm.weight"):
            out[q + k] = s[p + k]
    out["model.embed_tokens.weight"] = s[prefix + "embed_tokens.weight"]
    out["model.norm.weight"] = s[prefix + "norm.weight"]
    out["lm_head.weight"] = s["lm_head.weight"]
    return out
