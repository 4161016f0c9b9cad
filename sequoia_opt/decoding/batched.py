"""Batch > 1: b prompts of different lengths decoded together, one tree per step for the whole batch
(greedy), and plain batched decoding (the baseline at batch b) on the same forward.

Serving systems batch sequences: at batch b a step feeds the target b x n tokens, so the best tree shrinks
as b grows (Sequoia, Chen et al. 2024, section 4.2 and its batch-size experiments). This module is the
bundled decoder's batch mode; ``profiling/batch.py`` measures T(b, n) and ``solver/batch.py`` picks the
tree per batch size.

Layout: padded rows, shared slot frontier, per-row valid slots
---------------------------------------------------------------
The static caches (:class:`~sequoia_opt.model.ModelKVCache`, one row per sequence) are shared by all rows
slot for slot. Row i's committed tokens sit at slots of row i where its ``valid`` mask is True; every slot
in ``[0, F)`` (F, the *frontier*) is either one of its tokens or a hole. Each step's tree goes at the shared
slots ``[F, F + n)`` of every row, at row i's own positions ``L_i + depth`` (positions are per row, so a
hole changes nothing: rotary positions are baked into the keys, and attention over a set of keys does not
depend on the slots they sit in). Attention gets a :class:`~sequoia_opt.attention.RowPrefix`: the prefix
``[0, F)`` through each row's valid mask, then the tree mask, so row i never sees row j's tokens, padding, or
stale slots.

* Prefill: row by row, through the batch-1 forward on a one-row view of the cache (``cache.rows(i, i+1)``),
  prompt i at slots ``[0, P_i - 1)`` exactly as the batch-1 decoder does it; F = max_i (P_i - 1). Shorter
  prompts leave holes ``[P_i - 1, F)``. (A server would prefill in chunks; prefill is not what is timed.)
* Commit: row i's accepted path (A_i nodes, root first) moves from ``F + path_i`` to ``[F, F + A_i)`` of
  row i (:meth:`ModelKVCache.compact_rows`, one gather per layer for all rows); slots
  ``[F + A_i, F + A_max)`` of row i become holes; F grows by A_max.
* Repack: when the next tree would not fit behind F, every row's valid slots are gathered to
  ``[0, L_i)`` (one gather per layer) and F becomes max_i L_i; only then, if the tree still does not fit, is
  it clipped to the levels that fit, as in the batch-1 decoder (exact). A row therefore never needs more
  slots than it would alone: a batch fits the cache iff every prompt does (``P_i + M - 1 <= max_len``).
* Stop: per row (its first EOS, ``max_new_tokens``); a finished row leaves the batch (its cache row is
  dropped by :meth:`ModelKVCache.keep_rows`), so the batch shrinks as sequences finish.

The draft model keeps its own cache in the same layout (its own frontier and valid mask). Its catch-up chunk
(the committed tokens it has not cached yet, ending at the root) has 1 token in most rows and 2 in rows whose
accepted path reached the step tree's last level, which the draft never processes; the chunk is right-aligned,
shorter rows padded with slots marked invalid, so every row's root sits at the same slot.

Exactness: row i's attention reads exactly its own committed keys at its own positions, so greedy output of
every row is the target's greedy decoding of that prompt alone (tests compare with the batch-1
:class:`~sequoia_opt.decoding.AutoregressiveDecoder`), up to float32 summation order of the batched GEMMs,
the same caveat as tree vs plain decoding at batch 1.

Scope: greedy decoding (temperature 0) with a draft :class:`~sequoia_opt.model.Transformer` (or none: plain
batched decoding). Sampling, and the other drafters (prompt lookup, layer skip, grafted trees) stay batch 1.
Attention with a :class:`RowPrefix` runs the torch reference on every backend (the CUDA kernel takes one int
prefix length per call, so on CUDA a batched decode uses SDPA).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch

from ..attention import RowPrefix, TreeMask, resolve_backend
from ..errors import DecodingError
from ..model import ModelKVCache, Transformer
from ..tree import Tree
from .buffers import TreeBuffers
from .core import DEFAULT_MAX_LEN, causal_mask, check_request, model_output_error, run_causal_chunk, truncate
from .sampling import argmax_tokens, verify_greedy
from .stats import Clock, GenerationResult, StepStats

__all__ = ["BatchedDecoder", "BatchResult", "BatchStep", "batched_autoregressive"]


@dataclass(frozen=True)
class BatchStep:
    """One batched step.

    Attributes:
        batch: live sequences in this step (rows of the forwards).
        tree_size, tree_depth: the step's tree (clipped near the end of the cache / context; 1, 0 for plain).
        emitted: tokens emitted by each live row (after its stop rules), in row order.
        draft_ms, verify_ms, bookkeeping_ms: wall time of the draft forwards, of the target forward, and of
            accept + commit + row removal (ms).
    """

    batch: int
    tree_size: int
    tree_depth: int
    emitted: tuple[int, ...]
    draft_ms: float
    verify_ms: float
    bookkeeping_ms: float

    @property
    def total_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.bookkeeping_ms


@dataclass
class BatchResult:
    """A batch's generation: one :class:`GenerationResult` per prompt (in the order given; their ``steps``
    hold each row's per-step tokens, with the batch step's times) and the batch's steps.

    Attributes:
        results: per prompt.
        steps: per batched step.
        prefill_ms: wall time of the prefill of every row (ms).
    """

    results: list[GenerationResult]
    steps: list[BatchStep] = field(default_factory=list)
    prefill_ms: float = 0.0

    @property
    def decode_ms(self) -> float:
        """Wall time of all batched steps (ms), prefill excluded."""
        return sum(s.total_ms for s in self.steps)

    @property
    def total_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.results)

    @property
    def tokens_per_second(self) -> float:
        """Total decoding throughput of the batch (tokens / s over all sequences), prefill excluded."""
        ms = self.decode_ms
        return 1000.0 * self.total_tokens / ms if ms > 0 else 0.0

    @property
    def tokens_per_second_per_sequence(self) -> float:
        """Throughput per sequence: total tokens / s divided by the batch size (tokens / s)."""
        return self.tokens_per_second / max(1, len(self.results))


class _Rows:
    """One model's batched cache state: the cache (max_batch rows), the live rows' valid slots (B, S) bool and
    the frontier F (see the module docstring)."""

    def __init__(self, cache: ModelKVCache, device: torch.device) -> None:
        self.base = cache
        self.device = device
        self.view = cache
        self.valid = torch.zeros(0, cache.max_len, dtype=torch.bool, device=device)
        self.frontier = 0
        self.repacks = 0  # repacks so far (tests read it)

    def reset(self, batch: int) -> None:
        self.view = self.base.rows(0, batch)
        self.valid = torch.zeros(batch, self.base.max_len, dtype=torch.bool, device=self.device)
        self.frontier = 0

    def prefix(self, extra: torch.Tensor | None = None, length: int | None = None) -> RowPrefix:
        """The RowPrefix of the committed slots ``[0, F)``, with ``extra`` (B, c) validity columns for the slots
        after F; its shared prefix length is ``length`` (default F: ``extra`` then covers tree slots)."""
        valid = self.valid[:, : self.frontier]
        if extra is not None:
            valid = torch.cat([valid, extra], dim=1)
        return RowPrefix(self.frontier if length is None else length, valid)

    def commit(self, src: list[list[int]]) -> None:
        """Row i's slots ``src[i]`` move to ``[F, F + len(src[i]))``; F grows by the longest."""
        A = max(len(s) for s in src)
        if A == 0:
            return
        F = self.frontier
        pad = [s + [s[-1] if s else F] * (A - len(s)) for s in src]
        self.view.compact_rows(torch.tensor(pad, dtype=torch.int64, device=self.device), F)
        lens = torch.tensor([len(s) for s in src], device=self.device)
        self.valid[:, F:F + A] = torch.arange(A, device=self.device).unsqueeze(0) < lens.unsqueeze(1)
        self.frontier = F + A

    def repack(self) -> None:
        """Gather each row's valid slots to ``[0, count_i)``; F becomes the largest count."""
        counts = self.valid.sum(1)
        C = int(counts.max()) if counts.numel() else 0
        if C == self.frontier:
            return
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :C]  # valid slots first
        self.view.compact_rows(order, 0)
        self.repacks += 1
        self.valid = torch.arange(self.base.max_len, device=self.device).unsqueeze(0) < counts.unsqueeze(1)
        self.frontier = C

    def keep(self, keep: torch.Tensor) -> None:
        self.view.keep_rows(keep)
        self.view = self.base.rows(0, int(keep.numel()))
        self.valid = self.valid.index_select(0, keep)


