"""A shrunken model of the real one's architecture, for a dress rehearsal.

From the real model's `config.json` only (no weights are read): the same
architecture class, vocabulary, special token ids, rotary settings and tied
or untied head, with the layer count, widths and heads cut down, random
(seeded) weights, and every tokenizer, chat-template and processor file of
the real folder copied beside it. Heads keep what the run's tensor
parallelism needs: key/value heads stay divisible by the rollout's TP when
the real ones are, and GQA stays GQA. A vision-language model gets a
shrunken vision tower with the real image processor.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from thinkrl.errors import UserError

SIDE_FILE_PATTERNS = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py"]
"""What is taken of the real model (a folder, or fetched from the hub): configs,
tokenizer, chat template and processor files; never weights."""


@dataclass(frozen=True)
class ShrinkSpec:
    layers: int = 2
    head_dim: int = 32
    """vLLM's CPU attention takes head_dim 32 and up."""
    gqa_group: int = 2
    """Query heads per key/value head when the real model shares them (GQA)."""
    vision_depth: int = 2
    vision_hidden: int = 32
    seed: int = 0


@dataclass(frozen=True)
class ShrunkModel:
    path: Path
    real_type: str
    """The real config's model_type."""
    architecture: str
    parameters: int
    summary: str
    """"qwen2: 28 -> 2 layers, hidden 3584 -> 256, heads 28/4 -> 8/4" and the like."""


