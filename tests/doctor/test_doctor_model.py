"""Model and tokenizer checks, and the parameter estimator."""

from __future__ import annotations

import pytest
import torch
from doctor_helpers import context

from thinkrl.doctor import run_check
from thinkrl.doctor.context import estimate_param_count
from thinkrl.doctor.model import (check_chatml_markers, check_config, check_fits, check_special_tokens,
                                  check_tokenizer)


def _real_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def test_estimate_matches_the_tiny_model(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert estimate_param_count(AutoConfig.from_pretrained(tiny_model_dir)) == _real_count(model)


@pytest.mark.parametrize("tied", [True, False])
def test_estimate_matches_a_qwen2_and_a_llama_model(tied):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sizes = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                 num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=tied)
    qwen = Qwen2Config(**sizes)
    assert estimate_param_count(qwen) == _real_count(Qwen2ForCausalLM(qwen))
    llama = LlamaConfig(**sizes, head_dim=24)  # explicit head_dim, no q/k/v biases
    assert estimate_param_count(llama) == _real_count(LlamaForCausalLM(llama))


def test_missing_model_path_fails_and_dependents_skip(tmp_path):
    ctx = context(f"actor_rollout_ref.model.path={tmp_path / 'no_model'}")
    row = check_config(ctx)
    assert row.status == "fail" and "no_model" in row.found and "config.json" in row.fix


def test_chat_template_needed_by_the_chat_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = None
    row = check_tokenizer(context(tokenizer=tok))
    assert row.status == "fail" and "custom_chat_template" in row.fix
    row = check_tokenizer(context("data.template=qwen_r1", tokenizer=tok))
    assert row.status == "ok"


class _DroppingTokenizer:
    """Decodes without the <think> tags, as a tokenizer that made them special would."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": list(text.encode())}

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode().replace("<think>", "").replace("</think>", "")


def test_mangled_reward_markup_fails_for_r1_runs_and_warns_otherwise():
    row = check_special_tokens(context("data.template=qwen_r1", tokenizer=_DroppingTokenizer()))
    assert row.status == "fail" and "<think>" in row.found
    assert check_special_tokens(context(tokenizer=_DroppingTokenizer())).status == "warn"


def test_sequence_longer_than_positions_fails(tiny_model_dir):
    ctx = context(f"actor_rollout_ref.model.path={tiny_model_dir}", "data.max_response_length=1000")
    row = check_fits(ctx)
    assert row.status == "fail" and "max_position_embeddings" in row.found


def test_an_uncached_hub_id_offline_fails_at_once_instead_of_retrying():
    ctx = context("actor_rollout_ref.model.path=some-org/not-a-cached-model", env={"HF_HUB_OFFLINE": "1"})
    row = check_config(ctx)
    assert row.status == "fail" and "not in the Hugging Face cache" in row.found
    assert check_tokenizer(ctx).status == "fail"
    [fits] = run_check(check_fits, ctx)
    assert fits.status == "skip" and "model/config" in fits.found


class _ByteTokenizer:
    """One token per byte: no ChatML marker is a single token."""

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())


def test_qwen_r1_markers_need_a_chatml_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    assert run_check(check_chatml_markers, context()) == []  # chat: nothing to check
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)  # ChatML specials, as Qwen's
    row = check_chatml_markers(context("data.template=qwen_r1", tokenizer=tok))
    assert row.status == "ok" and "stops at <|im_end|>" in row.found
    row = check_chatml_markers(context("data.val_template=qwen_r1", tokenizer=_ByteTokenizer()))
    assert row.status == "warn" and "<|im_start|> and <|im_end|>" in row.found
    assert "data.template=r1_system" in row.fix
