"""Continuous batching for plain causal decoders (Llama/Qwen2/Qwen3): a key/value
cache of fixed slots, each holding one sequence at its own length.

`thinkrl.rollout.fast_decode` decodes one batch from start to end: rows that
finish leave, and the last long response runs alone while the rest wait. Here
a slot freed by a finished response takes a new prompt at once (`prefill`),
while the others keep decoding (`step`): every forward works on as many rows
as there are sequences to continue. Asynchronous training's streaming rollout
(`thinkrl.async_rollout.stream`) is built on it.

Each slot stores its sequence from cache position 0, unpadded, so a token's
position is its index in the slot: position ids, the cache write and the
attention mask all follow from each slot's length.

Shapes: L layers, S slots, K key/value heads, C capacity (tokens a slot can
hold), D head dim, V vocabulary, n rows of one call, W the longest sequence
of a prefill.
"""

from __future__ import annotations

import torch
from torch import Tensor

from thinkrl.models.lean_decoder import (LeanSpec, attend_one, attention, final_logits, finish_layer,
                                         fused_weights, one_query_bias, project_qkv, rotary_tables)

_GROW = 64  # capacity added beyond what a call needs when the cache grows


class SlotDecoder:
    """The slots' cache and the two forwards over it. The model's weights are
    read once into fused copies (`refresh`): call it after they change."""

    def __init__(self, spec: LeanSpec, *, slots: int, device: torch.device) -> None:
        self.spec, self.slots, self.device = spec, slots, device
        self.lengths = torch.zeros(slots, dtype=torch.long, device=device)
        """Tokens each slot holds (its next token's position)."""
        self.keys: Tensor | None = None  # [L, S, K, C, D]
        self.values: Tensor | None = None
        self.capacity = 0
        self._rope: tuple[Tensor, Tensor] | None = None
        self._weights = None
        self.refresh()

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
        """Room for `needed` tokens in every slot (grown, keeping what is held):
        float32 on a CPU (see `StaticKVCache`), else the autocast dtype, or
        the model's without autocast."""
        if needed <= self.capacity:
            return
        kind = self.device.type
        dtype = (torch.float32 if kind == "cpu" else torch.get_autocast_dtype(kind)
                 if torch.is_autocast_enabled(kind) else self.spec.model.model.embed_tokens.weight.dtype)
        self._allocate(needed + _GROW, dtype)

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
