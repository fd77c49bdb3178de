"""Per-token log-probs (and entropies) of the response part of sequences.

Sequences follow the layout of `thinkrl.records`: left-padded prompt, then
R right-padded response tokens. The logits that predict response token t sit
at column P - 1 + t, so only the last R + 1 positions' logits are computed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from thinkrl.models.fused_head import head_logprobs
from thinkrl.models.lean_decoder import LeanSpec, lean_spec
from thinkrl.models.logprobs import entropy_from_logits, logprobs_from_logits
from thinkrl.models.micro_batches import agreed_micro_batches, micro_batch_rows
from thinkrl.models.routing import RouteTape, recording, replaying, tape_busy
from thinkrl.models.shared_prompt import shared_prompt_hidden, shared_prompt_logits
from thinkrl.models.vision import image_kwargs, to_model_positions
from thinkrl.parallel.fsdp import as_forward
from thinkrl.records import ModelInputs


def last_logits(model: torch.nn.Module, keep: int, **inputs) -> tuple[Tensor, object]:
    """The logits of the last `keep` positions [N, keep, V] and the model output.
    Asks the model to compute only those (`logits_to_keep`) when it can: a
    150k-token vocabulary over every prompt position would dwarf the rest."""
    if forward_accepts(type(model), "logits_to_keep"):
        out = model(**inputs, logits_to_keep=keep)
        return out.logits[:, -keep:, :], out
    out = model(**inputs)  # custom (remote-code) models may lack the argument
    return out.logits[:, -keep:, :], out


@functools.cache
def forward_accepts(model_class: type, argument: str) -> bool:
    """Whether `model_class.forward` takes `argument` (its name changes across
    transformers versions, and remote-code models may lack it)."""
    return argument in inspect.signature(model_class.forward).parameters


def response_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                      position_ids: Tensor, *, response_length: int, temperature: float,
                      with_entropy: bool = False, entropy_grad: bool = False,
                      model_inputs: ModelInputs | None = None,
                      remove_padding: bool = False,
                      fused_head: bool = False) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | y_<t) under softmax(logits / temperature), and optionally the
    entropy of that distribution. Inputs [N, P + R] on the model's device;
    returns [N, R] tensors on the same device. The entropy carries a gradient
    only with `entropy_grad` (an entropy bonus); as a metric it needs none.

    Dividing by the sampling temperature makes these the log-probs of the
    distribution the responses were actually drawn from (as verl does).

    VL models: `model_inputs` holds the rows' images and `position_ids` are
    M-RoPE's [N, 3, P + R] (thinkrl.models.vision), and take the padded forward.

    With `remove_padding` (model.use_remove_padding) plain Llama/Qwen2
    decoders take the shared-prompt pass (`thinkrl.models.shared_prompt`:
    each distinct prompt computed once, response columns past the longest
    response of these rows not computed: their log-probs and entropies are 0,
    and every loss masks them). Equal to the padded forward up to float32
    rounding (tests: <= 2e-6 on log-probs on one process; <= 1e-5 on 2 FSDP2
    ranks, with wider test weights); other models always take the padded one.
    With `fused_head` too (model.use_fused_kernels) that pass never holds
    more than a chunk of tokens' logits (`thinkrl.models.fused_head`)."""
    spec = lean_spec(model) if remove_padding and model_inputs is None else None
    if remove_padding and spec is None:
        _say_padded_once(model, images=model_inputs is not None)
    if spec is not None and tape_busy(model):  # router replay's routes follow the padded order
        spec = None
    if spec is not None:  # one forward of the root module (embedding, final norm, head)
        shared = as_forward(model, "thinkrl_shared_prompt_logprobs", _shared_prompt_logprobs)
        return shared(spec, input_ids, attention_mask, position_ids,
                      response_length=response_length, temperature=temperature,
                      with_entropy=with_entropy, entropy_grad=entropy_grad, fused_head=fused_head)
    logits, _ = last_logits(model, response_length + 1, input_ids=input_ids,
                            attention_mask=attention_mask,
                            position_ids=to_model_positions(position_ids), use_cache=False,
                            **image_kwargs(model_inputs, input_ids.device))
    logits = logits[:, :-1, :]  # [N, R, V]
    return _logprobs_and_entropy(logits, input_ids[:, -response_length:], temperature=temperature,
                                 with_entropy=with_entropy, entropy_grad=entropy_grad)


_SAID: set[str] = set()


def _say_padded_once(model: torch.nn.Module, *, images: bool) -> None:
    """model.use_remove_padding=True on a model the shared-prompt pass does not
    compute: it takes the padded forward, said once per architecture."""
    kind = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    if kind in _SAID:
        return
    _SAID.add(kind)
    what = ("rows with images take" if images else
            f"{kind} models take (the pass computes llama, qwen2, mistral and qwen3 decoders with "
            "default RoPE, SiLU, full attention and plain or LoRA projections)")
    logging.getLogger("thinkrl").warning(
        "actor_rollout_ref.model.use_remove_padding=True: %s the padded forward, not the shared-prompt "
        "pass", what)


def _logprobs_and_entropy(logits: Tensor, labels: Tensor, *, temperature: float,
                          with_entropy: bool, entropy_grad: bool) -> tuple[Tensor, Tensor | None]:
    """logits [N, R, V] (before temperature), labels [N, R] -> log-probs, entropies [N, R]."""
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    logprobs = logprobs_from_logits(logits, labels)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy


