"""Response logits with each distinct prompt computed once (shared-prompt pass).

The G responses of a GRPO group share their prompt, yet a padded batch runs
that prompt through the model G times in every reference, old-log-prob and
update forward. Here the distinct prompts of a batch run once; each response
attends to its prompt's keys/values (looked up per row, so the gradient of a
shared prompt is the sum over its responses, as in the padded batch) and to
its own earlier tokens. For R1-Zero-style runs (prompts of 100-300 tokens,
n = 8) this removes most prompt FLOPs.

Same numbers as the padded forward up to float32 rounding: every real
position attends to exactly the same keys. Sharded (FSDP2) models too: each
layer runs as a forward of its module (`thinkrl.parallel.fsdp.as_forward`).
Plain Llama/Qwen2/Qwen3 decoders only
(`thinkrl.models.lean_decoder`); the caller falls back to the model's own
forward otherwise.

Shapes: N rows, U distinct prompts, P prompt columns (left-padded), R
response columns, H/K heads, D head dim, E hidden, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torch.utils.checkpoint import checkpoint

from thinkrl.models.lean_decoder import (LeanSpec, attention, final_hidden, finish_layer,
                                         fused_weights_of, head_logits, padding_attention_mask,
                                         project_qkv, rotary_tables, split_weights_of)
from thinkrl.parallel.fsdp import as_forward, is_sharded


def distinct_prompts(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """The first row of each distinct (ids, mask) prompt [U] and, per row,
    the index of its prompt among those [N]. Rows keep their first-seen order."""
    key = torch.cat((prompt_ids, prompt_mask.to(prompt_ids.dtype)), dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    n = prompt_ids.shape[0]
    first = torch.full((int(inverse.max()) + 1,), n, dtype=torch.long, device=prompt_ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(n, device=prompt_ids.device), "amin")
    order = torch.argsort(first)  # unique sorts lexicographically; renumber by first row
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    return first[order], rank[inverse]


def response_mask_for_shared(prompt_mask: Tensor, response_mask: Tensor) -> Tensor:
    """Boolean [N, 1, R, P + R]: response query i sees the prompt's real
    tokens and response keys j <= i that are real; a padding query also sees
    itself, so no softmax row is empty (its output is never read)."""
    n, r = response_mask.shape
    own = padding_attention_mask(response_mask, r)  # [N, 1, R, R]
    prompt = prompt_mask.bool()[:, None, None, :].expand(n, 1, r, prompt_mask.shape[1])
    return torch.cat((prompt, own), dim=-1)


def shared_prompt_logits(spec: LeanSpec, input_ids: Tensor, attention_mask: Tensor,
                         position_ids: Tensor, *, response_length: int) -> Tensor:
    """The logits that predict each response token, [N, R, V]: those of
    positions P - 1 .. P + R - 2 of [N, P + R] rows, the prompt computed once
    per distinct prompt. The last response token is not run at all: it
    predicts nothing here and no earlier position attends to it."""
    return head_logits(spec, shared_prompt_hidden(spec, input_ids, attention_mask, position_ids,
                                                  response_length=response_length))


def shared_prompt_hidden(spec: LeanSpec, input_ids: Tensor, attention_mask: Tensor,
                         position_ids: Tensor, *, response_length: int) -> Tensor:
    """What the output head multiplies to give `shared_prompt_logits`: the
    final-normed hidden states [N, R, E] (`thinkrl.models.fused_head` applies
    the head a chunk at a time).

    Each decoder layer runs as one forward of that layer's module
    (`fsdp.as_forward`): on a sharded model FSDP2 gathers its weights for
    the layer, frees them after and reduces their gradients in backward, as
    in the model's own forward; the caller runs this inside a forward of the
    root module (embedding, final norm, head). Under gradient checkpointing
    (with a gradient) each layer keeps only its inputs and recomputes the
    rest in backward."""
    r = response_length
    p = input_ids.shape[1] - r
    m = r - 1  # response tokens that feed a prediction
    first, inverse = distinct_prompts(input_ids[:, :p], attention_mask[:, :p])
    prompt_mask = attention_mask[first, :p]  # [U, P]
    model = spec.model.model
    h_p = model.embed_tokens(input_ids[first, :p])  # [U, P, E]
    h_r = model.embed_tokens(input_ids[:, p:p + m])  # [N, R - 1, E]
    rope_p = rotary_tables(spec, position_ids[first, :p], h_p.dtype)
    rope_r = rotary_tables(spec, position_ids[:, p:p + m], h_r.dtype)
    masks = (padding_attention_mask(prompt_mask, p),  # [U, 1, P, P]
             response_mask_for_shared(attention_mask[:, :p], attention_mask[:, p:p + m]))
    recompute = torch.is_grad_enabled() and checkpointing(spec.model)
    for layer in model.layers:
        run = as_forward(layer, "thinkrl_shared_prompt_layer", _shared_prompt_layer)
        h_p, h_r = run(layer, spec, h_p, h_r, rope_p, rope_r, masks, inverse, recompute)
    # Response token 0 is predicted at the prompt's last position, token t at response column t-1.
    h = torch.cat((h_p[inverse, -1:], h_r), dim=1)  # [N, R, E]
    return final_hidden(spec, h)


def _shared_prompt_layer(layer: torch.nn.Module, spec: LeanSpec, h_p: Tensor, h_r: Tensor,
                         rope_p: tuple[Tensor, Tensor], rope_r: tuple[Tensor, Tensor],
                         masks: tuple[Tensor, Tensor], inverse: Tensor,
                         recompute: bool) -> tuple[Tensor, Tensor]:
    """One decoder layer over the distinct prompts h_p [U, P, E] and the
    responses h_r [N, R - 1, E]; returns both after the layer."""
    if recompute:
        return checkpoint(_layer_body, layer, spec, h_p, h_r, rope_p, rope_r, masks, inverse,
                          use_reentrant=False)
    return _layer_body(layer, spec, h_p, h_r, rope_p, rope_r, masks, inverse)


def _layer_body(layer: torch.nn.Module, spec: LeanSpec, h_p: Tensor, h_r: Tensor,
                rope_p: tuple[Tensor, Tensor], rope_r: tuple[Tensor, Tensor],
                masks: tuple[Tensor, Tensor], inverse: Tensor) -> tuple[Tensor, Tensor]:
    # A product's backward keeps its weight: on shards or accelerators the
    # parameters themselves (no concatenated copy held until the backward).
    split = torch.is_grad_enabled() and (is_sharded(layer) or h_p.device.type != "cpu")
    fused = split_weights_of(layer) if split else fused_weights_of(layer)
    q_p, k_p, v_p = project_qkv(spec, layer, fused, h_p, *rope_p)
    out_p = attention(q_p, k_p, v_p, masks[0])
    if h_r.shape[1] > 0:
        q_r, k_r, v_r = project_qkv(spec, layer, fused, h_r, *rope_r)
        # Each response's keys: its prompt's (one copy per row, gradients summed back),
        # then its own.
        k = torch.cat((k_p[inverse], k_r), dim=2)  # [N, K, P + R - 1, D]
        v = torch.cat((v_p[inverse], v_r), dim=2)
        out_r = attention(q_r, k, v, masks[1])
        h_r = finish_layer(layer, fused, h_r, out_r, spec.eps)
    return finish_layer(layer, fused, h_p, out_p, spec.eps), h_r


def checkpointing(model: torch.nn.Module) -> bool:
    """Whether the model was told to checkpoint activations (Hugging Face's
    flag; transformers 5 renamed is_gradient_checkpointing, now deprecated,
    to is_activation_checkpointing)."""
    name = ("is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing")
            else "is_gradient_checkpointing")
    return bool(getattr(model, name, False))
