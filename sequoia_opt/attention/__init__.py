"""Attention for the verification pass (and for every other forward of the bundled decoder).

One entry point, :func:`tree_attention`. Queries for T new tokens attend to

* the whole committed prefix, cache slots ``[0, prefix_len)``, with no mask, and
* the m tree slots ``[prefix_len, prefix_len + m)`` through a (T, m) boolean tree mask.

The same call covers every forward the decoder makes: prefill (``prefix_len`` = tokens already cached, the
tree mask causal), plain decoding (T = m = 1), the draft growing a tree level by level (T = width of the new
level, m = nodes drafted so far including that level) and the target verifying a whole tree (T = m = n, the
tree's ancestor-or-self mask; SpecInfer, Miao et al. 2024, section 4 "tree-based parallel decoding").

Batch > 1 with sequences of different lengths (:mod:`sequoia_opt.decoding.rows`): ``prefix_len`` may be a
:class:`RowPrefix` instead of an int, naming for every batch row which cache slots hold that row's tokens
(the rows share the slot layout, each sees only its own valid slots). Such a call always runs the torch
reference, on every backend: the CUDA kernel takes one int ``prefix_len`` for the whole batch.

Backends: ``"torch"`` is the reference (scaled dot product attention with an explicit prefix + tree mask) and
runs on every device; ``"cuda"`` is the bit-mask kernel in ``kernels/tree_attention.cu``; ``"auto"`` picks
the kernel on CUDA tensors when it is available and supports the shapes, else the reference.

No silent fallback: inside ``with record_backends() as rec:`` every call counts the backend that ran
(``rec.ran``) and, when ``"auto"`` or a per-row prefix ruled the kernel out, why (``rec.refused``); profiles
store :meth:`BackendRecord.as_dict` in their ``device`` block.
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["TreeMask", "RowPrefix", "tree_attention", "resolve_backend", "causal_tree_mask", "require_tree_mask",
           "require_dense_mask", "BackendRecord", "record_backends", "choose_backend"]


def _type_name(x: object) -> str:
    t = type(x)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def require_tree_mask(tree_mask: object, where: str) -> None:
    """Raise TypeError unless ``tree_mask`` is a :class:`TreeMask` (``where`` names the function for the
    message, which also says how to build one)."""
    if not isinstance(tree_mask, TreeMask):
        raise TypeError(f"{where} takes tree_mask as a sequoia_opt.attention.TreeMask, got {_type_name(tree_mask)}; "
                        "build one from a (T, m) bool tensor with TreeMask.from_dense(mask)")


def require_dense_mask(dense: object, where: str) -> None:
    """Check a dense (T, m) mask argument. Raises TypeError when it is not a tensor (a :class:`TreeMask`:
    pass its ``.dense``), ValueError when it is not a 2-D bool tensor."""
    if isinstance(dense, TreeMask):
        raise TypeError(f"{where} takes the dense (T, m) bool tensor, got a TreeMask; pass its .dense")
    if not isinstance(dense, torch.Tensor):
        raise TypeError(f"{where} takes a (T, m) bool torch.Tensor, got {_type_name(dense)}"
                        + ("; convert it with torch.from_numpy" if type(dense).__module__ == "numpy" else ""))
    if dense.dim() != 2 or dense.dtype != torch.bool:
        raise ValueError(f"tree mask must be a 2-D bool tensor, got {tuple(dense.shape)} {dense.dtype}")


def _require_tensors(where: str, **tensors: object) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where} takes {name} as a torch.Tensor, got {_type_name(t)}")


@dataclass(frozen=True)
class TreeMask:
    """The tree part of an attention mask, kept both dense (for the torch reference) and bit-packed (for
    the CUDA kernel). Build once per tree shape and reuse every step.

    Attributes:
        dense: (T, m) bool; ``dense[i, j]`` is True when query i may attend tree slot j.
        bits: (T, ceil(m / 64)) int64; bit ``j % 64`` of word ``j // 64`` is ``dense[i, j]``.
    """

    dense: torch.Tensor
    bits: torch.Tensor
    #: the torch reference's last full mask, built by the first layer of a forward and read by the others
    #: (:func:`_memo_mask`); one entry, since the prefix length moves every step
    _reference: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def from_dense(cls, dense: torch.Tensor) -> "TreeMask":
        """Pack a (T, m) bool mask. The bits live on the same device as ``dense``.

        Raises:
            TypeError: ``dense`` is not a torch.Tensor (e.g. a numpy array or already a TreeMask).
            ValueError: it is not 2-D bool.
        """
        require_dense_mask(dense, "TreeMask.from_dense")
        return cls(dense=dense, bits=pack_mask_bits(dense))

    @property
    def num_queries(self) -> int:
        """T, the number of tree queries (rows of ``dense``)."""
        return int(self.dense.shape[0])

    @property
    def num_tree_keys(self) -> int:
        """m, the number of tree key slots (columns of ``dense``)."""
        return int(self.dense.shape[1])

    def to(self, device: torch.device | str) -> "TreeMask":
        """A copy with ``dense`` and ``bits`` moved to ``device`` (the torch reference's memoised mask is
        not carried)."""
        return TreeMask(dense=self.dense.to(device), bits=self.bits.to(device))


@dataclass(frozen=True)
class RowPrefix:
    """Per-row key validity for a batch whose sequences have different lengths (passed as ``prefix_len``).

    Every row's queries see prefix slots ``[0, length)`` and the tree slots ``[length, length + m)`` through
    the tree mask, as with an int ``prefix_len``, but only where ``valid`` is True for that row: slot s of
    row b is visible iff ``valid[b, s]`` (for ``s < valid.shape[1]``; slots past ``valid``'s width are
    valid). A row's padding and the holes its shorter accepted paths left are False there, so attention of
    row b never reads another length's padding. A query row that would see no slot at all (a pure padding
    query) attends every slot instead, so its output stays finite (callers discard it; this keeps NaN out
    of the cache, where 0 * NaN would poison every later query).

    Rows may also verify different trees in one forward (per-row trees, as vLLM's per-request draft lengths):
    ``tree`` then gives each row its own (T, m) tree mask and the call's ``tree_mask`` only fixes T and m.

    Attributes:
        length: the shared prefix length (committed slots before the tree region), tokens.
        valid: (B, K) bool, ``K >= length``, on the tensors' device.
        tree: None (every row uses the call's tree mask) or (B, T, m) bool, row b's tree mask.
    """

    length: int
    valid: torch.Tensor
    tree: torch.Tensor | None = None
    #: the torch reference's full mask per (tree mask, query heads per KV head), built by the first layer of a
    #: forward and read by the others (:func:`_memo_mask`; a RowPrefix lives for one forward)
    _reference: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.valid, torch.Tensor) or self.valid.dim() != 2 or self.valid.dtype != torch.bool:
            raise ValueError("RowPrefix.valid must be a (B, K) bool tensor")
        if self.tree is not None and (not isinstance(self.tree, torch.Tensor) or self.tree.dim() != 3
                                      or self.tree.dtype != torch.bool or self.tree.shape[0] != self.valid.shape[0]):
            raise ValueError("RowPrefix.tree must be a (B, T, m) bool tensor, one tree mask per row")
        if self.valid.shape[1] < self.length or self.length < 0:
            raise ValueError(f"RowPrefix.valid covers {self.valid.shape[1]} slots, fewer than its prefix "
                             f"length {self.length}")


@dataclass
class BackendRecord:
    """Which attention backend ran, counted per :func:`tree_attention` call made while it records.

    Attributes:
        ran: ``{"cuda" | "torch": calls}``.
        refused: ``{"cuda: <reason>": calls}``: calls that did not run the kernel although it was not ruled
            out by the caller (``backend="auto"``, or a :class:`RowPrefix`, which only the reference takes).
            A call asking for ``"torch"`` is not a refusal.

    A CUDA-graph replay repeats the calls its capture made without running Python, so it is not counted
    (:mod:`sequoia_opt.model.graphs` counts replays).
    """

    ran: Counter = field(default_factory=Counter)
    refused: Counter = field(default_factory=Counter)

    def note(self, ran: str, refused: str | None = None) -> None:
        """Count one :func:`tree_attention` call: ``ran`` is the backend that ran it (``"cuda"``, ``"torch"``, ...);
        ``refused``, when the CUDA kernel declined the call, is its reason, counted as ``"cuda: <reason>"``."""
        self.ran[ran] += 1
        if refused is not None:
            self.refused[f"cuda: {refused}"] += 1

    @property
    def backend(self) -> str | None:
        """The one backend every counted call ran, ``"mixed"`` when several did, None when nothing ran."""
        if not self.ran:
            return None
        return next(iter(self.ran)) if len(self.ran) == 1 else "mixed"

    def as_dict(self) -> dict[str, object]:
        """``{"backend": ..., "calls": {backend: n}, "refused": {reason: n}}`` (plain types, for YAML/JSON)."""
        return {"backend": self.backend, "calls": dict(sorted(self.ran.items())),
                "refused": dict(sorted(self.refused.items()))}


_RECORD: ContextVar[BackendRecord | None] = ContextVar("treeopt_attention_record", default=None)


@contextmanager
def record_backends() -> Iterator[BackendRecord]:
    """Count the attention backend of every :func:`tree_attention` call in this block (this thread / task;
    nested blocks record apart, the inner one only). Yields the :class:`BackendRecord`."""
    rec = BackendRecord()
    token = _RECORD.set(rec)
    try:
        yield rec
    finally:
        _RECORD.reset(token)


def pack_mask_bits(dense: torch.Tensor) -> torch.Tensor:
    """Pack a (T, m) bool mask into (T, ceil(m / 64)) int64 words, little-endian bit order within a word.

    Bit 63 lands in the sign bit (int64 has no unsigned twin in torch); the kernel reads the words as
    ``uint64``.
    """
    T, m = dense.shape
    words = max(1, (m + 63) // 64)
    padded = torch.zeros(T, words * 64, dtype=torch.int64, device=dense.device)
    padded[:, :m] = dense.to(torch.int64)
    shifts = torch.arange(64, dtype=torch.int64, device=dense.device)
    # (T, words, 64) -> (T, words); distinct powers of two, so the sum is a bitwise OR (wraps into bit 63)
    return (padded.view(T, words, 64) << shifts).sum(dim=-1)


def causal_tree_mask(T: int, device: torch.device | str | None = None) -> TreeMask:
    """A (T, T) lower-triangular mask: T new tokens in a row (prefill, or a chain)."""
    return TreeMask.from_dense(torch.ones(T, T, dtype=torch.bool, device=device).tril())


def resolve_backend(backend: str, device: torch.device | str) -> str:
    """Resolve ``"auto"`` to a concrete backend for tensors on ``device`` (a torch.device or its name).
    Raises ValueError on an unknown name, RuntimeError when ``"cuda"`` is asked for on a non-CUDA device,
    TypeError when ``device`` is neither a torch.device nor a str."""
    if isinstance(device, str):
        device = torch.device(device)
    elif not isinstance(device, torch.device):
        raise TypeError(f"resolve_backend takes device as a torch.device or str, got {_type_name(device)}")
    if backend not in ("auto", "torch", "cuda"):
        raise ValueError(f"unknown attention backend {backend!r}; use 'auto', 'torch' or 'cuda'")
    if backend == "cuda" and device.type != "cuda":
        raise RuntimeError(f"the 'cuda' attention backend needs CUDA tensors, got device {device}")
    if backend == "auto":
        if device.type == "cuda":
            from . import cuda as _cuda  # imported lazily: builds the kernel on first use

            return "cuda" if _cuda.is_available() else "torch"
        return "torch"
    return backend


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: int | RowPrefix,
    tree_mask: TreeMask,
    *,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Attention of T new queries over a committed prefix (dense) plus m tree slots (masked).

    Args:
        q: (B, Hq, T, D) queries of the new tokens.
        k_cache, v_cache: (B, Hkv, S, D) static KV cache; slots ``[0, prefix_len)`` hold the committed
            prefix and ``[prefix_len, prefix_len + m)`` the tree tokens (already written). ``Hq`` must be a
            multiple of ``Hkv`` (grouped-query attention: query head h reads KV head ``h // (Hq // Hkv)``).
        prefix_len: committed tokens L visible to every query without a mask (0 <= L, L + m <= S); or a
            :class:`RowPrefix` (batch > 1, rows of different lengths: L shared, per-row valid slots), which
            always runs the torch reference.
        tree_mask: (T, m) mask over the tree slots, see :class:`TreeMask`.
        scale: softmax scale, default ``1 / sqrt(D)``.
        backend: ``"auto"`` | ``"torch"`` | ``"cuda"``.

    Returns:
        (B, Hq, T, D) attention output, dtype of ``q``.

    Raises:
        TypeError: ``tree_mask`` is not a :class:`TreeMask` (build one with ``TreeMask.from_dense(mask)``),
            or q / the caches are not tensors.
        ValueError: inconsistent shapes, or a slot range past the cache.
    """
    require_tree_mask(tree_mask, "tree_attention")
    _require_tensors("tree_attention", q=q, k_cache=k_cache, v_cache=v_cache)
    B, Hq, T, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    m = tree_mask.num_tree_keys
    rows = prefix_len if isinstance(prefix_len, RowPrefix) else None
    if rows is not None:
        if rows.valid.shape[0] != B:
            raise ValueError(f"RowPrefix.valid has {rows.valid.shape[0]} rows for a batch of {B}")
        prefix_len = rows.length
    if tree_mask.num_queries != T:
        raise ValueError(f"tree mask has {tree_mask.num_queries} rows for {T} queries")
    if rows is not None and rows.tree is not None and tuple(rows.tree.shape[1:]) != (T, m):
        raise ValueError(f"RowPrefix.tree has per-row masks of {tuple(rows.tree.shape[1:])}, not ({T}, {m})")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads is not a multiple of {Hkv} KV heads")
    if prefix_len < 0 or prefix_len + m > S:
        raise ValueError(f"slots [0, {prefix_len + m}) do not fit a cache of {S} slots")
    if scale is None:
        scale = D**-0.5
    rec = _RECORD.get()
    if rows is not None:
        if rec is not None:  # on CUDA the kernel was not ruled out by the caller: say why it did not run
            rec.note("torch", None if backend == "torch" or q.device.type != "cuda" else
                     "a per-row prefix (batch rows of different lengths) runs the torch reference")
        return tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask.dense, scale, rows.valid,
                                        rows.tree, memo=rows._reference)
    ran, refused = choose_backend(backend, q, k_cache, v_cache)
    if rec is not None:
        rec.note(ran, refused)
    if ran == "cuda":
        from . import cuda as _cuda

        return _cuda.tree_attention_cuda(q, k_cache, v_cache, prefix_len, tree_mask, scale)
    return tree_attention_reference(q, k_cache, v_cache, prefix_len, tree_mask.dense, scale, memo=tree_mask._reference)


def choose_backend(backend: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[str, str | None]:
    """The backend one :func:`tree_attention` call runs (an int prefix), and why the kernel was refused.

    ``"torch"`` runs the reference; ``"cuda"`` the kernel (its own errors say why it cannot); ``"auto"`` the kernel
    on CUDA tensors when it is available and takes these tensors (dtype, head_dim, layout), else the reference
    with the reason: :func:`~sequoia_opt.attention.cuda.unavailable_reason` or
    :func:`~sequoia_opt.attention.cuda.unsupported_reason`. On a CPU, ``"auto"`` is the reference with no
    refusal (there is no kernel to refuse).

    Returns:
        ``("cuda" | "torch", reason or None)``.

    Raises:
        ValueError / RuntimeError: as :func:`resolve_backend` (an unknown name, ``"cuda"`` off CUDA).
    """
    if resolve_backend(backend, q.device) == "cuda":
        from . import cuda as _cuda

        # "auto" falls back to the reference for tensors the kernel does not take (float32, head_dim 96, ...)
        refused = None if backend == "cuda" else _cuda.unsupported_reason(q, k_cache, v_cache)
        return ("cuda", None) if refused is None else ("torch", refused)
    if backend == "auto" and q.device.type == "cuda":
        from . import cuda as _cuda

        return "torch", _cuda.unavailable_reason() or "the kernel is unavailable"
    return "torch", None


def tree_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: int,
    tree_dense: torch.Tensor,
    scale: float,
    row_valid: torch.Tensor | None = None,
    row_tree: torch.Tensor | None = None,
    memo: dict | None = None,
) -> torch.Tensor:
    """The torch reference: scaled dot product attention with an explicit boolean mask.

    Shapes as in :func:`tree_attention`; ``tree_dense`` is the (T, m) bool tree mask. The full mask is
    (T, L + m): ones over the prefix columns, then the tree mask. With ``row_valid`` ((B, K) bool,
    :attr:`RowPrefix.valid`) it is (B, 1, T, L + m): that mask and, per row, its valid slots (slots past K
    valid; a query row left with no slot sees every slot, see :class:`RowPrefix`); ``row_tree`` ((B, T, m)
    bool, :attr:`RowPrefix.tree`) replaces the tree columns row by row. ``memo``: a dict the full mask is kept
    in for the next call with the same inputs (:func:`_memo_mask`; :func:`tree_attention` passes the
    :class:`TreeMask`'s or the :class:`RowPrefix`'s, so a forward builds it once rather than once per layer).

    Raises:
        TypeError: ``tree_dense`` is not a tensor (a :class:`TreeMask`: pass its ``.dense``).
        ValueError: ``tree_dense`` is not 2-D bool (a float mask would be added to the scores by SDPA).
    """
    require_dense_mask(tree_dense, "tree_attention_reference")
    B, Hq, T, D = q.shape
    Hkv = k_cache.shape[1]
    m = tree_dense.shape[1]
    k = k_cache[:, :, : prefix_len + m]  # (B, Hkv, L + m, D)
    v = v_cache[:, :, : prefix_len + m]
    G = Hq // Hkv
    build = lambda: _reference_mask(tree_dense, prefix_len, G, B, T, row_valid, row_tree, q.device)  # noqa: E731
    mask = build() if memo is None else _memo_mask(memo, (prefix_len, G, q.device, id(tree_dense)), tree_dense,
                                                   build)
    if G == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    # grouped-query attention without copying the cache G times: query head h = kv * G + g reads KV head kv,
    # so the G query heads of a KV head become G * T query rows of that head (rows are independent)
    qg = q.reshape(B, Hkv, G * T, D)  # (B, Hkv, G*T, D), rows ordered (g, t)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)  # (B, Hkv, G*T, D)
    return out.reshape(B, Hq, T, D)


def _memo_mask(memo: dict, key: tuple, held: torch.Tensor, build) -> torch.Tensor:
    """The full mask kept in ``memo`` under ``key`` (prefix length, grouping, device and the identity of the tree
    mask's dense tensor, ``held`` so that no other tensor takes its id while the entry lives), else ``build()``,
    kept as the memo's one entry. Sound because what the key leaves out does not change while the memo lives: a
    :class:`TreeMask` is immutable (its bits were packed from ``dense`` when it was built), and a
    :class:`RowPrefix` describes the rows of the forward it was built for (the drafters' level forwards share
    one; nothing commits between them). Not while a CUDA graph is being captured: every captured layer then
    builds its own, so a replay never reads a mask an eager call left behind."""
    if key[2].type == "cuda" and torch.cuda.is_current_stream_capturing():
        return build()
    hit = memo.get(key)
    if hit is not None:
        return hit[0]
    mask = build()
    memo.clear()
    memo[key] = (mask, held)
    return mask


def _reference_mask(tree_dense: torch.Tensor, prefix_len: int, G: int, B: int, T: int,
                    row_valid: torch.Tensor | None, row_tree: torch.Tensor | None,
                    device: torch.device) -> torch.Tensor:
    """The bool mask :func:`tree_attention_reference` hands SDPA: (G*T, L + m) shared by the rows, or
    (B, 1, G*T, L + m) with ``row_valid`` / ``row_tree``; rows ordered (g, t) as the grouped queries."""
    m = tree_dense.shape[1]
    # (T, L + m): every query sees the whole prefix, and among tree slots only its allowed ones
    if row_tree is not None:  # (B, T, L + m): the prefix, then each row's own tree mask
        mask = torch.cat([torch.ones(B, T, prefix_len, dtype=torch.bool, device=device), row_tree], dim=2)
    else:
        mask = torch.cat([torch.ones(T, prefix_len, dtype=torch.bool, device=device), tree_dense], dim=1)
    if row_valid is not None:
        S_used = prefix_len + m
        valid = row_valid[:, :S_used]
        if valid.shape[1] < S_used:
            valid = torch.cat([valid, valid.new_ones(valid.shape[0], S_used - valid.shape[1])], dim=1)
        mask = (mask if mask.dim() == 3 else mask.unsqueeze(0)) & valid.unsqueeze(1)  # (B, T, L + m)
        mask = (mask | ~mask.any(-1, keepdim=True)).unsqueeze(1)  # (B, 1, T, L + m)
    if G == 1:
        return mask
    return mask.repeat(G, 1) if mask.dim() == 2 else mask.repeat(1, 1, G, 1)  # (G*T, L+m) | (B, 1, G*T, L+m)
