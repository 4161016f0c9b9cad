"""The exact Sequoia dynamic program: the tree of at most n nodes, depth <= D, branching <= B that maximises
the expected tokens per step G under a positional acceptance vector.

Sequoia (Chen et al. 2024), sections 3.1 / 3.2 and 4.1. Notation used here:

- ``p = (p_1 .. p_K)``: positional acceptance vector; a child of rank ``i`` (0-based) is weighted by
  ``p_{i+1}`` (``p[i]`` in code); ranks ``>= K`` have weight 0.
- ``f(m, d)``: best G of a subtree with **at most** m nodes (its root included) whose nodes lie at most d
  levels below its root. ``f(m, 0) = 1`` and ``f(0, d) = 0``.
- ``g(i, m, d)``: best value of the children of one node when they take the consecutive ranks ``i, i+1, ..``
  (children form a prefix of ranks: no gap), using at most m nodes in all, each child subtree with depth
  limit ``d - 1``::

      g(B, m, d) = 0
      g(i, m, d) = max( 0,                                        # no child of rank i (stop here)
                        max_{1 <= s <= m} p[i] * f(s, d-1) + g(i+1, m-s, d) )
      f(m, d)    = 1 + g(0, m-1, d)                               # m >= 1

This is the left-child / right-sibling form of the Sequoia recurrence: the child of rank i takes s nodes,
its younger siblings share the rest. Because "at most m" is built into the tables, ``f`` is non-decreasing
in m and in d, and the table ``G[m, d] = f(m, d)`` is exactly what the hardware-aware choice needs.
Non-monotone p is handled exactly (a rank-2 child still needs ranks 0 and 1 present); zeros in p give
zeros, never NaN (no division anywhere).

Cost: O(D * B_eff * n^2 / 2) multiply-add-max steps, where ``B_eff = min(B, 1 + last rank with p > 0)``:
ranks after the last positive entry can never add value, so they are dropped exactly. The inner loop runs
over m for a fixed child size s (``g_i[m] = max(g_i[m], c_s + g_{i+1}[m - s])``), which is a contiguous,
dependency-free loop LLVM vectorises; the ``max over s`` reduction order would serialise on the max chain.
Once a whole level ``f(., d)`` equals ``f(., d-1)`` the depth limit no longer binds for any m <= n and the
remaining levels are copies. A child subtree with depth limit d-1 can hold at most ``1 + B_eff + .. + B_eff^(d-1)`` nodes, so s is capped
there (it matters for the first few levels). Tables are float64, ``g`` is kept for every d for
reconstruction: ``(D+1) * (B_eff+1) * n`` floats (18 MB at n=2048, D=32, B=32).

Reconstruction recomputes the argmax from the stored tables (no argmax table needed), preferring "stop"
and then the smallest child size on ties, so a tree never carries nodes that add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from ..errors import SolverError
from ..profiles import validate_acceptance
from ..tree import Tree

#: Largest table the solver will allocate, in float64 entries of ``g`` (about 800 MB).
MAX_TABLE_ENTRIES = 100_000_000

# Relative tolerance for ties during reconstruction: an option within this of the best counts as best.
_TIE_RTOL = 1e-12


@njit(cache=True)
def _dp_tables(p, n, D):  # pragma: no cover - compiled
    """f: (D+1, n+1) with f[d, m] = best G with at most m nodes, depth <= d.
    g: (D+1, Be+1, n) with g[d, i, m] as in the module docstring (m < n since f(m) = 1 + g(m-1))."""
    Be = p.shape[0]
    f = np.zeros((D + 1, n + 1))
    g = np.zeros((D + 1, Be + 1, n))
    for m in range(1, n + 1):
        f[0, m] = 1.0
    cur = np.zeros(n)
    nxt = np.zeros(n)
    for d in range(1, D + 1):
        # largest useful child-subtree size at depth limit d-1: 1 + Be + ... + Be^(d-1), capped at n-1
        cap = 0
        level = 1
        for _ in range(d):
            cap += level
            if cap >= n - 1:
                cap = n - 1
                break
            level *= Be
        if cap > n - 1:
            cap = n - 1
        fprev = f[d - 1]
        for m in range(n):
            nxt[m] = 0.0  # g(Be, m, d) = 0
        for i in range(Be - 1, -1, -1):
            pi = p[i]
            for m in range(n):
                cur[m] = 0.0  # the "stop" option
            for s in range(1, cap + 1):
                c = pi * fprev[s]
                for m in range(s, n):
                    v = c + nxt[m - s]
                    cur[m] = v if v > cur[m] else cur[m]
            for m in range(n):
                g[d, i, m] = cur[m]
                nxt[m] = cur[m]
        same = True
        for m in range(1, n + 1):
            f[d, m] = 1.0 + g[d, 0, m - 1]
            if f[d, m] != f[d - 1, m]:
                same = False
        if same:
            # the depth limit no longer binds for any m <= n: every deeper level is identical (exact)
            for dd in range(d + 1, D + 1):
                f[dd, :] = f[d, :]
                g[dd, :, :] = g[d, :, :]
            break
    return f, g


@njit(cache=True)
def _reconstruct(p, f, g, m, d, parent, rank, depth):  # pragma: no cover - compiled
    """Fill parent/rank/depth (length >= m) for the optimal tree with at most m nodes, depth <= d.
    Nodes come out in depth-first order (node 0 = root). Returns the number of nodes used."""
    Be = p.shape[0]
    stack_node = np.empty(m, dtype=np.int64)
    stack_budget = np.empty(m, dtype=np.int64)
    stack_limit = np.empty(m, dtype=np.int64)
    parent[0] = -1
    rank[0] = 0
    depth[0] = 0
    count = 1
    top = 0
    stack_node[0] = 0
    stack_budget[0] = m
    stack_limit[0] = d
    top = 1
    while top > 0:
        top -= 1
        v = stack_node[top]
        budget = stack_budget[top]
        lim = stack_limit[top]
        if lim == 0 or budget <= 1:
            continue
        r = budget - 1
        i = 0
        while i < Be and r > 0:
            target = g[lim, i, r]
            tol = 1e-12 * (target if target > 1.0 else 1.0)
            if 0.0 >= target - tol:
                break  # stop: no child of rank i (or later)
            best_s = 0
            for s in range(1, r + 1):
                val = p[i] * f[lim - 1, s] + g[lim, i + 1, r - s]
                if val >= target - tol:
                    best_s = s
                    break
            if best_s == 0:  # cannot happen: the table value is one of the options
                best_s = r
            parent[count] = v
            rank[count] = i
            depth[count] = depth[v] + 1
            stack_node[top] = count
            stack_budget[top] = best_s
            stack_limit[top] = lim - 1
            top += 1
            count += 1
            r -= best_s
            i += 1
    return count


@njit(cache=True)
def _level_widths_many(p, f, g, ms, ds):  # pragma: no cover - compiled
    """For each pair (ms[j], ds[j]): the optimal tree's level widths, shape (len(ms), max(ds)+1)."""
    k = ms.shape[0]
    out = np.zeros((k, ds.max() + 1), dtype=np.int64)
    mmax = ms.max()
    parent = np.empty(mmax, dtype=np.int64)
    rank = np.empty(mmax, dtype=np.int64)
    depth = np.empty(mmax, dtype=np.int64)
    for j in range(k):
        cnt = _reconstruct(p, f, g, ms[j], ds[j], parent, rank, depth)
        for t in range(cnt):
            out[j, depth[t]] += 1
    return out


