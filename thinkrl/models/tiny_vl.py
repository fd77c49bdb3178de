"""A tiny Qwen2.5-VL made from a config, saved as an ordinary model folder.

For tests and benchmarks: a 2-layer, 64-wide text model with M-RoPE
(`mrope_section` [2, 3, 3], summing to head_dim / 2 = 8; `hidden_size=128`
gives head_dim 32, which vLLM's CPU attention needs) and a 2-block
vision tower whose merger outputs 64 features, with the real Qwen2.5
tokenizer (it has the vision special tokens) and a Qwen2-VL image processor.
Its weights are random (seeded): it checks the plumbing, it cannot see.
Everything downstream loads it with `from_pretrained`, as a real Qwen2.5-VL.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

VISION_TOKENS = {"vision_start_token_id": 151652, "vision_end_token_id": 151653,
                 "image_token_id": 151655, "video_token_id": 151656}
"""The Qwen2.5 tokenizer's ids of <|vision_start|>, <|vision_end|>,
<|image_pad|> and <|video_pad|>."""


@dataclass(frozen=True)
class TinyVLSpec:
    hidden_size: int = 64
    num_layers: int = 2
    vision_depth: int = 2
    vision_hidden_size: int = 32
    min_pixels: int = 28 * 28 * 4
    """Smallest image area after resizing (4 merged tokens)."""
    max_pixels: int = 28 * 28 * 16
    """Largest image area after resizing (16 merged tokens): keeps prompts short."""
    seed: int = 0
    initializer_range: float = 0.02
    """The text model's init scale; wider (0.3) gives a random model whose
    greedy tokens depend on its input, for engine-equality tests."""
    model_type: str = "qwen2_5_vl"
    """"qwen2_5_vl" or "qwen2_vl" (its vision tower has no window attention)."""


def mrope_section(spec: TinyVLSpec) -> list[int]:
    """M-RoPE's split of head_dim / 2 rotary pairs into (t, h, w) in Qwen2.5-VL's
    proportions (16, 24, 24 of 64): [2, 3, 3] at head_dim 16, [4, 6, 6] at 32."""
    half = spec.hidden_size // 4 // 2  # 4 attention heads
    return [half // 4, 3 * half // 8, 3 * half // 8]


def tiny_vl_config(spec: TinyVLSpec, *, vocab_size: int):
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig

    text = dict(hidden_size=spec.hidden_size, intermediate_size=2 * spec.hidden_size,
                num_hidden_layers=spec.num_layers, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=vocab_size, max_position_embeddings=4096,
                initializer_range=spec.initializer_range,
                rope_parameters={"rope_type": "default", "mrope_section": mrope_section(spec),
                                 "rope_theta": 10000.0})
    if spec.model_type == "qwen2_vl":  # the merger's output width is `hidden_size` there
        vision = dict(depth=spec.vision_depth, embed_dim=spec.vision_hidden_size,
                      hidden_size=spec.hidden_size, num_heads=2, mlp_ratio=2)
        return Qwen2VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                             **VISION_TOKENS)
    vision = dict(depth=spec.vision_depth, hidden_size=spec.vision_hidden_size,
                  intermediate_size=2 * spec.vision_hidden_size, num_heads=2,
                  out_hidden_size=spec.hidden_size, fullatt_block_indexes=[spec.vision_depth - 1],
                  window_size=56)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True,
                            **VISION_TOKENS)


def build_tiny_vl(out_dir: Path, *, tokenizer_dir: Path, spec: TinyVLSpec = TinyVLSpec()) -> Path:
    """Write the tiny model, the tokenizer of `tokenizer_dir` and the image
    processor's preprocessor_config.json into `out_dir`; returns it."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer, GenerationConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    missing = [name for name, i in VISION_TOKENS.items()
               if tokenizer.convert_ids_to_tokens(i) is None]
    assert not missing, f"{tokenizer_dir} lacks the vision tokens {missing}"
    config = tiny_vl_config(spec, vocab_size=151936)  # Qwen2.5's embedding rows
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(spec.seed)
    try:
        model = AutoModelForImageTextToText.from_config(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config = GenerationConfig(eos_token_id=[tokenizer.eos_token_id],
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(out_dir)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer_dir) / name, out_dir / name)
    Qwen2VLImageProcessorPil(min_pixels=spec.min_pixels,
                             max_pixels=spec.max_pixels).save_pretrained(out_dir)
    return out_dir
