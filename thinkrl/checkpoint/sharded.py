"""The actor's weights and optimizer in a checkpoint, sharded or whole.

Two layouts of `global_step_N/`, both read by both backends:

    actor/model.safetensors + optimizer.pt    one process (local backend): a
                                              Hugging Face folder and AdamW's
                                              state dict
    actor_dcp/                                several ranks (ray backend):
                                              torch.distributed.checkpoint, one
                                              file per rank plus .metadata;
                                              actor/ then holds config and
                                              tokenizer only

DCP reshards on load, so a checkpoint written by 2 ranks resumes on 1 or on
4, and a local one resumes on several ranks (each rank takes its shard of
the full tensors). Every rank calls these functions (they are collectives
under a process group).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from thinkrl.checkpoint.hf_weights import copy_weights, read_weights
from thinkrl.errors import UserError

ACTOR_DIR = "actor"
DCP_DIR = "actor_dcp"
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class RoleFiles:
    """Where one trained role's weights and optimizer go in a checkpoint folder."""
    hf_dir: str
    dcp_dir: str
    optimizer_file: str


ACTOR_FILES = RoleFiles(ACTOR_DIR, DCP_DIR, OPTIMIZER_FILE)
CRITIC_FILES = RoleFiles("critic", "critic_dcp", "critic_optimizer.pt")
"""PPO's value model (thinkrl.workers.critic), in the same two layouts."""


def is_sharded_checkpoint(folder: Path, files: RoleFiles = ACTOR_FILES) -> bool:
    return (folder / files.dcp_dir).is_dir()


def save_role_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                     folder: Path, files: RoleFiles = ACTOR_FILES) -> None:
    """Each rank writes its shards of the role's weights and AdamW state (none
    for a weights-only save: `optimizer` None) under folder/`files.dcp_dir`
    (actor_dcp, critic_dcp)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        state = {"model": get_model_state_dict(model)}
    else:
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
    dcp.save(state, checkpoint_id=str(folder / files.dcp_dir))


def load_role_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    folder: Path, files: RoleFiles = ACTOR_FILES) -> None:
    """Put the checkpoint's weights and optimizer state into `model` and
    `optimizer` in place, whichever layout `folder` has and however `model`
    is sharded now. Everything is read before anything changes."""
    if is_sharded_checkpoint(folder, files):
        _load_dcp(model, optimizer, folder, files)
    else:
        _load_whole(model, optimizer, folder, files)


def write_whole_weights(folder: Path, out: Path) -> None:
    """The weights of the sharded checkpoint `folder` as one Hugging Face
    model.safetensors in `out` (which holds the checkpoint's config.json).
    The model class is the one training loaded (`causal_lm_skeleton`: a
    VL model's image-text-to-text class), its memory allocated, not initialised:
    every saved tensor is read into it."""
    from thinkrl.models.loading import causal_lm_skeleton

    model = causal_lm_skeleton(str(folder / ACTOR_DIR), dtype=torch.float32)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty unties them: the head would be saved twice
    state = {"model": model.state_dict()}
    _check_saved_weights(state["model"], _saved_keys(folder), folder)  # else uninitialised memory
    _dcp_load(state, folder)
    model.load_state_dict(state["model"])
    model.save_pretrained(out)


def _saved_keys(folder: Path, files: RoleFiles = ACTOR_FILES) -> set[str]:
    """Every flattened name a sharded checkpoint holds ("model.<fqn>",
    "optim.state.<fqn>.exp_avg", ...: its DCP metadata)."""
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(folder / files.dcp_dir)).read_metadata().state_dict_metadata)


def _check_saved_weights(model_state: dict, saved: set[str], folder: Path,
                         files: RoleFiles = ACTOR_FILES) -> None:
    """ValueError unless the checkpoint holds every weight of `model_state`."""
    missing = sorted(name for name in model_state if f"model.{name}" not in saved)
    if missing:
        raise UserError(f"{folder / files.dcp_dir} lacks {len(missing)} weight(s) of the model "
                         f"(first: {missing[0]}); the checkpoint is of another model or incomplete")


def _dcp_load(state: dict, folder: Path, files: RoleFiles = ACTOR_FILES, *,
              partial: bool = False) -> None:
    """Fill `state` in place from folder/actor_dcp (`files.dcp_dir`); with
    `partial`, keys the checkpoint lacks keep their values (the caller has
    checked which)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    with warnings.catch_warnings():  # one process reading a sharded checkpoint is intended
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(folder / files.dcp_dir),
                 planner=DefaultLoadPlanner(allow_partial_load=partial))


def _load_dcp(model, optimizer, folder: Path, files: RoleFiles, options=None) -> None:
    """`options` (StateDictOptions): which entries are the role's (a LoRA
    actor's: the trainable ones alone, `thinkrl.checkpoint.adapter`)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    # The current state as the template DCP fills in (shaped like this run's shards).
    model_state, optim_state = get_state_dict(model, optimizer, options=options)
    saved = _saved_keys(folder, files)
    _check_saved_weights(model_state, saved, folder, files)
    # AdamW keeps no state for a parameter that never had a gradient (a VL
    # model's vision tower on text-only prompts), so the checkpoint has none,
    # while the template has every trainable parameter's. Those entries load
    # nothing and are dropped after: the parameter resumes stateless, as saved.
    stateless = {fqn for fqn, values in optim_state["state"].items()
                 if not all(f"optim.state.{fqn}.{key}" in saved for key in values)}
    state = {"model": model_state, "optim": optim_state}
    _dcp_load(state, folder, files, partial=bool(stateless))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"], options=options)
    if stateless:
        for name, param in model.named_parameters():
            if name in stateless:
                optimizer.state.pop(param, None)


def _load_whole(model, optimizer, folder: Path, files: RoleFiles) -> None:
    from thinkrl.parallel.fsdp import is_sharded

    saved_optimizer = torch.load(folder / files.optimizer_file, map_location="cpu", weights_only=True)
    tensors = read_weights(model, folder / files.hf_dir)
    if not is_sharded(model):
        copy_weights(model, tensors, folder / files.hf_dir)
        optimizer.load_state_dict(saved_optimizer)
        return
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         set_model_state_dict,
                                                         set_optimizer_state_dict)
    whole = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, tensors, options=whole)
    set_optimizer_state_dict(model, optimizer, _by_name(model, saved_optimizer), options=whole)


def _by_name(model: torch.nn.Module, saved: dict) -> dict:
    """AdamW's state dict keys parameters by their position in the parameter
    list; the sharded loader wants their names. Positions follow
    model.parameters(), which FSDP2 keeps in the same order."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    groups = []
    for group in saved["param_groups"]:
        groups.append({**group, "params": [names[i] for i in group["params"]]})
    return {"state": {names[i]: value for i, value in saved["state"].items()},
            "param_groups": groups}
