"""Sharding a model over the ranks of a worker group with PyTorch FSDP2.

`parallelize` is the one place a model is prepared for several ranks, in
this order: activation checkpointing is already on (set at load), then each
decoder layer is sharded, then the root (embedding, final norm, LM head), so
that one layer's parameters are gathered at a time in forward and backward.
Parameters stay float32 (the master weights); on accelerators FSDP2 casts
them to the compute dtype for the forward and reduces gradients in float32.
"""

from __future__ import annotations

import contextlib
import gc
import math
import weakref
from typing import Callable, Iterator

import torch
from torch import nn

from thinkrl.errors import UserError


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a Hugging Face model, found by the class names
    the model lists in `_no_split_modules` (Qwen2DecoderLayer, ...)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise UserError(f"{type(model).__name__} lists no decoder layer class in "
                         "_no_split_modules, so FSDP2 cannot shard it layer by layer; "
                         "use trainer.backend=local (one device) for this model")
    return layers


def parallelize(model: nn.Module, *, compute_dtype: torch.dtype, param_offload: bool = False,
                reshard_after_forward: bool = True, whole: tuple[nn.Module, ...] = ()) -> nn.Module:
    """Shard `model` in place over the default process group (FSDP2
    `fully_shard`, each decoder layer then the root) and return it.

    compute_dtype: the dtype matmuls run in; below float32 FSDP2 keeps float32
      master weights and casts a gathered copy for the forward.
    param_offload: keep the shards (and their gradients and optimizer states)
      in host memory between uses; the optimizer step then runs on the CPU.
    whole: submodules whose layers are not sharded one by one but with the
      root, so they are gathered at every forward on every rank: a frozen
      vision tower that only some ranks' rows call (a layer's own gather
      would wait for ranks that never reach it).
    """
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                        fully_shard)

    mixed = MixedPrecisionPolicy()
    if compute_dtype != torch.float32:
        mixed = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy() if param_offload else OffloadPolicy()
    options = dict(mp_policy=mixed, offload_policy=offload,
                   reshard_after_forward=reshard_after_forward)
    inside_whole = {id(m) for part in whole for m in part.modules()}
    for layer in decoder_layers(model):
        if id(layer) not in inside_whole:
            fully_shard(layer, **options)
            _RESHARD_AFTER_FORWARD[layer] = reshard_after_forward
    fully_shard(model, **options)
    _RESHARD_AFTER_FORWARD[model] = reshard_after_forward
    # Each rank's loss is already its exact share of the mini-batch loss (the
    # normalisers span all ranks, thinkrl.workers.mini_batches), so gradients
    # are summed over ranks, not averaged as FSDP2 does by default.
    for module in _fsdp_modules(model):
        _sum_gradients_over_ranks(module)
    return model


def build_model(load: Callable[[torch.device], nn.Module], skeleton: Callable[[], nn.Module], *,
                prepare: Callable[[nn.Module], None], shard: Callable[[nn.Module], None],
                device: torch.device, param_offload: bool = False) -> nn.Module:
    """A rank's model. On one process: `load(device)`, then `prepare` it.

    Over several ranks (every rank calls it), only rank 0 reads from disk, and
    into host memory: rank 0 calls `load(cpu)` (the whole model, on the host)
    and keeps its state dict; every rank, rank 0 included, builds `skeleton()`
    (the same architecture on the meta device: no memory), `prepare`s and
    `shard`s it (FSDP2) and allocates its own shards (on `device`, or the host
    with `param_offload`). Rank 0 then broadcasts every tensor from its host
    copy, one at a time, each rank keeping its shard (PyTorch's
    full-state-dict load with `broadcast_from_rank0`), and the host copy is
    dropped. Buffers outside the state dict (rotary tables) are broadcast
    whole. A device holds its rank's shards plus one tensor in flight, never
    the whole model; a node's host memory holds one copy (rank 0's) during
    the build, instead of one per rank (torchtitan's and torchtune's way)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if not dist.is_initialized() or dist.get_world_size() == 1:
        model = load(device)
        prepare(model)
        return model
    host = torch.device("cpu")
    full: dict[str, torch.Tensor] = {}
    computed: dict[str, torch.Tensor] = {}  # rank 0's buffers outside the state dict
    if dist.get_rank() == 0:
        loaded = load(host)
        full = loaded.state_dict()
        computed = {name: b for name, b in loaded.named_buffers() if name not in full}
        del loaded  # its tensors live on in `full` until the broadcast is done
    model = skeleton()
    saved = set(model.state_dict())
    prepare(model)
    shard(model)
    model.to_empty(device=host if param_offload else device)
    for name, buffer in model.named_buffers():
        if name not in saved:  # not persistent: computed at init, garbage after to_empty
            if dist.get_rank() == 0:
                if name not in computed:
                    raise RuntimeError(f"the loaded model has no buffer {name} that its skeleton has: "
                                       "the skeleton and the loader build different architectures")
                buffer.copy_(computed[name])
            dist.broadcast(buffer, src=0)
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                               broadcast_from_rank0=True))
    full.clear()
    computed.clear()
    gc.collect()  # the loaded copy may sit in a reference cycle (a LoRA handle and its model)
    return model


# Each sharded module's own reshard-after-forward setting, restored when a
# `gathered` block ends (FSDP2 has no public getter for it).
_RESHARD_AFTER_FORWARD: "weakref.WeakKeyDictionary[nn.Module, bool]" = weakref.WeakKeyDictionary()


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def as_forward(module: nn.Module, name: str, fn: Callable) -> Callable:
    """`fn` (same arguments, same result) run as a forward of `module`. On an
    FSDP2-sharded module its parameters are gathered before `fn` runs and
    freed after it (as `reshard_after_forward` says), its tensor arguments and
    results carry FSDP2's backward hooks (gathered again for the backward,
    gradients reduce-scattered after it), and floating arguments are cast to
    the compute dtype: everything FSDP2 does around `module.forward`, so `fn`
    may read the module's parameters directly. Registered once per module
    under `name` (PyTorch's `register_fsdp_forward_method`). On an unsharded
    module, `fn` itself."""
    if not is_sharded(module):
        return fn
    if name not in module.__dict__:
        from torch.distributed.fsdp import register_fsdp_forward_method
        module.__dict__[name] = fn  # an instance attribute: called unbound, as fn(*args)
        register_fsdp_forward_method(module, name)
    return getattr(module, name)


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Full weights on every rank for the duration (one all-gather per
    sharded module on entry, freed on exit): a rollout decodes hundreds of
    tokens, each a forward pass, and must not gather the weights for each.

    Inside, forwards run no collective, so ranks may decode different numbers
    of tokens: every sharded module, the root included, is told not to
    reshard after its forward (a module that did would all-gather again at
    its next forward, a collective the ranks that stopped decoding never
    join). Each module's own setting is restored on exit. A no-op for an
    unsharded model."""
    modules = _fsdp_modules(model)
    if not modules:
        yield
        return
    for module in modules:
        _set_reshard_after_forward(module, False)
    for module in modules:
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
        for module in modules:
            _set_reshard_after_forward(module, _RESHARD_AFTER_FORWARD.get(module, True))


# FSDP2 across torch releases: `fully_shard` is public from torch 2.6; two
# switches thinkrl needs became public methods in 2.8. On 2.6 and 2.7 the
# functions below set the same field of each parameter group those methods set.
MIN_TORCH = (2, 6)


def _param_groups(module: nn.Module) -> list:
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)  # torch >= 2.8: a list
    if groups is None:
        groups = [] if state._fsdp_param_group is None else [state._fsdp_param_group]
    return list(groups)


