"""The native engine's decoder for plain causal decoders (Llama/Qwen2/Qwen3):
a key/value cache of slots, each holding one sequence at its own length, and
the lean forward (`thinkrl.models.lean_decoder`) over it. One engine, two
ways to feed it:

- a batch (`decode`, what `thinkrl.rollout.native.NativeEngine` runs): each
  prompt is prefilled once into the first slot of its group and copied to
  its G - 1 others; every step appends one token to every running slot, and
  once a quarter of the rows has finished the cache is compacted (`keep`) so
  that the steps after it work on the rows still running;
- a stream (continuous batching, `thinkrl.async_rollout.stream`): a slot
  freed by a finished response takes a new prompt at once (`prefill`) while
  the others keep decoding (`step` on any subset of the slots).

Each slot stores its sequence from cache position 0, unpadded, so a token's
position is its index in the slot: position ids, the cache write and the
attention mask all follow from each slot's length.

Its samples are the padded loop's (`NativeEngine(fast=False)`, the reference
for every other model): the same tokens under the same generator, log-probs
equal up to float32 rounding (tests/rollout/test_fast_decode.py).

Shapes: L layers, S slots, K key/value heads, C capacity (tokens a slot can
hold), D head dim, V vocabulary, n rows of one call, W the longest sequence
of a prefill; for a batch, B prompts, G samples each, N = B * G rows, P
prompt tokens, R response tokens.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from thinkrl.models.routing import ROUTE_DTYPE, RouteTape
from thinkrl.models.lean_decoder import (LeanSpec, attend_one, attention, final_logits, finish_layer,
                                         fused_weights, one_query_bias, project_qkv, rotary_tables)
from thinkrl.progress import DecodeProgress

_GROW = 64  # capacity added beyond what a call needs when the cache grows
# A batch is compacted when at least this share of its rows has finished: an
# index_select of the cache costs about one decode step.
COMPACT_SHARE = 0.25


class SlotDecoder:
    """The slots' cache and the two forwards over it. The model's weights are
    read once into fused copies (`refresh`): call it after they change."""

    def __init__(self, spec: LeanSpec, *, slots: int, device: torch.device, capacity: int = 0) -> None:
        """`capacity`: tokens per slot to allocate up front (a batch knows
        its longest sequence); the cache grows past it when a call needs more."""
        self.spec, self.slots, self.device = spec, slots, device
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        """Tokens each slot holds (its next token's position)."""
        self.keys: Tensor | None = None  # [L, S, K, C, D]
        self.values: Tensor | None = None
        self.capacity = 0
        self._rope: tuple[Tensor, Tensor] | None = None
        self._weights = None
        self.refresh()
        if capacity:
            self._allocate(capacity, self._cache_dtype())

    def refresh(self) -> None:
        """Fuse (and, under autocast, cast) the current weights once."""
        kind = self.device.type
        cast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
        self._weights = fused_weights(self.spec, cast)

    def prefill(self, slots: Tensor, sequences: list[Tensor]) -> Tensor:
        """Write each sequence (1-D token ids) into its slot from position 0;
        the logits of each one's next token [n, V]. Right-padded into one
        batch: with causal attention a real token never sees the padding after
        it, and a slot's length ends its sequence (the padding's keys are
        overwritten by the next tokens)."""
        lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long, device=self.device)
        width = int(lengths.max())
        self._ensure(width)
        ids = torch.zeros(len(sequences), width, dtype=torch.long, device=self.device)
        for i, sequence in enumerate(sequences):
            ids[i, :len(sequence)] = sequence.to(self.device)
        positions = torch.arange(width, device=self.device)[None].expand(len(sequences), width)
        h = self.spec.model.model.embed_tokens(ids)  # [n, W, E]
        cos, sin = self._rope[0][0, positions], self._rope[1][0, positions]
        for index, layer in enumerate(self.spec.model.model.layers):
            fused = self._weights[index]
            q, k, v = project_qkv(self.spec, layer, fused, h, cos, sin)  # k, v [n, K, W, D]
            self.keys[index, slots, :, :width] = k.to(self.keys.dtype)
            self.values[index, slots, :, :width] = v.to(self.values.dtype)
            h = finish_layer(layer, fused, h, attention(q, k, v, None), self.spec.eps)
        self.lengths[slots] = lengths
        last = h[torch.arange(len(sequences), device=self.device), lengths - 1]  # [n, E]
        return final_logits(self.spec, last[:, None])[:, 0]

    def prefill_groups(self, slots: Tensor, prompts: list[Tensor]) -> Tensor:
        """Each prompt (1-D token ids) into the first of its row of `slots`
        [B, G], prefilled once and copied to the row's other G - 1 slots; the
        logits of each prompt's next token [B, V], the same for its G slots."""
        logits = self.prefill(slots[:, 0], prompts)
        if slots.shape[1] > 1:
            self.copy(slots[:, :1].expand(-1, slots.shape[1] - 1).reshape(-1), slots[:, 1:].reshape(-1))
        return logits

    def copy(self, source: Tensor, target: Tensor) -> None:
        """Slots `target` take the sequences of slots `source` (a prompt
        prefilled once, copied to the other samples of its group)."""
        width = int(self.lengths[source].max())
        self.keys[:, target, :, :width] = self.keys[:, source, :, :width]
        self.values[:, target, :, :width] = self.values[:, source, :, :width]
        self.lengths[target] = self.lengths[source]

    def step(self, rows: Tensor, tokens: Tensor) -> Tensor:
        """Append one token to each of the slots `rows` (ascending); the
        logits of their next tokens [n, V]."""
        positions = self.lengths[rows]  # [n]
        width = int(positions.max()) + 1
        self._ensure(width)
        every = len(rows) == self.slots  # all slots: views of the cache, no gather
        visible = torch.arange(width, device=self.device)[None] <= positions[:, None]
        bias = one_query_bias(visible[:, None, None], self.spec, self.keys.dtype)
        h = self.spec.model.model.embed_tokens(tokens[:, None])  # [n, 1, E]
        cos, sin = self._rope[0][0, positions[:, None]], self._rope[1][0, positions[:, None]]
        for index, layer in enumerate(self.spec.model.model.layers):
            fused = self._weights[index]
            q, k, v = project_qkv(self.spec, layer, fused, h, cos, sin)  # k, v [n, K, 1, D]
            self.keys[index, rows, :, positions] = k[:, :, 0].to(self.keys.dtype)
            self.values[index, rows, :, positions] = v[:, :, 0].to(self.values.dtype)
            keys = self.keys[index, :, :, :width] if every else self.keys[index, rows, :, :width]
            values = self.values[index, :, :, :width] if every else self.values[index, rows, :, :width]
            h = finish_layer(layer, fused, h, attend_one(q, keys, values, bias), self.spec.eps)
        self.lengths[rows] += 1
        return final_logits(self.spec, h)[:, -1]

    def keep(self, slots: Tensor) -> None:
        """Only `slots` (ascending) stay, renumbered 0..len(slots)-1: the
        steps after it work on views of a smaller cache, not on a gather
        of the running rows from the whole one every step."""
        self.slots = len(slots)
        self.lengths = self.lengths[slots]
        if self.keys is not None:
            self.keys = self.keys.index_select(1, slots)
            self.values = self.values.index_select(1, slots)

    def cache_of(self, rows: Tensor) -> dict:
        """Slots `rows`' keys, values and lengths, on the host, with the
        cache's capacity (a checkpoint of the streaming engine)."""
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 0
        held = self.keys is not None  # (an empty slice keeps the dtype)
        return {"rows": rows.cpu(), "lengths": lengths.cpu(), "capacity": self.capacity,
                "keys": self.keys[:, rows, :, :width].cpu() if held else None,
                "values": self.values[:, rows, :, :width].cpu() if held else None}

    def load_cache(self, state: dict) -> None:
        """The slots of `cache_of` back, in a cache of the same capacity: the
        rotary tables then span the same positions, so every later forward
        computes the same numbers as the engine that was saved."""
        if state["keys"] is None:
            return
        keys = state["keys"].to(self.device)
        self._allocate(int(state["capacity"]), keys.dtype)
        rows, width = state["rows"].to(self.device), keys.shape[3]
        self.keys[:, rows, :, :width] = keys
        self.values[:, rows, :, :width] = state["values"].to(self.device)
        self.lengths[rows] = state["lengths"].to(self.device)

    def _ensure(self, needed: int) -> None:
        """Room for `needed` tokens in every slot (grown, keeping what is held)."""
        if needed > self.capacity:
            self._allocate(needed + _GROW, self._cache_dtype())

    def _cache_dtype(self) -> torch.dtype:
        """float32 on a CPU: one-query attention over a bfloat16 cache runs 3x
        slower there than over a float32 one (206 vs 57 us for scores of 64
        rows x 4 heads x 60 keys, one thread); elsewhere the autocast dtype,
        or the model's without autocast."""
        kind = self.device.type
        if kind == "cpu":
            return torch.float32
        if torch.is_autocast_enabled(kind):
            return torch.get_autocast_dtype(kind)
        return self.spec.model.model.embed_tokens.weight.dtype

    def _allocate(self, capacity: int, dtype: torch.dtype) -> None:
        """A cache of `capacity` tokens per slot holding what the old one held."""
        spec = self.spec
        shape = (len(spec.model.model.layers), self.slots, spec.kv_heads, capacity, spec.head_dim)
        keys = torch.zeros(shape, dtype=dtype, device=self.device)
        values = torch.zeros_like(keys)
        if self.keys is not None:
            kept = min(capacity, self.capacity)
            keys[:, :, :, :kept] = self.keys[:, :, :, :kept]
            values[:, :, :, :kept] = self.values[:, :, :, :kept]
        self.keys, self.values, self.capacity = keys, values, capacity
        self._rope = rotary_tables(spec, torch.arange(capacity, device=self.device)[None],
                                   spec.model.model.embed_tokens.weight.dtype)


