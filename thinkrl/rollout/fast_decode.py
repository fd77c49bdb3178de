"""The native engine's fast decode loop for plain causal decoders (Llama/Qwen2/Qwen3).

Same samples as the padded loop in `thinkrl.rollout.native` (same tokens
under the same generator; log-probs equal up to float32 rounding), less work:
- each prompt is prefilled once, not once per sample: its keys/values are
  copied to its G rows of a preallocated `StaticKVCache`;
- every forward is `thinkrl.models.lean_decoder.decoder_logits` (no mask
  rebuilt, no cache concatenated per token);
- finished rows leave the batch. The generator still draws noise for all N
  rows every step (`sample_rows`), so what the other rows sample does not
  depend on when a row finished.

Shapes: B prompts, G samples each, N = B * G rows, P prompt tokens, R
response tokens, V vocabulary.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from thinkrl.progress import DecodeProgress
from thinkrl.models.lean_decoder import (LeanSpec, decoder_logits, fused_weights,
                                         padding_attention_mask, rotary_tables)
from thinkrl.rollout.kv_cache import StaticKVCache

# Compact the batch when at least this share of its rows has finished: an
# index_select of the cache costs about one decode step.
COMPACT_SHARE = 0.25


def decode(spec: LeanSpec, prompt_ids: Tensor, prompt_mask: Tensor, *, samples: int,
           max_tokens: int, eos: Tensor | None, pad_token_id: int,
           sample: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]],
           pause: Callable[[int], bool] | None = None) -> tuple[Tensor, Tensor]:
    """Responses [N, R] and their log-probs [N, R] (pad / 0 after a row's EOS),
    R the longest response (at most max_tokens), or fewer tokens when
    `pause(tokens so far)` says to stop early (partial rollout: the caller
    continues the unfinished rows later).

    prompt_ids, prompt_mask: [B, P] left-padded, on the compute device.
    eos: the stop ids, or None to ignore EOS (every row runs max_tokens).
    sample(logits [n, V], rows [n], N): next tokens and log-probs [n] for the
    active `rows` of the N (see `sample_rows`)."""
    b, p = prompt_ids.shape
    n, device = b * samples, prompt_ids.device
    layers = len(spec.model.model.layers)
    dtype = spec.model.model.embed_tokens.weight.dtype
    cache = StaticKVCache(layers=layers, rows=b, kv_heads=spec.kv_heads, capacity=p + max_tokens,
                          head_dim=spec.head_dim, device=device)
    # The weights do not change while decoding: fuse (and, under autocast, cast) them once.
    cast = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    weights = fused_weights(spec, cast)
    all_positions = torch.arange(p + max_tokens, device=device)[None]
    rope = rotary_tables(spec, all_positions, dtype)  # positions never exceed P + R
    position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    logits = decoder_logits(spec, prompt_ids, position_ids, padding_attention_mask(prompt_mask, p),
                            keep=1, cache=cache, weights=weights, rope=rope)[:, -1]  # [B, V]
    cache.advance()
    cache.repeat_rows(samples)
    logits = logits.repeat_interleave(samples, dim=0)  # [N, V]: identical within a group
    # Which cached positions hold real tokens: the prompt's, then every response token.
    key_valid = torch.ones(n, p + max_tokens, dtype=torch.bool, device=device)
    key_valid[:, :p] = prompt_mask.bool().repeat_interleave(samples, dim=0)
    next_position = position_ids[:, -1:].repeat_interleave(samples, dim=0) + 1  # [N, 1]

    tokens = torch.full((n, max_tokens), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(n, max_tokens, dtype=torch.float32, device=device)
    active = torch.arange(n, device=device)  # the rows still in the batch, ascending
    done = torch.zeros(n, dtype=torch.bool, device=device)  # per active row: reached EOS
    steps = max_tokens
    told = DecodeProgress(n, max_tokens)
    for step in range(max_tokens):
        told.decoded(step + 1, lambda: len(active) - int(done.sum()))
        token, logprob = sample(logits.float(), active, n)
        live = ~done
        tokens[active[live], step], logprobs[active[live], step] = token[live], logprob[live]
        if eos is not None:
            done = done | torch.isin(token, eos)
        if step + 1 == max_tokens or bool(done.all()) or (pause is not None and pause(step + 1)):
            steps = step + 1  # as the padded loop: R is the longest response, not max_tokens
            break
        if bool(done.any()) and done.sum() >= COMPACT_SHARE * len(active):
            keep = (~done).nonzero()[:, 0]
            active, token, next_position = active[keep], token[keep], next_position[keep]
            key_valid, done = key_valid[keep], done[keep]
            cache.keep_rows(keep)
        length = cache.length + 1
        mask = key_valid[:, None, None, :length]  # [n, 1, 1, length]
        logits = decoder_logits(spec, token[:, None], next_position, mask, keep=1,
                                cache=cache, weights=weights, rope=rope)[:, -1]
        cache.advance()
        next_position = next_position + 1
    return tokens[:, :steps], logprobs[:, :steps]


def sample_rows(logits: Tensor, rows: Tensor, total: int, *, generator: torch.Generator,
                probs_of: Callable[[Tensor], Tensor]) -> Tensor:
    """torch.multinomial(probs, 1) for the `rows` of a `total`-row batch,
    drawing the generator exactly as that call on all `total` rows would.

    torch.multinomial samples one token as argmax_v p_v / q_v with q ~ Exp(1)
    drawn for every [row, v]; drawing q for all rows and keeping the active
    ones makes the remaining rows' samples independent of finished rows."""
    probs = probs_of(logits)  # [n, V]
    q = torch.empty(total, probs.shape[-1], dtype=probs.dtype, device=probs.device)
    q.exponential_(1, generator=generator)
    return (probs / q[rows]).argmax(-1)
