"""The fast paths on an accelerator (skipped without one; `bench/device_check.sh`
runs them when a device is lent): the lean forward in bfloat16 against
transformers' own forward, and the fast decode loop against the padded loop
it replaces, on the device."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.models.lean_decoder import decoder_logits, lean_spec, padding_attention_mask
from thinkrl.rollout.base import SamplingParams
from thinkrl.rollout.native import NativeEngine

from tests.rollout.test_native import MANY_EOS, PAD, prompt_batch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _model(dtype: torch.dtype) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=False, initializer_range=0.3, eos_token_id=1, pad_token_id=PAD)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to("cuda", dtype).eval()


def test_the_lean_forward_in_bfloat16_matches_transformers_on_the_device():
    model = _model(torch.bfloat16)
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(1)).cuda()
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        hf = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
        lean = decoder_logits(lean_spec(model), ids, pos, padding_attention_mask(mask, 9), keep=9).float()
    real = mask.bool()
    assert lean.device.type == "cuda"
    assert torch.allclose(lean[real], hf[real], atol=0.1, rtol=0.05)  # bfloat16 roundings differ
    assert (lean[real].argmax(-1) == hf[real].argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("params", [SamplingParams(n=3, max_tokens=12, temperature=0.7),
                                    SamplingParams(n=2, max_tokens=10, do_sample=False)],
                         ids=["sampled", "greedy"])
def test_the_fast_decode_loop_samples_what_the_padded_loop_samples_on_the_device(params):
    model = _model(torch.float32)
    out = [NativeEngine(model, eos_token_ids=MANY_EOS, pad_token_id=PAD, seed=2, fast=fast,
                        device=torch.device("cuda")).generate(prompt_batch(), params) for fast in (True, False)]
    assert torch.equal(out[0].response_ids, out[1].response_ids)
    assert torch.allclose(out[0].rollout_logprobs, out[1].rollout_logprobs, atol=1e-4)
