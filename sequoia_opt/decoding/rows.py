"""One model's static KV cache laid out for B rows of different lengths: padded rows, a shared slot
frontier, per-row valid slots (the bundled decoder's batch layout; a batch of one is the same layout with
nothing padded).

Serving systems batch sequences; at batch b a step feeds the target b x n tokens, so the best tree shrinks as
b grows (Sequoia, Chen et al. 2024, section 4.2). The rows share the cache slot for slot. Row i's committed
tokens sit at slots of row i where its ``valid`` mask is True; every slot in ``[0, F)`` (F, the *frontier*) is
either one of its tokens or a hole. Each step's tree goes at the shared slots ``[F, F + n)`` of every row, at
row i's own positions ``L_i + depth`` (positions are per row, so a hole changes nothing: rotary positions are
baked into the keys, and attention over a set of keys does not depend on the slots they sit in). Attention
gets a :class:`~sequoia_opt.attention.RowPrefix` (the prefix ``[0, F)`` through each row's valid mask, then
the tree mask), so row i never sees row j's tokens, padding, or stale slots. While no row has a hole (always
for a batch of one) the prefix is the plain int F, which every attention backend takes.

* Prefill: row by row through a one-row view (``cache.rows(i, i + 1)``), prompt i at slots ``[0, P_i - 1)``;
  F = max_i (P_i - 1); shorter prompts leave holes ``[P_i - 1, F)``.
* Commit: row i's accepted slots move to ``[F, F + A_i)`` of row i (one gather per layer for all rows; a
  batch of one compacts its own slots); slots ``[F + A_i, F + A_max)`` of row i become holes; F grows by A_max.
* Repack: when the next tree would not fit behind F, or when F has run more than :data:`REPACK_WASTE` of itself
  past the longest row (:meth:`RowCache.wasteful`), every row's valid slots are gathered to ``[0, L_i)`` and F
  becomes max_i L_i: a row never needs more slots than it would alone.
* Keep: a finished row leaves the batch (its cache row is dropped, the rows after it move up).
* Add: rows join a running batch (continuous batching): prompt j of the joiners is prefilled at slots
  ``[0, P_j - 1)`` of row ``B + j``; F becomes the largest of F and every ``P_j - 1``, the gaps are holes.

Why the second trigger. Every forward attends over the shared prefix ``[0, F)`` of every row, so a step reads
B x F cached keys and values, however few each row holds. Under continuous batching F only grows: it moves by
the step's longest accepted path while rows leave and joiners' prompts sit at ``[0, P - 1)`` far behind it. In a
stream of 12-token requests at 16 rows of the demo target (the schedules benchmark), F ran 47 slots past the
longest row within 60 steps, and it keeps growing until the cache's end forces a repack: a step then reads every
row's keys up to ``max_len``. A paged KV cache (vLLM's PagedAttention, Kwon et al. 2023, section 4) reads each
row's own length; the repack brings F back to the longest row (C = max_i L_i), for the cost of one gather of
the cache, when the slots it saves are worth it (:data:`REPACK_WASTE`). Holes that a repack cannot remove (rows
shorter than the longest) stay: the per-row prefix masks them.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..attention import RowPrefix
from ..model import ModelKVCache

__all__ = ["RowCache", "REPACK_WASTE"]

REPACK_WASTE = 0.25
"""A batch of several rows repacks when its frontier F runs more than this share of F past its longest row C
(``F - C > REPACK_WASTE * F``, i.e. more than x = C w / (1 - w) slots past it: C / 3 at w = 0.25). A repack
saves B x (F - C) slots of every later step's reads and costs a gather of B x C slots (and a sort of the B x
``max_len`` validity mask, small beside it). F runs ahead of C by g slots a step on average (rows accepting less
than the step's longest path, the longest row leaving; 1-2 here), so a repack comes every x / g steps and the
waste read between two averages x / 2 a row: the sum r C g / x + x / 2, r a gathered slot's cost over a read one
(2-3 on a CPU), is least at x = sqrt(2 r g C), 27 slots for C = 100 (w = 0.21) and 55 for C = 400 (w = 0.12) at
g = 1.5, r = 2.5. The sum is flat near its least, so 0.25 serves the demo's 100-slot rows and repacks somewhat
late for long ones. In ``benchmarks/continuous_batching.py``'s stream of 256 requests at 16 rows (the demo pair, 1
thread) the target's cache repacked 5 times per round with plain decoding and 7 with K = 1; plain decoding ran
1.08x the tokens/s it ran without the rule, K = 1 1.10x."""


class RowCache:
    """One model's cache (``max_batch`` rows) in the row layout (module docstring).

    Attributes:
        base: the whole cache.  view: the live rows' cache (``base.rows(0, B)``).
        valid: (B, S) bool, row b's committed slots.  frontier: F.  holes: whether some row has a hole in
            ``[0, F)`` (then attention needs the per-row mask).  repacks: repacks so far (tests read it).
        repack_waste: the share of F that F may run past the longest row before :meth:`wasteful` asks for a
            repack (default :data:`REPACK_WASTE`; None: never, the repack waits for the cache's end).
    """

    def __init__(self, cache: ModelKVCache, device: torch.device) -> None:
        self.base = cache
        self.device = device
        self.view = cache
        self._valid = torch.zeros(0, cache.max_len, dtype=torch.bool, device=device)
        self._one_row_frontier: int | None = None  # a batch of one without holes: valid is [0, F), not kept
        self.frontier = 0
        self.holes = False
        self.repacks = 0
        self.repack_waste: float | None = REPACK_WASTE

    @property
    def valid(self) -> torch.Tensor:
        """(B, S) bool, row b's committed slots (a batch of one without holes keeps only its frontier: the
        tensor is made when asked for)."""
        if self._one_row_frontier is not None:
            self._valid[0, : self._one_row_frontier] = True
            self._valid[0, self._one_row_frontier :] = False
            self._one_row_frontier = None
        return self._valid

    @valid.setter
    def valid(self, value: torch.Tensor) -> None:
        self._valid, self._one_row_frontier = value, None

    @property
    def max_len(self) -> int:
        """The cache's slot capacity per row (the base cache's ``max_len``), tokens."""
        return self.base.max_len

    @property
    def batch(self) -> int:
        """B, the number of rows now in the batch (rows of the ``valid`` mask)."""
        return int(self._valid.shape[0])

    def reset(self, batch: int) -> None:
        """Start a generation of ``batch`` rows with nothing committed."""
        self.view = self.base.rows(0, batch)
        self.valid = torch.zeros(batch, self.base.max_len, dtype=torch.bool, device=self.device)
        self._one_row_frontier = 0 if batch == 1 else None
        self.frontier = 0
        self.holes = False

    def row(self, i: int) -> ModelKVCache:
        """Row i alone (a one-row view sharing the buffers), for its prefill."""
        return self.base.rows(i, i + 1)

    def prefilled(self, lengths: Sequence[int]) -> None:
        """Row i holds ``lengths[i]`` committed tokens at slots ``[0, lengths[i])`` (written through :meth:`row`)."""
        self.frontier = max(lengths) if lengths else 0
        self.holes = any(n != self.frontier for n in lengths)
        if len(lengths) == 1 and not self.holes:
            self._one_row_frontier = self.frontier
            return
        for i, n in enumerate(lengths):
            self.valid[i, :n] = True

    def add(self, lengths: Sequence[int]) -> None:
        """Rows ``B .. B + len(lengths) - 1`` join, each holding ``lengths[j]`` committed tokens at slots
        ``[0, lengths[j])`` (written through :meth:`row` first). Raises ValueError past the cache's rows."""
        B, k = self.batch, len(lengths)
        if B + k > self.base.batch:
            raise ValueError(f"{B} rows and {k} joining exceed the cache's {self.base.batch} rows")
        self.view = self.base.rows(0, B + k)
        new = torch.zeros(k, self.base.max_len, dtype=torch.bool, device=self.device)
        for j, n in enumerate(lengths):
            new[j, :n] = True
        self.valid = torch.cat([self.valid, new])
        self.frontier = max([self.frontier, *lengths])
        counts = self.valid[:, : self.frontier].sum(1)
        self.holes = bool((counts != self.frontier).any())

    def prefix(self, extra: torch.Tensor | None = None, length: int | None = None) -> int | RowPrefix:
        """What attention takes as the committed prefix: the int F while no row has a hole and there is no
        ``extra``; else the :class:`RowPrefix` of slots ``[0, F)`` with ``extra`` (B, c) validity columns for the
        slots after F (a right-aligned catch-up chunk). Its shared prefix length is ``length`` (default F)."""
        L = self.frontier if length is None else length
        if not self.holes and extra is None:
            return L
        valid = self.valid[:, : self.frontier]
        if extra is not None:
            valid = torch.cat([valid, extra], dim=1)
        if valid.shape[1] < L:  # slots between the columns given and the prefix length: every row's
            valid = torch.cat([valid, valid.new_ones(valid.shape[0], L - valid.shape[1])], dim=1)
        return RowPrefix(L, valid)

    def commit(self, src: Sequence[Sequence[int]]) -> None:
        """Row i's slots ``src[i]`` (any order) move to ``[F, F + len(src[i]))``; F grows by the longest."""
        F = self.frontier
        if len(src) == 1 and len(src[0]) == 1 and src[0][0] == F and not self.holes:  # a plain step of one row
            self._one_row_frontier = self.frontier = F + 1
            return
        A = max(len(s) for s in src)
        if A == 0:
            return
        if len(src) == 1 and not self.holes:  # a batch of one: its own slots, no padding; valid is [0, F)
            s = src[0]
            if s[0] != F or s[-1] != F + A - 1 or any(a + 1 != b for a, b in zip(s, s[1:])):
                self.view.compact(torch.tensor(s, dtype=torch.int64, device=self.device), F)
            self._one_row_frontier = self.frontier = F + A
            return
        pad = [list(s) + [s[-1] if s else F] * (A - len(s)) for s in src]
        self.view.compact_rows(torch.tensor(pad, dtype=torch.int64, device=self.device), F)
        lens = torch.tensor([len(s) for s in src], device=self.device)
        self.valid[:, F:F + A] = torch.arange(A, device=self.device).unsqueeze(0) < lens.unsqueeze(1)
        self.frontier = F + A
        if any(len(s) != A for s in src):
            self.holes = True

    def wasteful(self) -> bool:
        """Whether the frontier has run more than :attr:`repack_waste` of itself past the longest live row (module
        docstring: every forward reads ``[0, F)`` of every row). False for a batch of one or one without holes."""
        if not self.holes or self.repack_waste is None or self.batch < 2 or self.frontier == 0:
            return False
        longest = int(self.valid[:, : self.frontier].sum(1).max())
        return self.frontier - longest > self.repack_waste * self.frontier

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
        self.holes = bool((counts != C).any())

    def keep(self, keep: Sequence[int]) -> None:
        """Keep rows ``keep`` (distinct, any order): new row i is old row ``keep[i]``."""
        idx = torch.tensor(list(keep), dtype=torch.int64, device=self.device)
        self.view.keep_rows(idx, self.frontier)  # slots past the frontier hold nothing committed
        self.view = self.base.rows(0, len(keep))
        self.valid = self.valid.index_select(0, idx)
        counts = self.valid[:, : self.frontier].sum(1)
        self.holes = bool((counts != self.frontier).any()) if len(keep) else False
        if self.holes and len(keep) == 1:
            self.repack()  # the last row alone: no holes, so every backend serves it again
