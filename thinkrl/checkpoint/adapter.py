"""A LoRA actor in a checkpoint: the adapter and its optimizer state only.

    actor/adapter_config.json         PEFT's adapter folder (loads with
    actor/adapter_model.safetensors   PeftModel.from_pretrained on the base);
                                      base_model_name_or_path names the base
    optimizer.pt                      AdamW's state of the adapter (one process), or
    actor_dcp/                        the adapter's shards and their AdamW state
                                      (several ranks, torch.distributed.checkpoint)

The base weights are never saved: they are the frozen model at
actor_rollout_ref.model.path, loaded again on resume. Either layout resumes
on any number of ranks, as full checkpoints do (`thinkrl.checkpoint.sharded`).
Every rank calls these functions (collectives under a process group).
"""

from __future__ import annotations

from pathlib import Path

import torch

from thinkrl.checkpoint.sharded import ACTOR_FILES, RoleFiles, _by_name, _load_dcp, is_sharded_checkpoint
from thinkrl.errors import UserError
from thinkrl.models.lora import ADAPTER_CONFIG, Lora
from thinkrl.parallel.distributed import rank
from thinkrl.parallel.fsdp import full_tensor, is_sharded


def is_adapter_checkpoint(folder: Path, files: RoleFiles = ACTOR_FILES) -> bool:
    return (folder / files.hf_dir / ADAPTER_CONFIG).is_file()


def _trainable_only():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(ignore_frozen_params=True)


def save_adapter(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, lora: Lora,
                 folder: Path, *, base_model: str, files: RoleFiles = ACTOR_FILES) -> None:
    """The adapter (every trainable tensor: a critic's value head too) as
    PEFT's folder in folder/actor or folder/critic (`files`; written by rank 0
    from whole tensors), and AdamW's state beside it (not for a weights-only
    save: `optimizer` None)."""
    tensors = {name: full_tensor(p.detach()) for name, p in model.named_parameters() if p.requires_grad}
    if rank() == 0:
        lora.save(folder / files.hf_dir, tensors, base_model=base_model)
    if optimizer is None:
        return
    if not is_sharded(model):
        torch.save(optimizer.state_dict(), folder / files.optimizer_file)
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer, options=_trainable_only())
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / files.dcp_dir))


def load_adapter(model: torch.nn.Module, optimizer: torch.optim.Optimizer, lora: Lora,
                 folder: Path, files: RoleFiles = ACTOR_FILES) -> None:
    """The checkpoint's adapter and AdamW state into `model` and `optimizer`,
    however `model` is sharded now; everything is read before anything changes."""
    key = "actor_rollout_ref.model" if files == ACTOR_FILES else "critic.model"
    if not is_adapter_checkpoint(folder, files):
        raise UserError(f"{folder} holds a fully fine-tuned {files.hf_dir}, not a LoRA adapter: resume it "
                         f"with {key}.lora_rank=0, or start a new LoRA run (another "
                         "trainer.default_local_dir), or start from its weights: export it and set "
                         f"{key}.path to the export")
    _check_same_adapter(lora, folder, files, key)
    if is_sharded_checkpoint(folder, files):  # frozen entries are neither saved nor expected
        from torch.distributed.checkpoint.state_dict import StateDictOptions
        _load_dcp(model, optimizer, folder, files,
                  options=StateDictOptions(ignore_frozen_params=True, strict=False))
        return
    tensors = lora.load_tensors(folder / files.hf_dir)
    saved_optimizer = torch.load(folder / files.optimizer_file, map_location="cpu", weights_only=True)
    if not is_sharded(model):
        model.load_state_dict(tensors, strict=False)  # exactly the adapter's tensors (load_tensors)
        optimizer.load_state_dict(saved_optimizer)
        return
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
    set_optimizer_state_dict(model, optimizer, _by_name(model, saved_optimizer),
                             options=StateDictOptions(full_state_dict=True))


def _check_same_adapter(lora: Lora, folder: Path, files: RoleFiles, key: str) -> None:
    """The checkpoint's rank, alpha and targets are this run's: another alpha
    would resume a different policy silently, another rank fail on shapes."""
    from thinkrl.models.lora import read_adapter_config

    saved, now = read_adapter_config(folder / files.hf_dir), lora.config
    targets = lambda t: sorted(t) if isinstance(t, (list, set, tuple)) else t  # noqa: E731
    pairs = {"lora_rank": (saved.get("r"), now.r), "lora_alpha": (saved.get("lora_alpha"), now.lora_alpha),
             "target_modules": (targets(saved.get("target_modules")), targets(now.target_modules))}
    changed = [f"{key} {was!r} -> {is_!r}" for key, (was, is_) in pairs.items()
               if (float(was) != float(is_) if key == "lora_alpha" else was != is_)]
    if changed:
        raise UserError(f"{folder}'s adapter was trained with other settings ({', '.join(changed)}); "
                         f"resume with the ones it was saved with ({key}.lora_rank, lora_alpha, "
                         "target_modules) or start a new run directory")


def refuse_adapter_checkpoint_for_full_run(folder: Path, files: RoleFiles = ACTOR_FILES) -> None:
    """A LoRA checkpoint cannot resume a run that trains every weight."""
    if is_adapter_checkpoint(folder, files):
        raise UserError(f"{folder} holds a LoRA adapter ({files.hf_dir}/{ADAPTER_CONFIG}), and this run "
                         "trains every weight: resume it with the lora_rank it was saved with, or merge it "
                         "(`thinkrl export --merge`) and start from that folder")


def adapter_base(adapter_dir: Path, base: str | None = None) -> str:
    """The base model an adapter folder was trained on: `base` when given,
    else its adapter_config.json's base_model_name_or_path."""
    from thinkrl.models.lora import read_adapter_config

    named = base or read_adapter_config(adapter_dir).get("base_model_name_or_path")
    if not named:
        raise UserError(f"{adapter_dir}/{ADAPTER_CONFIG} names no base model; pass --base FOLDER")
    local = Path(named).expanduser()
    if not local.exists() and (named.startswith(("/", ".", "~")) or named.count("/") > 1):
        raise UserError(f"the base model {named} that {adapter_dir} was trained on is not there; "
                         "pass --base with the base model's folder or hub id")
    return str(local.resolve()) if local.exists() else named


def write_merged_model(adapter_dir: Path, out: Path, *, base: str | None = None) -> str:
    """A Hugging Face folder in `out` (config.json, generation_config.json,
    model.safetensors): the base with the adapter of `adapter_dir` merged in,
    W + s B A in float32 (`thinkrl.models.lora.merged_tensors`: the weights an
    engine is sent during training). The base folder is only read. Returns
    the base used."""
    from thinkrl.models.loading import load_causal_lm
    from thinkrl.models.lora import LoraSettings, attach_lora, load_adapter_weights, merged_tensors

    base = adapter_base(adapter_dir, base)
    settings = LoraSettings(rank=0, alpha=0.0, target_modules=(), adapter_path=str(adapter_dir))
    model = load_causal_lm(base, dtype=torch.float32, device=torch.device("cpu"))
    lora = attach_lora(model, settings)
    load_adapter_weights(lora, adapter_dir)
    merged = dict(merged_tensors(model.state_dict().items(), lora.scalings()))
    plain = lora.peft_model.unload()  # the base module again, its layers plain nn.Linear
    plain.load_state_dict(merged)
    plain.save_pretrained(out)
    return base
