"""The shrunken model keeps what the run depends on: architecture class,
vocabulary, special tokens, rotary settings, chat template, processor; and
heads that split over the run's tensor parallelism as the real ones do."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoTokenizer

from rehearse_helpers import real_model_folder
from thinkrl.rehearse.shrink import ShrinkSpec, build_shrunk_model, scaled_sections, shrunk_config
from thinkrl.rollout.vllm_checks import engine_model_problem


class _Rollout:
    name = "vllm"

    def __init__(self, tp: int) -> None:
        self.tensor_model_parallel_size = tp


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shrunk_qwen25_7b_keeps_the_architecture_vocabulary_tokens_and_template(tmp_path, tp):
    real = real_model_folder("qwen2.5-7b-instruct-config", tmp_path / "real")
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in real.iterdir()}
    shrunk = build_shrunk_model(str(real), tmp_path / "small", tensor_parallel=tp)
    big, small = (json.loads((p / "config.json").read_text()) for p in (real, shrunk.path))
    assert small["architectures"] == big["architectures"] == ["Qwen2ForCausalLM"]
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "tie_word_embeddings", "rope_theta",
                "max_position_embeddings", "rms_norm_eps", "hidden_act"):
        assert small.get(key, small.get("rope_parameters", {}).get(key)) == big[key], key
    assert small["num_hidden_layers"] == 2 and small["hidden_size"] < big["hidden_size"]
    assert small["num_key_value_heads"] % tp == 0  # 4 K/V heads split over TP as the real 4 do
    assert small["num_attention_heads"] > small["num_key_value_heads"]  # GQA stays GQA
    assert engine_model_problem(_Rollout(tp), AutoConfig.from_pretrained(shrunk.path)) is None
    # the real tokenizer and chat template, byte for byte
    messages = [{"role": "user", "content": "What is 7 x 6?"}]
    real_tok, small_tok = AutoTokenizer.from_pretrained(real), AutoTokenizer.from_pretrained(shrunk.path)
    assert small_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        real_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert len(small_tok) == len(real_tok) and small_tok.eos_token == real_tok.eos_token
    # the real generation settings (two stop ids, sampling defaults), not save_pretrained's
    assert json.loads((shrunk.path / "generation_config.json").read_text()) == \
        json.loads((real / "generation_config.json").read_text())
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in real.iterdir()} == before


def test_shrunk_qwen25_vl_keeps_the_processor_and_a_small_vision_tower(tmp_path):
    from transformers import AutoModelForImageTextToText

    real = real_model_folder("qwen2.5-vl-7b-instruct-config", tmp_path / "real")
    shrunk = build_shrunk_model(str(real), tmp_path / "small", tensor_parallel=4)
    assert shrunk.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert (shrunk.path / "preprocessor_config.json").read_text() == \
        (real / "preprocessor_config.json").read_text()
    model = AutoModelForImageTextToText.from_pretrained(shrunk.path)
    text, vision = model.config.text_config, model.config.vision_config
    assert vision.depth == 2 and vision.out_hidden_size == text.hidden_size
    assert vision.patch_size == 14 and vision.spatial_merge_size == 2  # the processor's grid
    head_dim = text.hidden_size // text.num_attention_heads
    assert sum(text.rope_parameters["mrope_section"]) == head_dim // 2
    assert model.config.image_token_id == 151655 and text.vocab_size == 152064


def test_a_model_is_never_made_larger():
    from transformers import Qwen2Config

    small = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=300)
    config, _ = shrunk_config(small)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 128, 2)
    assert config.num_attention_heads <= 4 and config.num_key_value_heads == 2


def test_mrope_sections_keep_their_proportions():
    assert scaled_sections([16, 24, 24], 16) == [4, 6, 6]
    assert sum(scaled_sections([16, 24, 24], 8)) == 8


def test_a_hub_id_that_cannot_be_fetched_says_what_to_give(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="could not be fetched from the hub.*give the folder"):
        build_shrunk_model("no-such-org/no-such-model-xyz", tmp_path / "out", spec=ShrinkSpec())