def _sum_gradients_over_ranks(module: nn.Module) -> None:
    """Reduce-scatter gradients as a plain sum over ranks (see `parallelize`)."""
    if hasattr(module, "set_force_sum_reduction_for_comms"):  # torch >= 2.8
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
        return
    # torch 2.6/2.7 would average (ReduceOp.AVG, which gloo lacks), and their
    # set_reduce_scatter_divide_factor builds NCCL's PreMulSum (NCCL only).
    import torch.distributed as dist
    for group in _param_groups(module):
        group.reduce_scatter_reduce_op = dist.ReduceOp.SUM


def _set_reshard_after_forward(module: nn.Module, reshard: bool) -> None:
    """`module`'s own reshard-after-forward setting, not its children's."""
    if hasattr(module, "set_reshard_after_forward"):  # torch >= 2.8
        module.set_reshard_after_forward(reshard, recurse=False)
        return
    for group in _param_groups(module):  # what that method sets, for a bool
        group.post_forward_mesh_info = group.mesh_info if reshard else None


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective: every rank must call it); a
    plain tensor as it is."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


_NORM_ROW = 4096  # elements per float32 partial norm (`square_sum`)
_NORM_BLOCK = 1 << 24  # elements per reduction: bounds a bfloat16 tensor's float32 copy to 64 MiB


@torch.no_grad()
def parameter_stats(model: nn.Module) -> dict:
    """Over the parameters this process holds (its shards when sharded): the
    names of those holding NaN or inf, and the sum of their squares.
    Summing square_sum over ranks gives the whole model's squared L2 norm.

    No float64 copy of any weight (at 7B those were 8 bytes an element and the
    guard's whole cost): see `square_sum`. A tensor whose sum is not finite
    holds NaN or inf, or finite values whose squares overflow float32
    (|x| > 1.8e19): only then is it looked at element by element (and such
    a tensor's sum is taken in float64)."""
    nonfinite, total = [], 0.0
    for name, p in model.named_parameters():
        local = (p.to_local() if hasattr(p, "to_local") else p).detach()
        squares = square_sum(local)
        if not math.isfinite(squares):
            if not bool(torch.isfinite(local).all()):
                nonfinite.append(name)
                total += squares  # not finite either
                continue
            squares = float(local.double().pow(2).sum())
        total += squares
    return {"nonfinite": nonfinite, "square_sum": total}


def square_sum(tensor: torch.Tensor) -> float:
    """sum_i x_i^2 of any float tensor, as float32 norms of rows of
    `_NORM_ROW` elements whose squares add up in float64, `_NORM_BLOCK`
    elements per reduction (a float32 tensor is not copied; a bfloat16 one
    is widened a block at a time). One float32 norm over a whole embedding
    (136M elements) was 3% off; rows keep it within 1e-7."""
    flat = tensor.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=flat.device)
    for block in flat.split(_NORM_BLOCK):
        whole = block.numel() - block.numel() % _NORM_ROW
        rows = torch.linalg.vector_norm(block[:whole].view(-1, _NORM_ROW), dim=1, dtype=torch.float32)
        tail = torch.linalg.vector_norm(block[whole:], dtype=torch.float32)
        total += rows.double().pow(2).sum() + tail.double().pow(2)
    return float(total)
