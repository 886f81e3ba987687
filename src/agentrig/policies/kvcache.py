"""A key/value cache whose tensors are allocated once, with room for the tokens still to come.

transformers' `DynamicCache` appends each decode step's keys/values with `torch.cat`, which copies the
whole cache every step: for 16 rows of 2,000 tokens on SmolLM2-135M that is 1.5 GB copied per generated
token, more than the attention itself reads. `BufferedCache` holds each layer's keys and values in a
buffer of `capacity` positions, writes new positions in place and hands attention a view of the filled
part, so a step costs what attention reads. Rows that finished can be dropped (`keep_rows`), so the
rest of a batch decodes at the batch size it still has.

It is a `DynamicCache` (the models' code paths and mask building are the dynamic cache's) for
full-attention layers only; it is imported lazily by `agentrig.policies.hf_policy`.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer


class BufferedLayer(DynamicLayer):
    """One layer's keys and values in preallocated `[batch, kv_heads, capacity, head_dim]` buffers.

    `keys` and `values` are views of the first `length` positions, as `DynamicLayer` exposes them. When an
    update would pass the capacity, the buffers grow (doubling), so a longer generation stays correct.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.key_buffer, self.value_buffer = keys, values
        self.length = length
        self.device = keys.device
        self.is_initialized = True
        self._views()

    def _views(self) -> None:
        self.keys = self.key_buffer[:, :, : self.length]
        self.values = self.value_buffer[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the filled ones; return views of everything filled."""
        end = self.length + key_states.shape[-2]
        if end > self.key_buffer.shape[2]:
            self.key_buffer = _grown(self.key_buffer, self.length, end)
            self.value_buffer = _grown(self.value_buffer, self.length, end)
        self.key_buffer[:, :, self.length : end] = key_states
        self.value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last `-tokens_to_remove` positions (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only these rows (copies the buffers once)."""
        self.key_buffer = self.key_buffer.index_select(0, indices)
        self.value_buffer = self.value_buffer.index_select(0, indices)
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each row `repeats` times (beam search and multiple samples do this)."""
        self.key_buffer = self.key_buffer.repeat_interleave(repeats, dim=0)
        self.value_buffer = self.value_buffer.repeat_interleave(repeats, dim=0)
        self._views()

    def reset(self) -> None:
        """Empty the layer, keeping its buffers."""
        self.length = 0
        self._views()


def _grown(buffer: torch.Tensor, filled: int, need: int) -> torch.Tensor:
    out = buffer.new_zeros((*buffer.shape[:2], max(need, 2 * buffer.shape[2]), buffer.shape[3]))
    out[:, :, :filled] = buffer[:, :, :filled]
    return out


class BufferedCache(DynamicCache):
    """A `DynamicCache` made of `BufferedLayer`s.

    Args:
        layers: per model layer, `(key_buffer, value_buffer)` of shape `[batch, kv_heads, capacity, head_dim]`
            whose first `length` positions are filled.
        length: positions already filled in every layer.
    """

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        Cache.__init__(self, layers=[BufferedLayer(k, v, length) for k, v in layers])

    @classmethod
    def left_padded(cls, rows: list[list[tuple[torch.Tensor, torch.Tensor]]], length: int, capacity: int) -> "BufferedCache":
        """One cache from per-row caches (per layer `(keys, values)` of shape `[1, kv_heads, n_row, head_dim]`,
        or `[]` for a row with nothing cached), each right-aligned at `length` with zeros to its left (masked
        by the caller's attention mask), with room for `capacity` positions."""
        ref = next(kv for kv in rows if kv)
        layers = []
        for layer in range(len(ref)):
            k0, v0 = ref[layer]
            keys = k0.new_zeros((len(rows), k0.shape[1], capacity, k0.shape[3]))
            values = v0.new_zeros((len(rows), v0.shape[1], capacity, v0.shape[3]))
            for b, kv in enumerate(rows):
                n = kv[layer][0].shape[2] if kv else 0
                if n:
                    keys[b, :, length - n : length] = kv[layer][0][0]
                    values[b, :, length - n : length] = kv[layer][1][0]
            layers.append((keys, values))
        return cls(layers, length)

    def add_rows(self, rows: list[list[tuple[torch.Tensor, torch.Tensor]]], drop: int, length: int) -> None:
        """Add batch rows while decoding (continuous batching): the filled columns from `drop` on move to end at
        `length` (the columns before `drop` are no live row's), and each new row's keys/values (per layer
        `[1, kv_heads, n, head_dim]`, or `[]`) are right-aligned at `length`; the rest is zeros, masked."""
        for i, layer in enumerate(self.layers):
            kept = layer.length - drop
            if kept > length:
                raise ValueError(f"cannot fit {kept} kept positions in {length}")
            old_k, old_v = layer.key_buffer, layer.value_buffer
            capacity = max(old_k.shape[2], length + 64)
            shape = (old_k.shape[0] + len(rows), old_k.shape[1], capacity, old_k.shape[3])
            keys, values = old_k.new_zeros(shape), old_v.new_zeros(shape)
            b = old_k.shape[0]
            keys[:b, :, length - kept : length] = old_k[:, :, drop : layer.length]
            values[:b, :, length - kept : length] = old_v[:, :, drop : layer.length]
            for j, kv in enumerate(rows):
                n = kv[i][0].shape[2] if kv else 0
                if n:
                    keys[b + j, :, length - n : length] = kv[i][0][0]
                    values[b + j, :, length - n : length] = kv[i][1][0]
            layer.key_buffer, layer.value_buffer, layer.length = keys, values, length
            layer._views()

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these batch rows, in this order (rows that finished generating are dropped)."""
        index = torch.tensor(rows, device=self.layers[0].key_buffer.device, dtype=torch.long)
        for layer in self.layers:
            layer.batch_select_indices(index)
