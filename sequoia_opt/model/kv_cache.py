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

    @classmethod
    def of_buffers(cls, k: torch.Tensor, v: torch.Tensor) -> "KVCache":
        """A cache over existing (B, Hkv, S, D) buffers (views of another cache's rows: writes go there)."""
        cache = cls.__new__(cls)
        cache.k, cache.v = k, v
        return cache

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

    # ------------------------------------------------------------------ batch > 1 (decoding/batched.py)
    @property
    def batch(self) -> int:
        """Rows of the buffers (sequences of a batch)."""
        return int(self.layers[0].k.shape[0]) if self.layers else 0

    def rows(self, start: int, stop: int) -> "ModelKVCache":
        """The cache of batch rows ``[start, stop)``: views sharing this cache's buffers (a write through it is a
        write here). A batched decoder prefills row i through ``rows(i, i + 1)`` with the batch-1 forward, and
        decodes its b live sequences through ``rows(0, b)``."""
        view = ModelKVCache.__new__(ModelKVCache)
        view.layers = [KVCache.of_buffers(layer.k[start:stop], layer.v[start:stop]) for layer in self.layers]
        view.max_len = self.max_len
        return view

    def keep_rows(self, keep: torch.Tensor, slots: int | None = None) -> None:
        """Batch rows ``keep`` (K,) int64 (distinct, any order) become rows ``[0, K)``: new row i is old row
        ``keep[i]``, in every layer (a finished sequence leaves the batch; rows past K are then stale).

        Only what changes is copied: the rows whose place changes (``keep[i] != i``; the loop's
        :func:`~sequoia_opt.decoding.loop.keep_order` moves only rows into holes), and of each only slots
        ``[0, slots)`` when ``slots`` is given (the caller's committed prefix; the slots past it are scratch that the
        next forward writes before it reads). Continuous batching calls this whenever a request finishes; copying
        every row's whole cache cost 50 ms of a 190 ms step at 16 rows of the demo target (512 slots per row) on a
        2-core CPU.

        Raises:
            DecodingError: ``slots`` outside ``[0, max_len]``.
        """
        K = int(keep.numel())
        dst = (keep != torch.arange(K, device=keep.device)).nonzero().flatten()
        if dst.numel() == 0:
            return
        S = self.max_len if slots is None else int(slots)
        if not 0 <= S <= self.max_len:
            raise DecodingError(f"keep_rows over {S} slots of a cache of {self.max_len}")
        if S == 0:
            return
        src = keep.index_select(0, dst)
        for layer in self.layers:
            for buf in (layer.k, layer.v):  # (B, Hkv, max_len, D)
                buf[dst, :, :S] = buf[:, :, :S].index_select(0, src)  # index_select copies first: overlap-safe

    def compact_rows(self, src_slots: torch.Tensor, dst_start: int) -> None:
        """Per-row compaction: row b's slots ``src_slots[b]`` ((B, A) int64, any order) move to consecutive
        slots ``[dst_start, dst_start + A)`` of row b, in every layer (reads before writes, so overlapping
        ranges are safe). Rows accepting fewer than A slots pad their row of ``src_slots`` with any valid
        slot; the batched decoder marks those destination slots invalid.

        Raises :class:`DecodingError` when a slot lies outside the cache.
        """
        B, A = src_slots.shape
        if A == 0:
            return
        if dst_start < 0 or dst_start + A > self.max_len or int(src_slots.min()) < 0 or int(src_slots.max()) >= self.max_len:
            raise DecodingError(f"compaction of {A} slots to {dst_start} does not fit a cache of {self.max_len}")
        for layer in self.layers:
            for buf in (layer.k, layer.v):
                _, H, _, D = buf.shape
                idx = src_slots.view(B, 1, A, 1).expand(B, H, A, D)
                buf[:, :, dst_start:dst_start + A] = buf.gather(2, idx)
