"""LoRA adapters (thinkrl.models.lora): the merge by hand, the gradient as the
chain rule of the merged weight's, the switched-off adapter as the base, the
saved adapter as PEFT reads it, and the doctor's parameter count."""

from __future__ import annotations

import pytest
import torch

peft = pytest.importorskip("peft")

from thinkrl.models.forward import response_logprobs  # noqa: E402
from thinkrl.models.lora import (LoraSettings, adapter_parameter_count, attach_lora,  # noqa: E402
                                 load_adapter_weights, lora_of, merged_tensors, module_key, saved_key)


def tiny_qwen2(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def with_adapter(seed: int = 0, *, rank: int = 4, alpha: float = 8.0, targets="all-linear"):
    """A tiny model with LoRA whose B is random (PEFT starts it at 0, which
    would hide A's gradient and every difference from the base)."""
    model = tiny_qwen2(seed)
    lora = attach_lora(model, LoraSettings(rank=rank, alpha=alpha, target_modules=targets))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model, lora


def batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 64, (3, 10), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded prompt
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def test_merge_by_hand() -> None:
    # W = I, A = [1 2], B = [3; 4], s = 0.5:  s B A = 0.5 [[3 6], [4 8]] = [[1.5 3], [2 4]]
    # W' = [[2.5 3], [2 5]]; the bias is renamed, other tensors pass through.
    named = [("embed.weight", torch.ones(1)),
             ("l.q.base_layer.weight", torch.eye(2)), ("l.q.base_layer.bias", torch.tensor([7.0, 8.0])),
             ("l.q.lora_A.default.weight", torch.tensor([[1.0, 2.0]])),
             ("l.q.lora_B.default.weight", torch.tensor([[3.0], [4.0]]))]
    merged = dict(merged_tensors(named, {"l.q": 0.5}))
    assert list(merged) == ["embed.weight", "l.q.bias", "l.q.weight"]
    assert torch.equal(merged["l.q.weight"], torch.tensor([[2.5, 3.0], [2.0, 5.0]]))
    assert torch.equal(merged["l.q.bias"], torch.tensor([7.0, 8.0]))
    assert torch.equal(named[1][1], torch.eye(2))  # out of place: the base is untouched


def test_saved_names_are_peft_s() -> None:
    name = "model.layers.0.self_attn.q_proj.lora_A.default.weight"
    assert saved_key(name) == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    assert module_key(saved_key(name)) == name


def test_only_the_adapter_trains_and_its_gradient_is_the_chain_rule_of_the_merged_weight() -> None:
    """For y = x (W + s B A)^T: dL/dA = s B^T G and dL/dB = s G A^T, where G =
    dL/dW' is the gradient of the same loss through the merged weight W'."""
    model, lora = with_adapter()
    ids, mask, positions = batch()
    weights = torch.randn(3, 4, generator=torch.Generator().manual_seed(5))

    def loss_of(m):
        logprob, _ = response_logprobs(m, ids, mask, positions, response_length=4, temperature=1.0)
        return (logprob * weights).sum()

    loss_of(model).backward()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in trainable)

    plain = tiny_qwen2()
    merged = dict(merged_tensors(model.state_dict().items(), lora.scalings()))
    plain.load_state_dict(merged)
    loss_of(plain).backward()
    params, plain_params = dict(model.named_parameters()), dict(plain.named_parameters())
    s = 8.0 / 4
    for module in lora.scalings():
        g = plain_params[f"{module}.weight"].grad  # [out, in]
        a, b = params[f"{module}.lora_A.default.weight"], params[f"{module}.lora_B.default.weight"]
        torch.testing.assert_close(a.grad, s * b.detach().T @ g, rtol=1e-4, atol=1e-6, msg=module)
        torch.testing.assert_close(b.grad, s * g @ a.detach().T, rtol=1e-4, atol=1e-6, msg=module)


def test_the_switched_off_adapter_is_the_base_model() -> None:
    model, lora = with_adapter()
    base = tiny_qwen2()  # the same seed: the same base weights
    ids, mask, positions = batch()
    expected, _ = response_logprobs(base, ids, mask, positions, response_length=4, temperature=1.0)
    with torch.no_grad():
        with lora.disabled():
            off, _ = response_logprobs(model, ids, mask, positions, response_length=4, temperature=1.0)
        on, _ = response_logprobs(model, ids, mask, positions, response_length=4, temperature=1.0)
    assert torch.equal(off, expected)
    assert (on - expected).abs().max() > 1e-3  # the adapter changes the policy
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)  # back on