def _check_int(name: str, value: int, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise SolverError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise SolverError(f"{name} must be at least {low}, got {value}")
    return int(value)


def effective_acceptance(acceptance, max_branching: int) -> np.ndarray:
    """The part of the (validated) acceptance vector the DP can use: ``p[:B]`` cut after its last positive
    entry (later ranks add nothing). Shape ``(B_eff,)``, possibly empty when every entry is 0."""
    p = validate_acceptance(acceptance)[:max_branching]
    pos = np.nonzero(p > 0.0)[0]
    return np.ascontiguousarray(p[: (int(pos[-1]) + 1 if pos.size else 0)], dtype=np.float64)


@dataclass(frozen=True)
class DPSolution:
    """All optimal values for budgets ``m <= max_nodes`` and depths ``d <= max_depth``, with reconstruction.

    Attributes:
        acceptance: (K,) the validated acceptance vector as given.
        max_nodes / max_depth / max_branching: the limits n, D, B the tables were built for.
        table: (n+1, D+1) float64; ``table[m, d]`` = best expected tokens per step (tokens/step) over trees
            with at most m nodes (root included) and depth at most d. Row 0 is 0, ``table[1, :] = 1``.
    """

    acceptance: np.ndarray
    max_nodes: int
    max_depth: int
    max_branching: int
    table: np.ndarray
    _p_eff: np.ndarray = field(repr=False)
    _f: np.ndarray = field(repr=False)  # (D+1, n+1), table transposed, contiguous for the compiled code
    _g: np.ndarray = field(repr=False)  # (D+1, B_eff+1, n)

    def _check(self, m: int | None, d: int | None) -> tuple[int, int]:
        m = self.max_nodes if m is None else _check_int("budget", m, 1)
        d = self.max_depth if d is None else _check_int("depth", d, 0)
        if m > self.max_nodes or d > self.max_depth:
            raise SolverError(
                f"(budget {m}, depth {d}) is outside the solved range "
                f"(budget <= {self.max_nodes}, depth <= {self.max_depth})"
            )
        return m, d

    def expected_tokens(self, m: int | None = None, d: int | None = None) -> float:
        """Best G (tokens per step) with at most m nodes and depth at most d (defaults: the solved limits).
        Raises SolverError outside the solved range."""
        m, d = self._check(m, d)
        return float(self.table[m, d])

    def _edges(self, m: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parent = np.empty(m, dtype=np.int64)
        rank = np.empty(m, dtype=np.int64)
        depth = np.empty(m, dtype=np.int64)
        if self._p_eff.size == 0 or d == 0:
            zero = np.zeros(1, dtype=np.int64)
            return zero - 1, zero, zero
        cnt = _reconstruct(self._p_eff, self._f, self._g, m, d, parent, rank, depth)
        return parent[:cnt], rank[:cnt], depth[:cnt]

    def tree(self, m: int | None = None, d: int | None = None) -> Tree:
        """The optimal tree with at most m nodes and depth at most d, in canonical order.

        It may have fewer than m nodes when extra nodes add nothing (e.g. p has zeros). Its
        ``expected_tokens(p)`` equals ``table[m, d]`` up to rounding (1e-9 relative).
        """
        m, d = self._check(m, d)
        parent, rank, _ = self._edges(m, d)
        return Tree.from_edges(parent.tolist(), rank.tolist(), max_branching=self.max_branching)

    def level_widths_many(self, budgets, depths) -> np.ndarray:
        """Level widths of the optimal trees for many (budget, depth) pairs at once (compiled, no Tree
        objects). Returns ``(len(budgets), max(depths)+1)`` int64; row j, column t = nodes at depth t.
        Raises SolverError: unequal or empty sequences, a pair outside the solved range."""
        ms = np.asarray(budgets, dtype=np.int64)
        ds = np.asarray(depths, dtype=np.int64)
        if ms.shape != ds.shape or ms.ndim != 1 or ms.size == 0:
            raise SolverError("budgets and depths must be equal-length, non-empty 1-D sequences")
        for m, d in zip(ms.tolist(), ds.tolist()):
            self._check(m, d)
        if self._p_eff.size == 0:
            out = np.zeros((ms.size, int(ds.max()) + 1), dtype=np.int64)
            out[:, 0] = 1
            return out
        return _level_widths_many(self._p_eff, self._f, self._g, ms, ds)


def solve_dp(acceptance, max_nodes: int, max_depth: int, max_branching: int = 32) -> DPSolution:
    """Solve the Sequoia DP (section 3.2 / 4.1) for every budget ``m <= max_nodes`` and depth ``d <= max_depth``.

    Args:
        acceptance: positional acceptance vector ``p_1..p_K`` (probabilities, sum <= 1).
        max_nodes: budget n, nodes including the root (>= 1).
        max_depth: depth limit D (>= 1); the root is depth 0.
        max_branching: B, the most children any node may have (>= 1).

    Returns:
        :class:`DPSolution` with ``table`` of shape ``(n+1, D+1)`` in tokens per step.

    Raises:
        SolverError: a bad acceptance vector (empty, NaN, negative, sum > 1), a budget < 1, a depth < 1,
            a branching < 1, or tables beyond :data:`MAX_TABLE_ENTRIES`.
    """
    p = validate_acceptance(acceptance)
    n = _check_int("budget", max_nodes, 1)
    D = _check_int("max depth", max_depth, 1)
    B = _check_int("max branching", max_branching, 1)
    p_eff = effective_acceptance(p, B)
    entries = (D + 1) * (p_eff.size + 1) * n
    if entries > MAX_TABLE_ENTRIES:
        raise SolverError(
            f"budget {n}, depth {D}, branching {p_eff.size} needs {entries:,} table entries "
            f"(limit {MAX_TABLE_ENTRIES:,}); lower --budget or --max-depth"
        )
    if p_eff.size == 0:  # nothing is ever accepted: the root alone is optimal
        f = np.zeros((D + 1, n + 1))
        f[:, 1:] = 1.0
        g = np.zeros((D + 1, 1, n))
    else:
        f, g = _dp_tables(p_eff, n, D)
    table = np.ascontiguousarray(f.T)
    return DPSolution(p, n, D, B, table, p_eff, f, g)


def optimal_tree(acceptance, budget: int, max_depth: int, max_branching: int = 32) -> Tree:
    """Convenience: the tree maximising G with at most ``budget`` nodes and depth <= ``max_depth``."""
    return solve_dp(acceptance, budget, max_depth, max_branching).tree()