def shrunk_config(real, *, tensor_parallel: int = 1, spec: ShrinkSpec = ShrinkSpec()):
    """A deep copy of the Hugging Face config `real`, shrunk (see the module doc)."""
    config = copy.deepcopy(real)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads, kv = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or \
        text.num_attention_heads
    tp = max(tensor_parallel, 1)
    small_kv = tp if kv % tp == 0 else kv  # the same sharding of K/V heads over the TP ranks
    if small_kv == 1 and kv > 1:
        small_kv = 2
    small_heads = min(small_kv * (spec.gqa_group if heads > kv else 1), heads)
    head_dim = min(getattr(text, "head_dim", None) or text.hidden_size // heads, spec.head_dim)
    hidden = small_heads * head_dim  # never wider than the real model
    layers = min(text.num_hidden_layers, spec.layers)
    text.num_hidden_layers, text.hidden_size = layers, hidden
    text.num_attention_heads, text.num_key_value_heads = small_heads, small_kv
    text.intermediate_size = min(text.intermediate_size, 2 * hidden)
    for width in ("moe_intermediate_size", "shared_expert_intermediate_size"):  # every expert kept, narrower
        if getattr(text, width, None):
            setattr(text, width, min(getattr(text, width), hidden))
    if getattr(text, "head_dim", None) is not None:
        text.head_dim = head_dim
    if getattr(text, "layer_types", None):  # keep the first and the last layer's kind
        kinds = list(text.layer_types)
        text.layer_types = ([kinds[0]] + [kinds[-1]] * (layers - 1))[:layers]
    if getattr(text, "max_window_layers", None) is not None:
        text.max_window_layers = min(text.max_window_layers, layers)
    for rope in (getattr(text, "rope_parameters", None), getattr(text, "rope_scaling", None)):
        if isinstance(rope, dict) and rope.get("mrope_section"):
            rope["mrope_section"] = scaled_sections(rope["mrope_section"], head_dim // 2)
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        shrink_vision(vision, text_hidden=hidden, spec=spec)
    summary = (f"{real.model_type}: {real.get_text_config().num_hidden_layers} -> {layers} "
               f"layers, hidden {real.get_text_config().hidden_size} -> {hidden}, heads "
               f"{heads}/{kv} -> {small_heads}/{small_kv} (query/key-value)")
    if vision is not None:
        summary += f", vision tower {real.vision_config.depth} -> {spec.vision_depth} blocks"
    if getattr(text, "num_experts", 0):
        summary += (f", {text.num_experts} experts ({text.num_experts_per_tok} active) of width "
                    f"{real.get_text_config().moe_intermediate_size} -> {text.moe_intermediate_size}")
    return config, summary


def scaled_sections(sections: list[int], total: int) -> list[int]:
    """M-RoPE's (t, h, w) split of `total` rotary pairs in the real proportions."""
    whole = sum(sections)
    scaled = [max(1, math.floor(s * total / whole)) for s in sections]
    scaled[-1] += total - sum(scaled)
    return scaled


def shrink_vision(vision, *, text_hidden: int, spec: ShrinkSpec) -> None:
    """A `spec.vision_depth`-block tower whose merger outputs `text_hidden`
    features; patch, merge and temporal sizes (the processor's) stay."""
    vision.depth = spec.vision_depth
    vision.num_heads = 2
    if hasattr(vision, "out_hidden_size"):  # Qwen2.5-VL
        vision.hidden_size, vision.out_hidden_size = spec.vision_hidden, text_hidden
        vision.intermediate_size = 2 * spec.vision_hidden
        vision.fullatt_block_indexes = [spec.vision_depth - 1]
    else:  # Qwen2-VL: embed_dim is the tower's width, hidden_size the merger's output
        vision.embed_dim, vision.hidden_size, vision.mlp_ratio = spec.vision_hidden, text_hidden, 2


def build_shrunk_model(real_path: str, out_dir: Path, *, tensor_parallel: int = 1,
                       spec: ShrinkSpec = ShrinkSpec(), trust_remote_code: bool = False) -> ShrunkModel:
    """Write the shrunken model of `real_path` (a folder, or a hub id whose
    config and tokenizer files are fetched) into `out_dir`."""
    from transformers import AutoConfig

    source = side_files_folder(real_path)
    try:
        real = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise UserError(f"actor_rollout_ref.model.path={real_path}: its config.json does not "
                         f"load ({err}); the rehearsal builds its model from that file") from None
    config, summary = shrunk_config(real, tensor_parallel=tensor_parallel, spec=spec)
    vision = getattr(config, "vision_config", None) is not None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = _random_model(config, vision=vision, seed=spec.seed, trust_remote_code=trust_remote_code)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # the rehearsal prints one table, not save bars
    dtype = getattr(real, "dtype", None) or getattr(real, "torch_dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        model = model.to(dtype)  # saved as the real weights are, so `dtype=auto` means the same
    model.save_pretrained(out_dir)
    # after the save: it writes a generation_config.json of its own, and the real
    # one (stop ids, sampling defaults) is what the run reads
    copy_side_files(Path(source), out_dir)
    return ShrunkModel(path=out_dir, real_type=real.model_type,
                       architecture=(config.architectures or [type(model).__name__])[0],
                       parameters=sum(p.numel() for p in model.parameters()), summary=summary)


def _random_model(config, *, vision: bool, seed: int, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return auto.from_config(config, trust_remote_code=trust_remote_code, dtype=torch.float32)


def side_files_folder(path: str) -> str:
    """A local folder holding `path`'s config, tokenizer and processor files:
    `path` itself, or a snapshot of those files alone from the hub (no weights)."""
    local = Path(path).expanduser()
    if local.is_dir():
        return str(local)
    if local.exists() or path.startswith((".", "/", "~")):
        raise UserError(f"actor_rollout_ref.model.path={path} is not a model folder: point it at "
                         "the folder holding config.json and the tokenizer files")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(path, allow_patterns=SIDE_FILE_PATTERNS)
    except Exception as err:  # offline, unknown repo, gated: the hub's own words
        raise UserError(f"actor_rollout_ref.model.path={path}: its config and tokenizer files "
                         f"could not be fetched from the hub ({type(err).__name__}: {err}); "
                         "download them (config.json and the tokenizer files are enough) and "
                         "give the folder") from None


def copy_side_files(source: Path, out_dir: Path) -> list[str]:
    """The files of `source` matching SIDE_FILE_PATTERNS but config.json (written
    shrunken) and the weights' index: tokenizer, chat template, generation and
    processor configs."""
    copied = []
    for item in sorted(source.iterdir()):
        if (not item.is_file() or item.name == "config.json" or item.name.endswith(".index.json")
                or not any(fnmatch.fnmatch(item.name, p) for p in SIDE_FILE_PATTERNS)):
            continue
        shutil.copy(item, out_dir / item.name)
        copied.append(item.name)
    return copied


def architecture_of(folder: Path) -> dict:
    """What a rehearsal must keep of the real model, read from a folder's
    config.json: architecture, vocabulary and special token ids."""
    config = json.loads((Path(folder) / "config.json").read_text())
    text = config.get("text_config") or config
    return {"architectures": config.get("architectures"), "model_type": config.get("model_type"),
            "vocab_size": text.get("vocab_size", config.get("vocab_size")),
            **{k: text.get(k, config.get(k)) for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                       "tie_word_embeddings")}}