class BatchedDecoder:
    """Tree speculative decoding (greedy) of a batch of prompts, one tree per step for every sequence; with
    ``draft=None`` and a root-only tree, plain batched autoregressive decoding (the baseline at batch b).

    Args:
        target: the model whose greedy output is preserved.
        draft: a draft :class:`Transformer` sharing the target's vocabulary and device, or None (plain
            decoding: the tree must be root-only or None).
        tree: the speculation tree (n nodes, depth D); None = root-only.
        eos_ids: ids that stop a sequence (its first EOS is emitted).
        backend: attention backend for the batch-1 prefill (``"auto" | "torch" | "cuda"``); the batched
            forwards run the torch reference (module docstring).
        max_len: cache slots per sequence (target and draft); default ``min(context, 4096) + n``.
        max_batch: rows allocated (the most prompts one :meth:`generate` takes).

    Raises:
        DecodingError: vocabularies or devices differ, a tree deeper than 0 without a draft, a node with more
            children than the vocabulary, ``max_len`` or ``max_batch`` < 1.
    """

    def __init__(self, target: Transformer, draft: Transformer | None, tree: Tree | None = None, *,
                 eos_ids: Iterable[int] = (), backend: str = "auto", max_len: int | None = None,
                 max_batch: int = 8) -> None:
        tree = tree if tree is not None else Tree.chain(1)
        V = target.config.vocab_size
        if draft is not None:
            if not isinstance(draft, Transformer):
                raise DecodingError(f"the batched decoder drafts with a draft Transformer, got {type(draft).__name__}")
            if draft.config.vocab_size != V:
                raise DecodingError(f"the draft's vocabulary ({draft.config.vocab_size} tokens) differs from the "
                                    f"target's ({V})")
            if draft.device != target.device:
                raise DecodingError(f"the draft is on {draft.device} but the target on {target.device}")
        elif tree.tree_depth > 0:
            raise DecodingError("a tree of depth >= 1 needs a draft model (draft=None is plain batched decoding)")
        if tree.max_branching_used > V:
            raise DecodingError(f"the tree has a node with {tree.max_branching_used} children but the vocabulary "
                                f"has only {V} tokens")
        if isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < 1:
            raise DecodingError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.context = target.config.max_position_embeddings
        self.max_len = int(max_len if max_len is not None else min(self.context, DEFAULT_MAX_LEN) + tree.size)
        if self.max_len < 1:
            raise DecodingError(f"max_len must be >= 1, got {self.max_len}")
        self.target, self.draft, self.tree = target, draft, tree
        self.max_batch = int(max_batch)
        self.device = target.device
        self.backend = resolve_backend(backend, self.device)
        self.eos_ids = frozenset([int(eos_ids)] if isinstance(eos_ids, int) else (int(t) for t in eos_ids))
        self.buffers = TreeBuffers.build(tree, self.device)
        self._clipped: dict[int, TreeBuffers] = {tree.tree_depth: self.buffers}
        self._t = _Rows(target.new_cache(self.max_len, batch=self.max_batch), self.device)
        drafts = draft is not None and tree.tree_depth > 0
        self._d = _Rows(draft.new_cache(self.max_len, batch=self.max_batch), self.device) if drafts else None
        self.draft_context = draft.config.max_position_embeddings if drafts else 0
        self._masks: dict[int, TreeMask] = {}
        self._clock = Clock(self.device)

    # ------------------------------------------------------------------ checks
    def check(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[list[int]]:
        """Validate a batch before any forward pass. Returns the prompts as lists of ints.

        Raises:
            DecodingError: no prompts, more than ``max_batch``, or a prompt the batch-1 decoders refuse
                (:func:`~sequoia_opt.decoding.core.check_request`: empty, an id outside the vocabulary, prompt
                + ``max_new_tokens`` past the context or the cache's ``max_len`` slots per sequence), the
                message naming the prompt (``prompt 3 of 4: ...``).
        """
        prompts = list(prompts)
        if not prompts:
            raise DecodingError("the batch is empty: give at least one prompt")
        if len(prompts) > self.max_batch:
            raise DecodingError(f"a batch of {len(prompts)} prompts exceeds this decoder's max_batch="
                                f"{self.max_batch} rows")
        out = []
        for i, p in enumerate(prompts):
            try:
                out.append(check_request(p, max_new_tokens, self.target, max_len=self.max_len, role="target"))
            except DecodingError as err:
                raise DecodingError(f"prompt {i} of {len(prompts)} (0-based) cannot be decoded in this batch: "
                                    f"{err}") from None
        return out

    # ------------------------------------------------------------------ the tree of a step
    def _buffers_at(self, depth: int) -> TreeBuffers:
        buf = self._clipped.get(depth)
        if buf is None:
            buf = self._clipped[depth] = self.buffers.clipped(depth)
        return buf

    def _fits(self, d: int, max_L: int, chunk: int) -> bool:
        """Does the tree clipped to depth d fit (target positions / slots, draft positions / slots)?"""
        n_d = self.buffers.level_slices[d].stop
        if max_L + d > self.context - 1 or self._t.frontier + n_d > self.max_len:
            return False
        if d == 0:
            return True
        if self._d is None or not self._draft_live or max_L + d - 1 > self.draft_context - 1:
            return False
        # the draft writes its chunk at [F_d, F_d + chunk), then levels 1..d-1 after the root slot
        return self._d.frontier + chunk - 1 + self.buffers.level_slices[d].start <= self.max_len

    def _step_depth(self, L: list[int], dc: list[int]) -> int:
        D = self.buffers.tree_depth
        max_L = max(L)
        chunk = max(l + 1 - c for l, c in zip(L, dc)) if self._d is not None else 1
        if self._fits(D, max_L, chunk):
            return D
        self._t.repack()  # holes first: a repack restores every row's own slot count
        if self._d is not None and self._draft_live:
            self._d.repack()
        for d in range(D, -1, -1):
            if self._fits(d, max_L, chunk):
                return d
        raise DecodingError(f"no room for the next token at position {max_L} (a state check() refuses)")

    # ------------------------------------------------------------------ generation
    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> BatchResult:
        """Decode up to ``max_new_tokens`` new tokens after each prompt, all prompts in one batch.

        Args:
            prompts: b prompts (token id lists, any lengths), ``b <= max_batch``.
            max_new_tokens: the most tokens per sequence (>= 0); a sequence also stops after its first EOS.

        Returns:
            :class:`BatchResult`: per prompt, in order, its :class:`GenerationResult`.

        Raises:
            DecodingError: as :meth:`check`, before any forward pass; NaN / inf target logits.
        """
        prompts = self.check(prompts, max_new_tokens)
        M = int(max_new_tokens)
        B = len(prompts)
        results = [GenerationResult(tokens=[], prompt_len=len(p)) for p in prompts]
        out = BatchResult(results=results)
        if M == 0:
            for r in results:
                r.stop_reason = "empty"
            return out
        clock = self._clock
        t0 = clock.now()
        self._t.reset(B)
        seqs = [list(p) for p in prompts]
        L = [len(p) - 1 for p in prompts]
        dc = [0] * B  # committed tokens in the draft cache, per row
        self._draft_live = self._d is not None and max(L) <= self.draft_context - 1
        for i, p in enumerate(prompts):
            if len(p) > 1:
                run_causal_chunk(self.target, self._t.base.rows(i, i + 1), p[:-1], 0, self.backend, self._masks)
                self._t.valid[i, : len(p) - 1] = True
        self._t.frontier = max(L)
        if self._draft_live:
            self._d.reset(B)
            for i, p in enumerate(prompts):
                if len(p) > 1:
                    run_causal_chunk(self.draft, self._d.base.rows(i, i + 1), p[:-1], 0, self.backend, self._masks)
                    self._d.valid[i, : len(p) - 1] = True
                dc[i] = len(p) - 1
            self._d.frontier = max(L)
        out.prefill_ms = clock.now() - t0
        rows = list(range(B))  # live row -> prompt index
        while rows:
            t0 = clock.now()
            d = self._step_depth(L, dc)
            if d == 0 and self._d is not None and max(L) > self.draft_context - 1:
                self._draft_live = False  # past the draft's context: root-only from here on
            buf = self._buffers_at(d)
            tokens, chunk_info = self._draft(buf, seqs, L, dc)
            t1 = clock.now()
            logits = self._verify(buf, tokens, L)
            t2 = clock.now()
            try:
                top = argmax_tokens(logits.reshape(-1, logits.shape[-1]))
            except ValueError as err:
                raise model_output_error(err, self.target, "target") from None
            n = buf.n
            tok_rows = tokens.tolist()
            accs = [verify_greedy(top[b * n:(b + 1) * n], tok_rows[b], buf.children) for b in range(len(rows))]
            emitted_counts, done = [], []
            for b, acc in enumerate(accs):
                res = results[rows[b]]
                emitted, stop = truncate(acc.tokens, M - len(res.tokens), self.eos_ids)
                res.tokens.extend(emitted)
                seqs[b].extend(emitted)
                emitted_counts.append(len(emitted))
                res.steps.append(StepStats(tokens=tuple(emitted), accepted_len=len(emitted),
                                           accepted_nodes=len(acc.path) - 1,
                                           accepted_ranks=tuple(self.tree.rank[i] for i in acc.path[1:]),
                                           visits=acc.visits, draft_ms=t1 - t0, verify_ms=t2 - t1,
                                           bookkeeping_ms=0.0, tree_size=n, tree_depth=d))
                if stop is not None:
                    res.stop_reason = stop
                    done.append(b)
            self._commit(accs, L, dc, d, chunk_info)
            if done:
                keep = [b for b in range(len(rows)) if b not in done]
                kt = torch.tensor(keep, dtype=torch.int64, device=self.device)
                if keep:
                    self._t.keep(kt)
                    if self._d is not None and self._draft_live:
                        self._d.keep(kt)
                rows = [rows[b] for b in keep]
                seqs = [seqs[b] for b in keep]
                L = [L[b] for b in keep]
                dc = [dc[b] for b in keep]
            t3 = clock.now()
            out.steps.append(BatchStep(batch=len(accs), tree_size=n, tree_depth=d, emitted=tuple(emitted_counts),
                                       draft_ms=t1 - t0, verify_ms=t2 - t1, bookkeeping_ms=t3 - t2))
        return out

    def _draft(self, buf: TreeBuffers, seqs: list[list[int]], L: list[int], dc: list[int]):
        """The step's (B, n) tree tokens: the draft's catch-up chunk (right-aligned, padded rows invalid), then
        one forward per level 1 .. d-1; children are each row's top-k (greedy). Root-only: no forward."""
        B, n, d = len(seqs), buf.n, buf.tree_depth
        dev = self.device
        out = torch.empty(B, n, dtype=torch.int64, device=dev)
        out[:, 0] = torch.tensor([s[-1] for s in seqs], dtype=torch.int64, device=dev)
        if d == 0:
            return out, None
        rows = self._d
        lens = [l + 1 - c for l, c in zip(L, dc)]  # catch-up chunk per row, ending at the root
        c = max(lens)
        chunk = [[0] * (c - k) + s[dc_i:l + 1] for s, k, dc_i, l in zip(seqs, lens, dc, L)]
        pos = [[0] * (c - k) + list(range(dc_i, l + 1)) for k, dc_i, l in zip(lens, dc, L)]
        chunk_valid = torch.arange(c, device=dev).unsqueeze(0) >= torch.tensor([c - k for k in lens], device=dev).unsqueeze(1)
        F = rows.frontier
        slots = torch.arange(F, F + c, dtype=torch.int64, device=dev)
        mask = causal_mask(c, dev, self._masks)
        logits = self.draft(torch.tensor(chunk, device=dev), torch.tensor(pos, device=dev), cache=rows.view,
                            cache_slots=slots, prefix_len=rows.prefix(chunk_valid), tree_mask=mask,
                            backend="torch")[:, -1:]  # (B, 1, V): the roots'
        R = F + c - 1  # every row's root slot
        prefix = rows.prefix(chunk_valid[:, : c - 1], R)  # committed draft slots + chunk before the root
        Lt = torch.tensor(L, dtype=torch.int64, device=dev).unsqueeze(1)  # (B, 1)
        for lvl in range(d):
            sl = buf.level_slices[lvl]
            if lvl > 0:
                logits = self.draft(out[:, sl], buf.depth[sl].unsqueeze(0) + Lt, cache=rows.view,
                                    cache_slots=buf.node_index[sl] + R, prefix_len=prefix,
                                    tree_mask=buf.level_masks[lvl], backend="torch")  # (B, w, V)
            cand = logits.topk(buf.level_branching[lvl], dim=-1).indices  # (B, w, k)
            out[:, buf.level_slices[lvl + 1]] = cand[:, buf.child_parent_local[lvl + 1], buf.child_rank[lvl + 1]]
        return out, (c, lens)

    def _verify(self, buf: TreeBuffers, tokens: torch.Tensor, L: list[int]) -> torch.Tensor:
        """One target forward over every row's n tree tokens at shared slots ``[F, F + n)``, row positions
        ``L_i + depth``. Returns (B, n, V) logits."""
        dev, F = self.device, self._t.frontier
        Lt = torch.tensor(L, dtype=torch.int64, device=dev).unsqueeze(1)
        return self.target(tokens, buf.depth.unsqueeze(0) + Lt, cache=self._t.view, cache_slots=buf.node_index + F,
                           prefix_len=self._t.prefix(), tree_mask=buf.tree_mask, backend="torch")

    def _commit(self, accs, L: list[int], dc: list[int], d: int, chunk_info) -> None:
        """Compact every row's accepted path in the target cache and, when the step drafted, the draft's new
        tokens (catch-up chunk before the root, the path less a last-level node) in the draft cache."""
        F = self._t.frontier
        self._t.commit([[F + i for i in acc.path] for acc in accs])
        for b, acc in enumerate(accs):
            L[b] += len(acc.path)
        if chunk_info is None:
            return
        c, lens = chunk_info
        Fd = self._d.frontier
        R = Fd + c - 1
        src = []
        for b, acc in enumerate(accs):
            m = len(acc.path) if len(acc.path) - 1 < d else len(acc.path) - 1  # the draft skips the last level
            src.append(list(range(Fd + c - lens[b], R)) + [R + i for i in acc.path[:m]])
            dc[b] += len(src[-1])
        self._d.commit(src)


def batched_autoregressive(target: Transformer, *, eos_ids: Iterable[int] = (), backend: str = "auto",
                           max_len: int | None = None, max_batch: int = 8) -> BatchedDecoder:
    """Plain batched decoding (one target forward over b tokens per step): a :class:`BatchedDecoder` with no
    draft and a root-only tree, the baseline a batched tree is compared with. Arguments as there."""
    return BatchedDecoder(target, None, None, eos_ids=eos_ids, backend=backend, max_len=max_len,
                          max_batch=max_batch)
