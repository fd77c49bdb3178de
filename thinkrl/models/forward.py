"""Per-token log-probs (and entropies) of the response part of sequences.

Sequences follow the layout of `thinkrl.records`: left-padded prompt, then
R right-padded response tokens. The logits that predict response token t sit
at column P - 1 + t, so only the last R + 1 positions' logits are computed.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

import torch
from torch import Tensor

from thinkrl.models.logprobs import entropy_from_logits, logprobs_from_logits
from thinkrl.models.vision import image_kwargs, to_model_positions
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
                      model_inputs: ModelInputs | None = None
                      ) -> tuple[Tensor, Tensor | None]:
    """log pi(y_t | y_<t) under softmax(logits / temperature), and optionally the
    entropy of that distribution. Inputs [N, P + R] on the model's device;
    returns [N, R] tensors on the same device. The entropy carries a gradient
    only with `entropy_grad` (an entropy bonus); as a metric it needs none.

    Dividing by the sampling temperature makes these the log-probs of the
    distribution the responses were actually drawn from (as verl does).

    VL models: `model_inputs` holds the rows' images and `position_ids` are
    M-RoPE's [N, 3, P + R] (thinkrl.models.vision)."""
    logits, _ = last_logits(model, response_length + 1, input_ids=input_ids,
                            attention_mask=attention_mask,
                            position_ids=to_model_positions(position_ids), use_cache=False,
                            **image_kwargs(model_inputs, input_ids.device))
    logits = logits[:, :-1, :]  # [N, R, V]
    if temperature != 1.0 and temperature > 0:
        logits = logits / temperature
    labels = input_ids[:, -response_length:]
    logprobs = logprobs_from_logits(logits, labels)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits if entropy_grad else logits.detach())
    return logprobs, entropy


@torch.no_grad()
def batched_response_logprobs(model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor,
                              position_ids: Tensor, *, response_length: int, temperature: float,
                              micro_batch_size: int, autocast=contextlib.nullcontext,
                              device: torch.device | None = None,
                              model_inputs: ModelInputs | None = None) -> Tensor:
    """`response_logprobs` without gradient, `micro_batch_size` rows at a time.
    CPU tensors in, CPU [N, R] out."""
    device = device or next(model.parameters()).device  # offloaded shards: the compute device
    was_training = model.training
    model.eval()
    chunks = []
    try:
        for start in range(0, input_ids.shape[0], micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            with autocast():
                logprobs, _ = response_logprobs(
                    model, input_ids[rows].to(device), attention_mask[rows].to(device),
                    position_ids[rows].to(device), response_length=response_length,
                    temperature=temperature,
                    model_inputs=None if model_inputs is None else model_inputs.select(rows))
            chunks.append(logprobs.float().cpu())
    finally:
        model.train(was_training)
    return torch.cat(chunks)