def _shared_prompt_logprobs(spec: LeanSpec, input_ids: Tensor, attention_mask: Tensor,
                            position_ids: Tensor, *, response_length: int, temperature: float,
                            with_entropy: bool, entropy_grad: bool, fused_head: bool
                            ) -> tuple[Tensor, Tensor | None]:
    """`response_logprobs` by the shared-prompt pass over the first R' columns
    (R' = the longest response here), zero-padded back to [N, R]."""
    p = input_ids.shape[1] - response_length
    lengths = attention_mask[:, p:].sum(-1)
    kept = max(1, int(lengths.max()))  # right padding: columns past every response hold pads only
    inputs = (input_ids[:, :p + kept], attention_mask[:, :p + kept], position_ids[:, :p + kept])
    labels = input_ids[:, p:p + kept]
    if fused_head:
        head = spec.model.lm_head
        logprobs, entropy = head_logprobs(
            shared_prompt_hidden(spec, *inputs, response_length=kept), head.weight, head.bias,
            labels, temperature=temperature, with_entropy=with_entropy, entropy_grad=entropy_grad)
    else:
        logits = shared_prompt_logits(spec, *inputs, response_length=kept)
        logprobs, entropy = _logprobs_and_entropy(logits, labels, temperature=temperature,
                                                  with_entropy=with_entropy,
                                                  entropy_grad=entropy_grad)
    pad = (0, response_length - kept)
    return F.pad(logprobs, pad), None if entropy is None else F.pad(entropy, pad)


@torch.no_grad()
def batched_response_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                              position_ids: Tensor, *, response_length: int, temperature: float,
                              micro_batch_size: int, autocast=contextlib.nullcontext,
                              device: torch.device | None = None,
                              model_inputs: ModelInputs | None = None,
                              remove_padding: bool = False, fused_head: bool = False,
                              max_tokens: int | None = None, routes: Tensor | None = None,
                              tape: RouteTape | None = None, record_into: Tensor | None = None) -> Tensor:
    """`response_logprobs` without gradient, through `in_micro_batches`. CPU
    tensors in, CPU [N, R] out. With `routes` [N, P + R, L, k] and the model's
    `tape` (router replay), every pass replays them and tallies how often its
    own routing agrees. With `record_into` [N, P + R, L, k] (router replay R2)
    the routes the passes took are written there instead."""
    device = device or next(model.parameters()).device  # offloaded shards: the compute device

    def logprobs(rows: slice) -> Tensor:
        with replaying(tape, None if routes is None else routes[rows], count=True), \
                recording(tape if record_into is not None else None):
            ids = input_ids[rows]
            out, _ = response_logprobs(
                model, ids.to(device), attention_mask[rows].to(device),
                position_ids[rows].to(device), response_length=response_length,
                temperature=temperature, remove_padding=remove_padding, fused_head=fused_head,
                model_inputs=None if model_inputs is None else model_inputs.select(rows))
            if record_into is not None:
                record_into[rows] = tape.take(ids.numel()).view(*ids.shape, tape.layers, -1).cpu()
        return out

    return in_micro_batches(model, logprobs, attention_mask, micro_batch_size=micro_batch_size,
                            max_tokens=max_tokens, width=response_length, device=device,
                            autocast=autocast)


@torch.no_grad()
def in_micro_batches(model: torch.nn.Module, compute: Callable[[slice], Tensor], attention_mask: Tensor,
                     *, micro_batch_size: int, max_tokens: int | None, width: int,
                     device: torch.device, autocast=contextlib.nullcontext) -> Tensor:
    """A no-grad pass of `model` (in eval mode) over N rows, `micro_batch_size`
    rows at a time (or, with `max_tokens`, as many rows as fit that many
    tokens: `micro_batch_rows`): `compute(rows)` gives [n, width] for each
    micro-batch; [N, width] float32 on the CPU out. With several ranks a
    collective: every rank calls it, also one with no rows (its passes are
    idle ones, up to the largest count of any rank)."""
    was_training = model.training
    model.eval()
    chunks = [torch.zeros(0, width)]
    try:
        cuts = micro_batch_rows(attention_mask.sum(-1), micro_batch_size=micro_batch_size,
                                max_tokens=max_tokens)
        for rows in agreed_micro_batches(cuts, device=device):
            with autocast():
                if rows is None:  # another rank has more micro-batches: join its collectives
                    idle_pass(model, device=device)
                    continue
                out = compute(rows)
            chunks.append(out.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(chunks)


def idle_pass(model: torch.nn.Module, *, device: torch.device, backward: bool = False) -> None:
    """One forward (and with `backward`, one backward) of a one-token row,
    the result dropped and the gradient it leaves exactly zero: a rank with
    fewer micro-batches than another runs it in place of the missing ones,
    so that it joins the collectives the sharded model runs in every pass
    (`thinkrl.models.micro_batches.agreed_micro_batches`)."""
    one = torch.ones(1, 1, dtype=torch.long, device=device)
    out = model(input_ids=torch.zeros_like(one), attention_mask=one, use_cache=False)
    if backward:
        (out.logits.float().sum() * 0.0).backward()
