"""The lean decoder forward against Hugging Face's own forward on the same module."""

from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from thinkrl.models.lean_decoder import (attend_one, attention, attention_dtype, decoder_logits,
                                         fused_weights_of, split_weights_of,
                                         lean_spec, one_query_bias, padding_attention_mask)


def _qwen2():
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def _batch():
    ids = torch.randint(3, 40, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :3], mask[2, :1] = 0, 0  # left padding
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_logits_and_gradients_equal_hugging_face():
    model = _qwen2()
    ids, mask, pos = _batch()
    hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -5:]
    hf[mask[:, -5:].bool()].logsumexp(-1).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lean = decoder_logits(lean_spec(model), ids, pos, padding_attention_mask(mask, 9), keep=5)
    lean[mask[:, -5:].bool()].logsumexp(-1).sum().backward()
    real = mask[:, -5:].bool()
    assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4), name


def test_llama_without_biases_and_no_padding_is_causal():
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, initializer_range=0.3)
    model = LlamaForCausalLM(cfg)
    ids = torch.randint(3, 40, (2, 7))
    pos = torch.arange(7).expand(2, 7)
    with torch.no_grad():
        hf = model(input_ids=ids).logits
        lean = decoder_logits(lean_spec(model), ids, pos, None, keep=7)
    assert torch.allclose(lean, hf, atol=1e-5, rtol=1e-5)


def test_padding_mask_by_hand():
    # Row [pad, a, b]: a sees a; b sees a, b; the pad query sees only itself.
    mask = padding_attention_mask(torch.tensor([[0, 1, 1]]), 3)[0, 0]
    assert mask.tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    assert padding_attention_mask(torch.tensor([[0, 1, 1]]), 1)[0, 0].tolist() == [[False, True, True]]


def test_unsupported_configs_get_no_spec():
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2,
                      rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    assert lean_spec(Qwen2ForCausalLM(cfg)) is None
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu")
    assert lean_spec(Qwen2ForCausalLM(cfg)) is None


def test_a_wrapped_projection_gets_no_spec():
    # An adapter around a projection (LoRA-style) computes more than its .weight.
    class Adapted(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.weight, self.bias = inner, inner.weight, inner.bias

        def forward(self, x):
            return self.inner(x) * 2

    model = _qwen2()
    assert lean_spec(model) is not None
    model.model.layers[1].self_attn.v_proj = Adapted(model.model.layers[1].self_attn.v_proj)
    assert lean_spec(model) is None


def test_cpu_attention_runs_in_float32_under_bfloat16_autocast():
    # bfloat16 q/k/v in, bfloat16 out, but the softmax(q k^T) v in between is float32's:
    # equal to the float32 kernel's result rounded once, not to the bfloat16 kernel's.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, s, 8, generator=g).bfloat16() for s in (5, 7, 7))
    k, v = k[:, :2], v[:, :2]  # 2 key/value heads for 4 query heads
    mask = torch.rand(2, 1, 5, 7, generator=g) > 0.3
    mask[..., 0] = True
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention(q, k, v, mask)
        one = attend_one(q[:, :, :1], k.float(), v.float(),  # the decode step, float32 cache
                         one_query_bias(mask[:, :, :1], SimpleNamespace(heads=4, kv_heads=2),
                                        torch.float32))
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    assert torch.allclose(one.float(), want[:, :, :1].float(), atol=1e-2)
    in_bf16 = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert not torch.equal(in_bf16, want)  # so the test can tell the two kernels apart


def test_attention_dtype_by_device_and_autocast():
    bf16, f32 = torch.bfloat16, torch.float32
    assert attention_dtype("cpu", bf16, bf16) == f32  # CPU: float32 always
    assert attention_dtype("cpu", f32, None) == f32
    # Accelerators under autocast: q/k leave the rotation in float32 (float32 tables),
    # v in the autocast dtype; all three meet in the autocast dtype, as SDPA under
    # autocast did.
    assert attention_dtype("cuda", f32, bf16) == bf16
    assert attention_dtype("cuda", bf16, None) == bf16  # bfloat16 weights, no autocast
    assert attention_dtype("npu", f32, None) == f32


def test_split_weights_compute_the_same_and_keep_no_weight_copy_for_backward():
    """`split_weights_of` (training on accelerators and FSDP2 shards): the same
    logits and gradients as Hugging Face, and what autograd keeps for the
    backward holds no concatenated q/k/v or gate/up copy, only parameters."""
    model = _qwen2()
    ids, mask, pos = _batch()
    hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -5:]
    real = mask[:, -5:].bool()
    hf[real].logsumexp(-1).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    params = {p.data_ptr() for p in model.parameters()}
    for weights_of, copies_kept in ((split_weights_of, False), (fused_weights_of, True)):
        model.zero_grad()
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            lean = decoder_logits(lean_spec(model), ids, pos, padding_attention_mask(mask, 9), keep=5,
                                  weights=[weights_of(layer) for layer in model.model.layers])
        # [(H + 2K) D, E] and [2 I, E] (kept transposed), not a parameter's storage
        copies = [t for t in kept if t.dim() == 2 and t.numel() in ((32 + 2 * 16) * 32, 96 * 32)
                  and t.data_ptr() not in params]
        assert bool(copies) == copies_kept, weights_of.__name__
        lean[real].logsumexp(-1).sum().backward()
        assert torch.allclose(lean[real], hf[real], atol=1e-5, rtol=1e-5)
        for name, p in model.named_parameters():
            assert torch.allclose(p.grad, want[name], atol=1e-5, rtol=1e-4), name
