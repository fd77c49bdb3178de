"""Loading models and tokenizers from local folders, as a hub id would load."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from thinkrl.models.loading import eos_token_ids, load_causal_lm, load_tokenizer


def test_loads_the_tiny_model_folder_and_disables_dropout(tiny_model_dir, tmp_path):
    config = Qwen2Config.from_pretrained(tiny_model_dir)
    config.attention_dropout = 0.3
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(tmp_path)
    loaded = load_causal_lm(str(tmp_path), dtype=torch.float32, device=torch.device("cpu"))
    assert all(m.attention_dropout == 0.0 for m in loaded.modules() if hasattr(m, "attention_dropout"))
    tokenizer = load_tokenizer(str(tiny_model_dir))
    assert tokenizer.pad_token_id is not None and tokenizer.chat_template
    assert tokenizer.eos_token_id in eos_token_ids(tokenizer, loaded.generation_config)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no folder"):
        load_tokenizer(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="does not hold a loadable model"):
        load_causal_lm(str(tmp_path / "empty"), dtype=torch.float32, device=torch.device("cpu"))


def test_real_qwen_tokenizer_from_shared_data():
    from conftest import SHARED_DATA

    folder = SHARED_DATA / "tokenizers" / "qwen2.5"
    if not folder.is_dir():
        pytest.skip("../shared/data is absent")
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [151644, 151645]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_gradient_checkpointing_is_switched_on(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"),
                           gradient_checkpointing=True)
    flag = "is_activation_checkpointing"  # transformers 5; 4.x: is_gradient_checkpointing
    flag = flag if hasattr(model, flag) else "is_gradient_checkpointing"
    assert getattr(model, flag)
    plain = load_causal_lm(str(tiny_model_dir), dtype=torch.float32, device=torch.device("cpu"))
    assert not getattr(plain, flag)
