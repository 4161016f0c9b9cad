"""Static KV cache: preallocated buffers written at given slots, with compaction of an accepted tree path."""

from __future__ import annotations

import torch

from ..errors import DecodingError


class KVCache:
    """One layer's static KV cache.

    Buffers ``k`` and ``v``: (B, n_kv_heads, max_len, head_dim), allocated once on ``device`` in ``dtype``.
    Slots are written by :meth:`update`; which slots are meaningful (the committed prefix, then tree
    tokens) is the decoder's bookkeeping, not the cache's.
    """

    def __init__(self, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (batch, n_kv_heads, max_len, head_dim)  # (B, Hkv, S, D)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, Hkv, T, D) at slots ``input_pos`` (T,) int64; return the full (k, v) buffers."""
        self.k.index_copy_(2, input_pos, k.to(self.k.dtype))
        self.v.index_copy_(2, input_pos, v.to(self.v.dtype))
        return self.k, self.v


class ModelKVCache:
    """The per-layer caches of one model, plus compaction across all layers.

    Args:
        n_layers, batch, n_kv_heads, max_len, head_dim: buffer geometry; each layer holds
            (batch, n_kv_heads, max_len, head_dim) keys and values.
        dtype, device: explicit, never defaulted from global state.
    """

    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device | str) -> None:
        self.layers = [KVCache(batch, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
                       for _ in range(n_layers)]
        self.max_len = max_len

    def __getitem__(self, i: int) -> KVCache:
        return self.layers[i]

    def __len__(self) -> int:
        return len(self.layers)

    def compact(self, src_slots: torch.Tensor, dst_start: int) -> None:
        """Move the slots ``src_slots`` (A,) int64 — in any order, e.g. an accepted tree path scattered in
        breadth-first order — to consecutive slots ``[dst_start, dst_start + A)``, in every layer.

        Reads all sources before writing, so overlapping ranges are safe. Raises :class:`DecodingError`
        when a slot lies outside the cache.
        """
        A = int(src_slots.numel())
        if A == 0:
            return
        if dst_start < 0 or dst_start + A > self.max_len or int(src_slots.min()) < 0 or int(src_slots.max()) >= self.max_len:
            raise DecodingError(f"compaction of {A} slots to {dst_start} does not fit a cache of {self.max_len}")
        dst = torch.arange(dst_start, dst_start + A, device=src_slots.device)
        if torch.equal(src_slots, dst):
            return
        for layer in self.layers:
            for buf in (layer.k, layer.v):
                moved = buf.index_select(2, src_slots)  # (B, Hkv, A, D), a copy
                buf.index_copy_(2, dst, moved)
