"""Weights in a Hugging Face folder: its safetensors files, read into and
checked against a model of this run (a checkpoint's `actor/` folder)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from thinkrl.errors import UserError


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a Hugging Face folder (one file, or the shards
    its index lists)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / name for name in shards]
    single = folder / "model.safetensors"
    if not single.is_file():
        raise UserError(f"{folder}: no model.safetensors (nor an index of shards)")
    return [single]


def read_weights(model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of the Hugging Face folder `folder`, on `model`'s device,
    named as `model` names them."""
    from safetensors.torch import load_file

    device = next(model.parameters()).device
    tensors: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        tensors.update(load_file(path, device=str(device)))
    if not tensors.keys() <= model.state_dict().keys():
        return _converted(model, folder) or tensors
    return tensors


def _converted(model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor] | None:
    """The folder's weights as transformers' own loading converts them, or
    None when that does not give `model`'s names either. transformers 5 saves
    some layers in its checkpoint layout, not the module's (a mixture of
    experts' fused `experts.gate_up_proj` as one tensor per expert and
    projection) and converts them back when it loads: the same load, read
    back (a second copy of the model in host memory, for this one read)."""
    from thinkrl.models.loading import load_causal_lm

    parameter = next(model.parameters())
    try:
        loaded = load_causal_lm(str(folder), dtype=parameter.dtype, device=torch.device("cpu"))
    except (OSError, ValueError):  # not a causal LM's folder (a critic's value model)
        return None
    tensors = loaded.state_dict()
    if not tensors.keys() <= model.state_dict().keys():
        return None
    return {name: tensor.to(parameter.device) for name, tensor in tensors.items()}


def copy_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """Copy `tensors` (read from `folder`) into `model` in place. A key missing
    from them is accepted only when its tensor is tied to one that was loaded
    (an LM head sharing the embedding)."""
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in tensors if k in current}
    untied = [k for k in missing if current[k].data_ptr() not in loaded]
    if untied or unexpected:
        raise UserError(f"{folder}: the saved weights do not match the model of this run "
                         f"(missing: {untied[:5]}, unexpected: {list(unexpected)[:5]}); was the "
                         "checkpoint made with another actor_rollout_ref.model.path?")
