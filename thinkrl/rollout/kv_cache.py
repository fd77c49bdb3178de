"""A preallocated key/value cache for decoding: written in place, never grown.

Hugging Face's DynamicCache concatenates every layer's keys and values each
token (a copy of the whole cache per token per layer) and the engine grew
the attention mask the same way. This cache holds [L, N, K, C, D] tensors
sized for the longest sequence up front, writes each step's keys at the
current length, and hands attention views of the filled part.

Rows can be repeated (a prompt's cache copied to its G samples: the prompt
is prefilled once) and dropped (finished responses leave the batch).

Shapes: L layers, N rows, K key/value heads, C capacity (prompt + response
tokens), D head dim, S new tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


class StaticKVCache:
    def __init__(self, *, layers: int, rows: int, kv_heads: int, capacity: int, head_dim: int,
                 device: torch.device) -> None:
        self._shape = (layers, rows, kv_heads, capacity, head_dim)
        self._device = device
        # Allocated at the first write, in the dtype the values come in (the
        # autocast dtype under mixed precision, not the weights' float32; keys
        # come out of the rotation in float32 and are stored in it too), except
        # on a CPU, where it is float32: one-query attention over a bfloat16
        # cache runs 3x slower there than over a float32 one (206 vs 57 us for
        # scores of 64 rows x 4 heads x 60 keys, one thread).
        self.keys = self.values = None
        self.length = 0  # positions filled in every row
        self._pending = 0  # tokens written by the current forward, committed by `advance`

    @property
    def capacity(self) -> int:
        return self._shape[3]

    @property
    def dtype(self) -> torch.dtype:
        """What attention over the cache computes in (known after the first write)."""
        if self.keys is None:
            raise AssertionError("the cache's dtype is set by its first write (the prefill)")
        return self.keys.dtype

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store layer `layer`'s new keys/values [N, K, S, D] after the filled
        part; return that layer's keys/values so far [N, K, length + S, D]."""
        end = self.length + k.shape[2]
        if self.keys is None:
            dtype = torch.float32 if self._device.type == "cpu" else v.dtype
            self.keys = torch.empty(self._shape, dtype=dtype, device=self._device)
            self.values = torch.empty(self._shape, dtype=dtype, device=self._device)
        if end > self.capacity:
            raise AssertionError(f"KV cache overflow: {end} > capacity {self.capacity}")
        self.keys[layer, :, :, self.length:end] = k
        self.values[layer, :, :, self.length:end] = v
        self._pending = k.shape[2]
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def advance(self) -> None:
        """Commit the tokens the last forward wrote (call once per forward)."""
        self.length += self._pending
        self._pending = 0

    def repeat_rows(self, times: int) -> None:
        """Each row becomes `times` consecutive copies (prompt -> its G samples)."""
        self.keys = self.keys.repeat_interleave(times, dim=1)
        self.values = self.values.repeat_interleave(times, dim=1)

    def keep_rows(self, rows: Tensor) -> None:
        """Keep only `rows` (long indices into the current rows), in that order."""
        self.keys = self.keys.index_select(1, rows)
        self.values = self.values.index_select(1, rows)