class Decoded(NamedTuple):
    tokens: Tensor  # [N, R]
    logprobs: Tensor  # [N, R]
    routes: Tensor | None = None
    """[N, P' + R, L, k] with a route tape: each row's prompt from column 0, then its response."""


def decode(spec: LeanSpec, prompt_ids: Tensor, prompt_mask: Tensor, *, samples: int,
           max_tokens: int, eos: Tensor | None, pad_token_id: int,
           sample: Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]],
           pause: Callable[[int], bool] | None = None, tape: RouteTape | None = None) -> Decoded:
    """Responses [N, R] and their log-probs [N, R] (pad / 0 after a row's EOS),
    R the longest response (at most max_tokens), or fewer tokens when
    `pause(tokens so far)` says to stop early (partial rollout: the caller
    continues the unfinished rows later). With a recording `tape` (router
    replay R3), the experts of every token fed, prompt tokens included.

    prompt_ids, prompt_mask: [B, P] left-padded, on the compute device.
    eos: the stop ids, or None to ignore EOS (every row runs max_tokens).
    sample(logits [n, V], rows [n], N): next tokens and log-probs [n] for the
    running `rows` of the N (`sample_rows` draws the generator as for all N,
    so what a row samples does not depend on when the others finished)."""
    b, p = prompt_ids.shape
    n, device = b * samples, prompt_ids.device
    decoder = SlotDecoder(spec, slots=n, device=device, capacity=p + max_tokens)
    groups = torch.arange(n, device=device).view(b, samples)  # group i in slots i*G .. i*G+G-1
    prompts = [ids[mask.bool()] for ids, mask in zip(prompt_ids, prompt_mask)]
    logits = decoder.prefill_groups(groups, prompts)
    logits = logits.repeat_interleave(samples, dim=0)  # [N, V]: identical within a group
    routes, fed = None, prompt_mask.sum(-1).repeat_interleave(samples)  # tokens each row has fed
    if tape is not None:  # the prompt's routes, the same for its G samples
        width = max(len(x) for x in prompts)
        routes = torch.zeros(n, p + max_tokens, tape.layers, tape.top_k, dtype=ROUTE_DTYPE, device=device)
        routes[:, :width] = tape.take(b * width, device).view(b, width, tape.layers, -1).repeat_interleave(
            samples, dim=0)

    tokens = torch.full((n, max_tokens), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(n, max_tokens, dtype=torch.float32, device=device)
    active = torch.arange(n, device=device)  # the batch's rows the slots hold, ascending
    done = torch.zeros(n, dtype=torch.bool, device=device)  # per slot: reached EOS
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
            active, token, done = active[keep], token[keep], done[keep]
            decoder.keep(keep)
        logits = decoder.step(torch.arange(len(active), device=device), token)
        if routes is not None:  # the token just fed, at its row's next column
            routes[active, fed[active]] = tape.take(len(active), device)
            fed[active] += 1
    return Decoded(tokens[:, :steps], logprobs[:, :steps], routes)


def sample_rows(logits: Tensor, rows: Tensor, total: int, *, generator: torch.Generator,
                probs_of: Callable[[Tensor], Tensor]) -> Tensor:
    """torch.multinomial(probs, 1) for the `rows` of a `total`-row batch,
    drawing the generator exactly as that call on all `total` rows would.

    torch.multinomial samples one token as argmax_v p_v / q_v with q ~ Exp(1)
    drawn for every [row, v]; drawing q for all rows and keeping the running
    ones makes the remaining rows' samples independent of finished rows."""
    probs = probs_of(logits)  # [n, V]
    q = torch.empty(total, probs.shape[-1], dtype=probs.dtype, device=probs.device)
    q.exponential_(1, generator=generator)
    return (probs / q[rows]).argmax(-1)