def test_a_saved_adapter_loads_in_peft_and_merges_to_the_same_log_probs(tmp_path) -> None:
    from thinkrl.checkpoint.adapter import write_merged_model

    model, lora = with_adapter(targets=["q_proj", "v_proj", "down_proj"])
    base_dir = tmp_path / "base"
    tiny_qwen2().save_pretrained(base_dir)
    tensors = {n: p for n, p in model.named_parameters() if p.requires_grad}
    lora.save(tmp_path / "adapter", tensors, base_model=str(base_dir))
    ids, mask, positions = batch(1)
    with torch.no_grad():
        ours, _ = response_logprobs(model, ids, mask, positions, response_length=5, temperature=1.0)

    from transformers import AutoModelForCausalLM
    theirs_model = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir),
                                                  tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs, _ = response_logprobs(theirs_model.base_model.model, ids, mask, positions,
                                      response_length=5, temperature=1.0)
    assert torch.equal(theirs, ours)

    # loaded back into a fresh adapter: the same tensors
    again = tiny_qwen2()
    again_lora = attach_lora(again, LoraSettings(rank=0, alpha=0, target_modules=(),
                                                 adapter_path=str(tmp_path / "adapter")))
    load_adapter_weights(again_lora, tmp_path / "adapter")
    for name, tensor in tensors.items():
        assert torch.equal(dict(again.named_parameters())[name], tensor), name

    assert write_merged_model(tmp_path / "adapter", tmp_path / "merged") == str(base_dir)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        plain, _ = response_logprobs(merged, ids, mask, positions, response_length=5, temperature=1.0)
    torch.testing.assert_close(plain, ours, rtol=0, atol=1e-5)
    assert sorted(p.name for p in base_dir.iterdir()) == ["config.json", "generation_config.json",
                                                          "model.safetensors"]


def test_an_adapter_of_other_targets_is_refused_by_name(tmp_path) -> None:
    model, lora = with_adapter(targets=["q_proj"])
    lora.save(tmp_path / "q", {n: p for n, p in model.named_parameters() if p.requires_grad},
              base_model="base")
    _, other = with_adapter(targets=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match=r"does not fit this model's adapter: 4 missing .*v_proj"):
        other.load_tensors(tmp_path / "q")


def test_targets_that_match_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="target_modules=.*matches no layer"):
        attach_lora(tiny_qwen2(), LoraSettings(rank=4, alpha=8, target_modules=("nothing_here",)))


@pytest.mark.parametrize("targets", ["all-linear", ("q_proj", "v_proj"), ("gate_proj", "o_proj")])
def test_the_doctor_s_adapter_size_is_the_real_one(targets) -> None:
    model, _ = with_adapter(rank=8, targets=targets if isinstance(targets, str) else list(targets))
    real = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert adapter_parameter_count(model.config, 8, targets) == real


@pytest.mark.parametrize("split", [False, True], ids=["fused", "split"])
def test_the_lean_forward_computes_the_adapter_and_its_gradient_as_peft_does(split) -> None:
    """decoder_logits on LoRA layers (W + s B A per projection) against PEFT's
    own forward (x W^T + s (x A^T) B^T): logits, A's and B's gradients, and
    the switched-off adapter."""
    from thinkrl.models.lean_decoder import (decoder_logits, fused_weights_of, lean_spec,
                                             padding_attention_mask, split_weights_of)

    model, lora = with_adapter(targets=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"])
    spec = lean_spec(model)
    assert spec is not None
    ids, mask, positions = batch()
    real = mask[:, -5:].bool()
    weights_of = split_weights_of if split else fused_weights_of

    def lean():
        return decoder_logits(spec, ids, positions, padding_attention_mask(mask, 10), keep=5,
                              weights=[weights_of(layer) for layer in model.model.layers])

    hf = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -5:]
    hf[real].logsumexp(-1).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    got = lean()
    got[real].logsumexp(-1).sum().backward()
    torch.testing.assert_close(got[real], hf[real], rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(p.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad(), lora.disabled():
        off_lean = lean()
        off_hf = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -5:]
        assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
    torch.testing.assert_close(off_lean[real], off_hf[real], rtol=1e-5, atol=1e-5)
    assert (off_lean[real] - got[real].detach()).abs().max() > 1e-3


def test_the_native_engine_decodes_a_lora_model_fast_as_transformers_does() -> None:
    from thinkrl.rollout.base import SamplingParams
    from thinkrl.rollout.native import NativeEngine

    model, _ = with_adapter()
    ids, mask, _ = batch(2)
    from thinkrl.records import PromptBatch
    prompts = PromptBatch(input_ids=ids, attention_mask=mask, samples=[None] * 3)
    params = SamplingParams(n=2, max_tokens=6, do_sample=True, temperature=1.0)
    fast = NativeEngine(model, eos_token_ids=[0], pad_token_id=0, seed=4)
    slow = NativeEngine(model, eos_token_ids=[0], pad_token_id=0, seed=4, fast=False)
    assert fast._lean is not None and slow._lean is None
    a, b = fast.generate(prompts, params), slow.generate(prompts, params)
    assert a.response_ids.tolist() == b.response_ids.tolist()
    torch.testing.assert_close(a.rollout_logprobs, b.rollout_logprobs, rtol=0, atol=1e-4)


def test_an_embedding_or_head_target_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"adapts model.embed_tokens \(Embedding\)"):
        attach_lora(tiny_qwen2(), LoraSettings(rank=4, alpha=8, target_modules=("embed_tokens", "q_proj")))


def test_each_model_carries_its_own_handle_whichever_was_built_last():
    """A sharded build makes two models on rank 0 (the loaded one and the
    skeleton): the handle comes from the model returned, not the last call."""
    first, first_lora = with_adapter(0)
    second, second_lora = with_adapter(1)
    assert lora_of(first) is first_lora and lora_of(second) is second_lora
    assert lora_of(tiny_qwen2()) is None
    assert not any("thinkrl" in key for key in first.state_dict())
