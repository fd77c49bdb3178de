"""Vision-language policies: which models, how they load, what their passes need.

Qwen2.5-VL and Qwen2-VL (one code path in transformers) are supported. Text
prompts on them run exactly as on a causal LM: for a sequence without image
tokens, M-RoPE's three position components are all the 1-D position, which
is what the model builds from [N, S] position ids. Image prompts add
`pixel_values` and `image_grid_thw` (a `ModelInputs` record) and 3-D
positions from the model's own `get_rope_index`, computed once at prefill and
extended for the response (`ModelInputs.sequence_positions`), so the rollout,
the log-prob passes and the update all use the same positions.

Shapes: N rows, S tokens, Q image patches in the batch, D patch features.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from torch import Tensor

from thinkrl.errors import SetupError
from thinkrl.records import ModelInputs

SUPPORTED = {"qwen2_5_vl": "Qwen2.5-VL", "qwen2_vl": "Qwen2-VL"}
"""config.json model_type -> name, for the vision-language models thinkrl trains."""


def model_type(path: str) -> str | None:
    """config.json's model_type of a local model folder (None when unreadable:
    the normal loader then reports the problem)."""
    config = Path(path).expanduser() / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError):
        return None


@functools.cache
def is_vision_model(path: str) -> bool:
    """Whether the folder holds a supported VL model; SetupError for an
    unsupported one (its config has a vision part that thinkrl cannot feed)."""
    kind = model_type(path)
    if kind in SUPPORTED:
        return True
    config = Path(path).expanduser() / "config.json"
    try:
        raw = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    if "vision_config" in raw:
        raise SetupError(
            f"actor_rollout_ref.model.path={path!r} is a vision-language model of type "
            f"{kind!r}, which thinkrl cannot train yet",
            f"use one of {', '.join(SUPPORTED.values())} (model_type "
            f"{', '.join(SUPPORTED)}), or a text-only causal LM")
    return False


def load_vision_model(path: str, *, dtype: torch.dtype, trust_remote_code: bool = False,
                      **overrides) -> torch.nn.Module:
    """The image-text-to-text model of `path` (Qwen2_5_VLForConditionalGeneration);
    `overrides` are config fields (actor_rollout_ref.model.override_config)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(
        path, dtype=dtype, trust_remote_code=trust_remote_code, **overrides)


def apply_model_settings(model: torch.nn.Module, model_cfg) -> None:
    """model.freeze_vision_tower on a VL model (before the optimizer is made)."""
    if model_cfg.freeze_vision_tower and getattr(model.config, "vision_config", None) is not None:
        freeze_vision_tower(model)


def vision_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The ViT and its merger (`model.model.visual` in transformers 5)."""
    inner = getattr(model, "model", model)
    tower = getattr(inner, "visual", None) or getattr(model, "visual", None)
    assert tower is not None, f"{type(model).__name__} has no vision tower"
    return tower


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop gradients into the vision tower (actor.freeze_vision_tower): the
    optimizer then holds no state for it. Returns the frozen parameter count."""
    tower = vision_tower(model)
    tower.requires_grad_(False)
    return sum(p.numel() for p in tower.parameters())


def prompt_positions(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                     image_grid_thw: Tensor | None) -> Tensor:
    """M-RoPE positions [N, 3, P] of left-padded prompts, from the model's own
    `get_rope_index` (pads get 0). Text runs count up by one in all three
    components; an image's tokens get (t, row, column) offsets from the
    position where it starts, and the text after it resumes at that start
    plus the image's larger side in merged patches. `image_grid_thw` [I, 3]
    lists the batch's images in row order."""
    inner = getattr(model, "model", model)
    image_token_id = model.config.image_token_id
    token_types = (input_ids == image_token_id).int()  # 1 marks an image token
    positions, _ = inner.get_rope_index(input_ids, mm_token_type_ids=token_types,
                                        image_grid_thw=image_grid_thw,
                                        attention_mask=attention_mask)
    return positions.permute(1, 0, 2).contiguous()  # [3, N, P] -> [N, 3, P]


def to_model_positions(position_ids: Tensor) -> Tensor:
    """Our row-first [N, 3, S] M-RoPE positions in the model's [3, N, S]
    layout; [N, S] positions unchanged."""
    return position_ids.permute(1, 0, 2) if position_ids.ndim == 3 else position_ids


def image_kwargs(inputs: ModelInputs | None, device: torch.device) -> dict:
    """`pixel_values` [Q, D] and `image_grid_thw` [I, 3] of the rows of
    `inputs`, on `device`; {} when no row has an image."""
    if inputs is None:
        return {}
    grids = [g for g in inputs.image_grid_thw if g.numel()]
    if not grids:
        return {}
    pixels = [v for v in inputs.pixel_values if v.numel()]  # rows in order, as the image tokens
    return {"pixel_values": torch.cat(pixels).to(device),
            "image_grid_thw": torch.cat(grids).to(device)}


def with_prompt_positions(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                          inputs: ModelInputs) -> ModelInputs:
    """`inputs` with its prompt_positions [N, 3, P] computed (CPU)."""
    grids = [g for g in inputs.image_grid_thw if g.numel()]
    positions = prompt_positions(model, input_ids.cpu(), attention_mask.cpu(),
                                 torch.cat(grids) if grids else None)
    return ModelInputs(inputs.pixel_values, inputs.image_grid_thw, positions)


PROCESSOR_FILES = ("preprocessor_config.json", "chat_template.json", "chat_template.jinja",
                   "processor_config.json", "video_preprocessor_config.json")
"""What a VL model folder holds beside the weights and tokenizer: checkpoints
and exports carry them so that they load (and evaluate) like the original."""


def copy_processor_files(model_path: str, out: Path) -> None:
    """Copy the model folder's processor files into `out` (a checkpoint's actor folder)."""
    import shutil

    source = Path(model_path).expanduser()
    for name in PROCESSOR_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, Path(out) / name)


def unsplit_modules(model: torch.nn.Module, model_cfg) -> tuple[torch.nn.Module, ...]:
    """What FSDP2 shards with the root instead of block by block: a frozen
    vision tower, so that ranks whose rows hold no image need not call it
    (image prompts under trainer.backend=ray need model.freeze_vision_tower)."""
    if model_cfg.freeze_vision_tower and getattr(model.config, "vision_config", None) is not None:
        return (vision_tower(model),)
    return ()
