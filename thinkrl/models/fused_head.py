"""Log-probs and entropies straight from the last hidden states, the output
head applied a chunk of tokens at a time (`model.use_fused_kernels`, verl's key).

Why: the update's logits are [T, V] for T response tokens. At Qwen2.5's
V = 151,936 and 64 responses of 512 tokens that is 19.9 GB in float32 before
log_softmax, the entropy and their backward add copies of the same size.
Here only one chunk's logits (and, in the backward, a few chunk-sized
temporaries: probabilities, their gradient) exist at a time; the backward
recomputes them from the saved hidden states (one more head product per
token, the price of the memory).

Same math as `final_logits` + `logprobs_from_logits` / `entropy_from_logits`
(float32 log-softmax over head logits in the compute dtype), up to float32
rounding; under bfloat16 autocast with a temperature != 1 the division
happens here in float32, after the bfloat16 product (the whole-logits path
divides the bfloat16 logits, one more bfloat16 rounding). With z = (h W^T + b) / temperature, p = softmax(z), lse = logsumexp(z):

    logprob_t = z_{t, y_t} - lse_t
    H_t       = lse_t - sum_v p_{t, v} z_{t, v}
    d logprob_t / d z_{t, v} = 1[v = y_t] - p_{t, v}
    d H_t / d z_{t, v}       = -p_{t, v} (log p_{t, v} + H_t)

Shapes: T tokens, E hidden size, V vocabulary, C tokens per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Tokens per chunk = this many logits / V: 2^24 float32 logits (64 MiB) per
# buffer (110 tokens at V = 151,936: still a large product), the whole batch
# at once for small vocabularies.
CHUNK_LOGITS = 1 << 24


def chunk_tokens(vocab: int) -> int:
    """C: how many tokens' logits go in one chunk."""
    return max(1, CHUNK_LOGITS // max(1, vocab))


def head_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, *,
                  temperature: float = 1.0, with_entropy: bool = False,
                  entropy_grad: bool = False, chunk: int | None = None
                  ) -> tuple[Tensor, Tensor | None]:
    """log softmax(z)_y and (optionally) the entropy of softmax(z) for
    z = (hidden W^T + b) / temperature, never holding more than `chunk`
    tokens' logits. hidden [..., E] (after the final norm), weight [V, E],
    labels [...] long. Returns float32 [...] tensors; gradients reach
    hidden, weight and bias (the entropy's only with `entropy_grad`).
    Under autocast the head product runs in the autocast dtype, as the
    model's own head would."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    shape = labels.shape
    inv_temp = 1.0 / temperature if temperature > 0 else 1.0
    chunk = chunk or chunk_tokens(weight.shape[0])
    with torch.autocast(device, enabled=False):
        logprobs, entropy = _ChunkedHead.apply(hidden.reshape(-1, hidden.shape[-1]), weight, bias,
                                               labels.reshape(-1).long(), inv_temp, chunk, dtype,
                                               with_entropy, with_entropy and entropy_grad)
    return logprobs.view(shape), None if not with_entropy else entropy.view(shape)


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None, inv_temp: float) -> Tensor:
    """float32 z [C, V] of one chunk, the product in the dtype of `weight`
    (cast once per pass by the caller: at V = 152k it is a large copy)."""
    z = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()
    return z * inv_temp if inv_temp != 1.0 else z


def _cast(weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    return weight.to(dtype), None if bias is None else bias.to(dtype)


class _ChunkedHead(torch.autograd.Function):
    """(hidden [T, E], weight [V, E], bias [V] | None, labels [T]) ->
    (logprobs [T], entropies [T] or an empty tensor), chunk by chunk. The
    entropies carry a gradient only with `entropy_grad`."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, inv_temp, chunk, dtype, with_entropy,
                entropy_grad):
        t = hidden.shape[0]
        logprobs = torch.empty(t, dtype=torch.float32, device=hidden.device)
        lse_all = torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else logprobs.new_empty(0)
        w, b = _cast(weight, bias, dtype)
        for start in range(0, t, chunk):
            rows = slice(start, start + chunk)
            z = _logits(hidden[rows], w, b, inv_temp)
            lse = torch.logsumexp(z, -1)
            lse_all[rows] = lse
            logprobs[rows] = z.gather(-1, labels[rows, None])[:, 0] - lse
            if with_entropy:
                entropy[rows] = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse_all, entropy)
        ctx.inv_temp, ctx.chunk, ctx.dtype = inv_temp, chunk, dtype
        ctx.entropy_grad = entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, labels, lse_all, entropy = ctx.saved_tensors
        inv_temp, dtype = ctx.inv_temp, ctx.dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if ctx.needs_input_grad[1] else None)
        grad_bias = (torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
                     if bias is not None and ctx.needs_input_grad[2] else None)
        w, b = _cast(weight, bias, dtype)
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows].to(dtype)
            log_p = _logits(h, w, b, inv_temp).sub_(lse_all[rows, None])  # in place: z - lse
            p = torch.exp(log_p)
            g_lp = grad_logprobs[rows]
            grad_z = p * -g_lp[:, None]  # d logprob / d z = onehot(y) - p
            grad_z.scatter_add_(-1, labels[rows, None], g_lp[:, None])
            if ctx.entropy_grad and grad_entropy is not None:
                grad_z -= p * (log_p + entropy[rows, None]) * grad_entropy[rows, None]
            if inv_temp != 1.0:
                grad_z *= inv_temp
            if grad_bias is not None:
                grad_bias += grad_z.sum(0)
            grad_z = grad_z.to(dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = (grad_z @ w).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += (grad_z.t() @ h).float()
        grad_weight = None if grad_weight is None else grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None, None
