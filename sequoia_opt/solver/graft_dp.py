"""The exact DP over grafted trees (numba): the best tree two drafters grow under a node budget and a depth
limit, for a given set of graft depths (:func:`solve_graft_dp`, :func:`optimal_graft_tree`). The model, the
recurrence and its checks against a brute force: :mod:`sequoia_opt.solver.graft`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
from numba import njit

from ..errors import SolverError
from ..tree import DrafterTree, Tree
from .dp import MAX_TABLE_ENTRIES, _check_int
from .graft_value import GraftAcceptance

__all__ = ["GraftDPSolution", "solve_graft_dp", "optimal_graft_tree"]


#: Value of an impossible option (mandatory children that do not fit the budget).
_NEG = -1e300


# ---------------------------------------------------------------------------------------------- the DP
@njit(cache=True)
def _graft_tables(P, Q, akeys, K1s, allow, sallow, n, D, B, lus):  # pragma: no cover - compiled
    """Tables for depth limit D (module docstring). P: (R, K0) light rows; Q: (NA, R, K1max) strong rows per
    key (rows padded by repeating the last, ranks past K1s[k] zero); akeys: (NA,) ascending; allow: (D,) bool
    per parent depth (grafts under light parents); sallow: (D,) bool per parent depth, a strong node may have
    children there (without lus); lus: light children allowed under strong nodes (then a strong node's
    subtree is scored by F like any node's, and Ls is not filled). Returns F (D+1, n+1), L (D, Kl+1, n),
    S (D, NA, K1max+1, n), H (D, NA, amax+1, n), Fs (D+1, n+1) and Ls (D, Ks+1, n) (the strong-rooted
    subtrees: a chain over the a = 0 vector's ranks, Ks = min(its K1, B), 0 without an a = 0 vector)."""
    R = P.shape[0]
    K0 = P.shape[1]
    NA = akeys.shape[0]
    K1m = Q.shape[2]
    Kl = K0 if K0 < B else B
    amax = 0
    for k in range(NA):
        if akeys[k] > amax:
            amax = akeys[k]
    k0 = 0 if NA > 0 and akeys[0] == 0 else -1  # the index of key a = 0 (the strong's own vector)
    Ks = 0
    if k0 == 0:
        Ks = K1s[0] if K1s[0] < B else B
    F = np.zeros((D + 1, n + 1))
    L = np.zeros((D, Kl + 1, n))
    S = np.zeros((D, NA, K1m + 1, n))
    H = np.full((D, NA, amax + 1, n), _NEG)
    Fs = np.zeros((D + 1, n + 1))
    Ls = np.zeros((D, Ks + 1, n))
    for m in range(1, n + 1):
        F[D, m] = 1.0
        Fs[D, m] = 1.0
    best = np.zeros(n)
    for t in range(D - 1, -1, -1):
        row = t if t < R else R - 1
        fch = F[t + 1]
        if not lus and sallow[t]:  # a strong node's children: the strong's own ranks, strong-rooted subtrees
            fsn = Fs[t + 1]
            for j in range(Ks - 1, -1, -1):  # "at most" chain with the stop option (0); Ls[t, Ks] = 0
                qj = Q[0, row, j]
                for s in range(1, n):
                    c = qj * fsn[s]
                    for m in range(s, n):
                        v = c + Ls[t, j + 1, m - s]
                        if v > Ls[t, j, m]:
                            Ls[t, j, m] = v
        for m in range(1, n + 1):  # without strong children here (Ls = 0), strong nodes are leaves
            Fs[t, m] = 1.0 + Ls[t, 0, m - 1]
        sch = F[t + 1] if lus else Fs[t + 1]  # the value of a strong child's subtree
        for i in range(Kl - 1, -1, -1):  # light chain, "at most" with the stop option (0)
            pi = P[row, i]
            for s in range(1, n):
                c = pi * fch[s]
                for m in range(s, n):
                    v = c + L[t, i + 1, m - s]
                    if v > L[t, i, m]:
                        L[t, i, m] = v
        for m in range(n):
            best[m] = L[t, 0, m]
        if allow[t]:
            for k in range(NA):
                a = akeys[k]
                if a >= B:
                    continue  # no room for a strong child next to a light ones
                kb = K1s[k] if K1s[k] < B - a else B - a
                for j in range(kb - 1, 0, -1):  # strong ranks 1.. (may stop); S[t, k, kb] = 0
                    qj = Q[k, row, j]
                    for s in range(1, n):
                        c = qj * sch[s]
                        for m in range(s, n):
                            v = c + S[t, k, j + 1, m - s]
                            if v > S[t, k, j, m]:
                                S[t, k, j, m] = v
                q0 = Q[k, row, 0]
                for s in range(1, n):  # strong rank 0, mandatory
                    c = q0 * sch[s]
                    for m in range(s, n):
                        v = c + S[t, k, 1, m - s]
                        if v > H[t, k, a, m]:
                            H[t, k, a, m] = v
                for i in range(a - 1, -1, -1):  # light ranks 0..a-1, mandatory
                    pi = P[row, i]
                    for s in range(1, n):
                        c = pi * fch[s]
                        for m in range(s, n):
                            nx = H[t, k, i + 1, m - s]
                            if nx > 0.5 * _NEG:
                                v = c + nx
                                if v > H[t, k, i, m]:
                                    H[t, k, i, m] = v
                for m in range(n):
                    if H[t, k, 0, m] > best[m]:
                        best[m] = H[t, k, 0, m]
        for m in range(1, n + 1):
            F[t, m] = 1.0 + best[m - 1]
    return F, L, S, H, Fs, Ls


@njit(cache=True)
def _graft_reconstruct(P, Q, akeys, K1s, allow, B, lus, F, L, S, H, Fs, Ls, m, parent, rank, drafter,
                       depth):  # pragma: no cover - compiled
    """The optimal tree with at most m nodes for one depth limit's tables, depth-first order (parents before
    children). Ties prefer the light-only option, then the smaller a; within a chain, stopping, then the
    largest child subtree (at equal G that puts the nodes under fewer parents, so fewer nodes need a draft
    forward: it matters to the per-drafter cost). Without ``lus`` a strong node's children are the strong
    chain of Ls / Fs. Returns the number of nodes."""
    R = P.shape[0]
    K0 = P.shape[1]
    Kl = K0 if K0 < B else B
    NA = akeys.shape[0]
    D = F.shape[0] - 1
    Ks = Ls.shape[1] - 1
    SF = F if lus else Fs  # the value table of a strong child's subtree
    stack_node = np.empty(m, dtype=np.int64)
    stack_budget = np.empty(m, dtype=np.int64)
    parent[0] = -1
    rank[0] = 0
    drafter[0] = 0
    depth[0] = 0
    count = 1
    stack_node[0] = 0
    stack_budget[0] = m
    top = 1
    while top > 0:
        top -= 1
        v = stack_node[top]
        bud = stack_budget[top]
        t = depth[v]
        if t >= D or bud <= 1:
            continue
        row = t if t < R else R - 1
        r = bud - 1
        if drafter[v] == 1 and not lus:  # a strong node: the strong's own ranks, strong subtrees
            j = 0
            while j < Ks and r > 0:
                tg = Ls[t, j, r]
                tl = 1e-12 * (tg if tg > 1.0 else 1.0)
                if tg <= tl:
                    break
                best_s = r
                for s in range(r, 0, -1):
                    if Q[0, row, j] * Fs[t + 1, s] + Ls[t, j + 1, r - s] >= tg - tl:
                        best_s = s
                        break
                parent[count] = v
                rank[count] = j
                drafter[count] = 1
                depth[count] = t + 1
                stack_node[top] = count
                stack_budget[top] = best_s
                top += 1
                count += 1
                r -= best_s
                j += 1
            continue
        target = F[t, bud] - 1.0
        tol = 1e-12 * (target if target > 1.0 else 1.0)
        if target <= tol:
            continue
        opt = -1
        if L[t, 0, r] < target - tol and allow[t]:
            for k in range(NA):
                if akeys[k] < B and H[t, k, 0, r] >= target - tol:
                    opt = k
                    break
        if opt == -1:
            i = 0
            while i < Kl and r > 0:
                tg = L[t, i, r]
                tl = 1e-12 * (tg if tg > 1.0 else 1.0)
                if tg <= tl:
                    break
                best_s = r
                for s in range(r, 0, -1):
                    if P[row, i] * F[t + 1, s] + L[t, i + 1, r - s] >= tg - tl:
                        best_s = s
                        break
                parent[count] = v
                rank[count] = i
                drafter[count] = 0
                depth[count] = t + 1
                stack_node[top] = count
                stack_budget[top] = best_s
                top += 1
                count += 1
                r -= best_s
                i += 1
        else:
            k = opt
            a = akeys[k]
            kb = K1s[k] if K1s[k] < B - a else B - a
            for i in range(a + 1):  # light ranks 0..a-1, then strong rank 0 (all mandatory)
                tg = H[t, k, i, r]
                tl = 1e-12 * (abs(tg) if abs(tg) > 1.0 else 1.0)
                best_s = 1
                for s in range(r, 0, -1):
                    if i < a:
                        nx = H[t, k, i + 1, r - s]
                        val = P[row, i] * F[t + 1, s] + nx if nx > 0.5 * _NEG else _NEG
                    else:
                        val = Q[k, row, 0] * SF[t + 1, s] + S[t, k, 1, r - s]
                    if val >= tg - tl:
                        best_s = s
                        break
                parent[count] = v
                rank[count] = i
                drafter[count] = 0 if i < a else 1
                depth[count] = t + 1
                stack_node[top] = count
                stack_budget[top] = best_s
                top += 1
                count += 1
                r -= best_s
            j = 1
            while j < kb and r > 0:  # strong ranks 1.. (may stop)
                tg = S[t, k, j, r]
                tl = 1e-12 * (tg if tg > 1.0 else 1.0)
                if tg <= tl:
                    break
                best_s = r
                for s in range(r, 0, -1):
                    if Q[k, row, j] * SF[t + 1, s] + S[t, k, j + 1, r - s] >= tg - tl:
                        best_s = s
                        break
                parent[count] = v
                rank[count] = a + j
                drafter[count] = 1
                depth[count] = t + 1
                stack_node[top] = count
                stack_budget[top] = best_s
                top += 1
                count += 1
                r -= best_s
                j += 1
    return count


@njit(cache=True)
def _drafter_widths(parent, drafter, depth, cnt, levels):  # pragma: no cover - compiled
    """For a tree in parent-before-child order: (2, levels) processed level widths per drafter
    (DrafterTree.processed_level_widths) and (2,) non-root node counts per drafter."""
    proc = np.zeros((2, cnt), dtype=np.bool_)
    counts = np.zeros(2, dtype=np.int64)
    for v in range(1, cnt):
        proc[drafter[v], parent[v]] = True
        counts[drafter[v]] += 1
    widths = np.zeros((2, levels), dtype=np.int64)
    for v in range(cnt - 1, -1, -1):
        for k in range(2):
            if proc[k, v]:
                widths[k, depth[v]] += 1
                if v > 0:
                    proc[k, parent[v]] = True
    return widths, counts


def _normalize_graft_depths(graft_depths: Iterable[int] | None, D: int, what: str = "graft") -> frozenset[int]:
    if graft_depths is None:
        return frozenset(range(D))
    if isinstance(graft_depths, (str, bytes)):
        raise SolverError(f"{what} depths must be a set of parent depths (integers >= 0), got {graft_depths!r}")
    try:
        items = list(graft_depths)
    except TypeError:
        raise SolverError(f"{what} depths must be a set of parent depths (integers >= 0), got {graft_depths!r}") from None
    for t in items:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
            raise SolverError(f"{what} depth {t!r} must be an integer >= 0 (the depth of the parent: 0 = the root)")
    return frozenset(int(t) for t in items)


@dataclass(frozen=True)
class _Packed:
    """The acceptance model as the compiled code takes it."""

    P: np.ndarray  # (R, K0)
    Q: np.ndarray  # (NA, R, K1max)
    akeys: np.ndarray  # (NA,) int64
    K1s: np.ndarray  # (NA,) int64


def _pack(acc: GraftAcceptance) -> _Packed:
    keys = acc.keys
    R = max([acc.light.shape[0]] + [acc.strong[a].shape[0] for a in keys])

    def pad(rows: np.ndarray) -> np.ndarray:
        return np.concatenate([rows, np.repeat(rows[-1:], R - rows.shape[0], axis=0)], axis=0)

    P = np.ascontiguousarray(pad(acc.light))
    K1m = max([1] + [acc.strong[a].shape[1] for a in keys])
    Q = np.zeros((len(keys), R, K1m))
    for k, a in enumerate(keys):
        Q[k, :, : acc.strong[a].shape[1]] = pad(acc.strong[a])
    return _Packed(P, Q, np.asarray(keys, dtype=np.int64), np.asarray([acc.strong[a].shape[1] for a in keys],
                                                                      dtype=np.int64))


def _allow(graft_depths: frozenset[int], d: int) -> np.ndarray:
    return np.asarray([t in graft_depths for t in range(d)], dtype=np.bool_)


@dataclass(frozen=True)
class GraftDPSolution:
    """The exact graft DP (module docstring) for budgets ``m <= max_nodes`` and depth limits
    ``d <= max_depth``, strong grafts allowed at the parent depths in ``graft_depths``.

    Attributes:
        acceptance: the value model.  max_nodes / max_depth / max_branching: n, D, B (B bounds a node's
            children of both drafters together).  graft_depths: parent depths where strong children may be
            grafted next to light siblings, under a light parent (0 = the root's children).
        light_under_strong: False (the graft policy's rule): a strong node's children are strong nodes
            (the strong's own vector), at the parent depths in ``strong_path_depths``; True: any children,
            as any node's.
        strong_path_depths: with ``light_under_strong`` False, the parent depths where a strong node may
            have (strong) children (all by default; empty: strong nodes are leaves).
        table: (n+1, D+1) float64, ``table[m, d]`` = best G (tokens per step) with at most m nodes (root
            included) and depth at most d. Row 0 is 0, ``table[1, :] = 1``.
    """

    acceptance: GraftAcceptance
    max_nodes: int
    max_depth: int
    max_branching: int
    graft_depths: frozenset[int]
    table: np.ndarray
    _packed: _Packed = field(repr=False)
    light_under_strong: bool = False
    strong_path_depths: frozenset[int] | None = None

    def _check(self, m: int | None, d: int | None) -> tuple[int, int]:
        m = self.max_nodes if m is None else _check_int("budget", m, 1)
        d = self.max_depth if d is None else _check_int("depth", d, 0)
        if m > self.max_nodes or d > self.max_depth:
            raise SolverError(f"(budget {m}, depth {d}) is outside the solved range (budget <= {self.max_nodes}, "
                              f"depth <= {self.max_depth})")
        return m, d

    def expected_tokens(self, m: int | None = None, d: int | None = None) -> float:
        """Best G (tokens per step) with at most m nodes and depth at most d (defaults: the solved limits)."""
        m, d = self._check(m, d)
        return float(self.table[m, d])

    def tree(self, m: int | None = None, d: int | None = None) -> DrafterTree:
        """The G-optimal :class:`~sequoia_opt.tree.DrafterTree` with at most m nodes and depth at most d
        (canonical order; it may have fewer than m nodes when more add nothing). Its
        :func:`graft_expected_tokens` equals ``table[m, d]`` up to rounding."""
        m, d = self._check(m, d)
        return _reconstruct_tree(self.acceptance.names, self._packed, self.max_nodes, d, self.max_branching,
                                 self.graft_depths, m, self.light_under_strong, self.strong_path_depths)


def _reconstruct_tree(names: tuple[str, ...], pk: _Packed, n: int, d: int, B: int, gd: frozenset[int],
                      m: int, lus: bool, sd: frozenset[int] | None = None) -> DrafterTree:
    """The DP-optimal tree for (m <= n, depth limit d, grafting set gd, light under strong allowed or not),
    tables rebuilt for d."""
    if d == 0:
        return DrafterTree(Tree.chain(1), (0,), names)
    sd = frozenset(range(d)) if sd is None else sd
    allow = _allow(gd, d)
    sallow = _allow(sd, d)  # ignored when lus
    tabs = _graft_tables(pk.P, pk.Q, pk.akeys, pk.K1s, allow, sallow, n, d, B, lus)
    arrays = [np.empty(m, dtype=np.int64) for _ in range(4)]
    cnt = _graft_reconstruct(pk.P, pk.Q, pk.akeys, pk.K1s, allow, B, lus, *tabs, m, *arrays)
    parent, rank, drafter, _ = (x[:cnt] for x in arrays)
    return DrafterTree.from_edges(parent.tolist(), rank.tolist(), drafter.tolist(), names, max_branching=B)


def _check_limits(acc: GraftAcceptance, max_nodes: int, max_depth: int, max_branching: int) -> tuple[int, int, int]:
    if not isinstance(acc, GraftAcceptance):
        raise SolverError(f"acceptance must be a GraftAcceptance, got {type(acc).__name__}")
    n = _check_int("budget", max_nodes, 1)
    D = _check_int("max depth", max_depth, 1)
    B = _check_int("max branching", max_branching, 1)
    pk_rows = 2 + acc.light.shape[1] + sum(a + 1 + q.shape[1] for a, q in acc.strong.items())
    pk_rows += acc.strong[0].shape[1] if 0 in acc.strong else 0  # the strong-rooted chain (Fs, Ls)
    entries = D * pk_rows * n
    if entries > MAX_TABLE_ENTRIES:
        raise SolverError(f"budget {n}, depth {D} and these vectors need {entries:,} table entries (limit "
                          f"{MAX_TABLE_ENTRIES:,}); lower the budget or the depth")
    return n, D, B


def solve_graft_dp(acc: GraftAcceptance, max_nodes: int, max_depth: int, *, max_branching: int = 32,
                   graft_depths: Iterable[int] | None = None, light_under_strong: bool = False,
                   strong_path_depths: Iterable[int] | None = None) -> GraftDPSolution:
    """Solve the graft DP (module docstring) for every budget ``m <= max_nodes`` and depth limit
    ``d <= max_depth``: the exact maximum of :func:`graft_expected_tokens`.

    Args:
        acc: the conditional vectors.  max_nodes: budget n (nodes incl. the root, >= 1).  max_depth: D >= 1.
        max_branching: B >= 1, the most children (of both drafters) a node may have.
        graft_depths: parent depths at which strong children may be grafted next to light siblings, under a
            light parent (0 = the root); None = all, an empty set = light only. They do not limit a strong
            node's own (strong) children.
        light_under_strong: False (default; what the graft policy runs): a strong node's children are strong
            nodes only, the strong's own vector (``acc.strong[0]``; leaves without one). True: a strong node
            may have any children (light ones, grafts), as any node, at the depths in ``graft_depths``.
        strong_path_depths: with ``light_under_strong`` False only: the parent depths at which a strong node
            may have (strong) children; None = all (the default), an empty set = strong nodes are leaves
            (the strong drafter only grafts). :func:`solve_graft` tries both.

    Returns:
        :class:`GraftDPSolution` with ``table`` (n+1, D+1) in tokens per step.

    Raises:
        SolverError: a bad model, budget / depth / branching < 1, a bad graft or strong path depth,
            ``strong_path_depths`` with ``light_under_strong`` True, or tables beyond
            :data:`~sequoia_opt.solver.dp.MAX_TABLE_ENTRIES`.
    """
    n, D, B = _check_limits(acc, max_nodes, max_depth, max_branching)
    gd = _normalize_graft_depths(graft_depths, D)
    lus = _check_bool("light_under_strong", light_under_strong)
    if lus and strong_path_depths is not None:
        raise SolverError("strong_path_depths limits a strong node's strong-only children; with "
                          "light_under_strong=True a strong node's children follow graft_depths like any node's")
    sd = None if lus else _normalize_graft_depths(strong_path_depths, D, "strong path")
    pk = _pack(acc)
    table = np.zeros((n + 1, D + 1))
    table[1:, :] = 1.0
    for d in range(1, D + 1):
        sallow = _allow(frozenset(range(d)) if sd is None else sd, d)
        F = _graft_tables(pk.P, pk.Q, pk.akeys, pk.K1s, _allow(gd, d), sallow, n, d, B, lus)[0]
        table[:, d] = F[0]
    return GraftDPSolution(acc, n, D, B, gd, table, pk, lus, sd)


def _check_bool(what: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SolverError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def optimal_graft_tree(acc: GraftAcceptance, budget: int, max_depth: int, *, max_branching: int = 32,
                       graft_depths: Iterable[int] | None = None, light_under_strong: bool = False,
                       strong_path_depths: Iterable[int] | None = None) -> DrafterTree:
    """The :class:`~sequoia_opt.tree.DrafterTree` maximising G with at most ``budget`` nodes and depth <=
    ``max_depth`` (:func:`solve_graft_dp`; same arguments and errors)."""
    return solve_graft_dp(acc, budget, max_depth, max_branching=max_branching, graft_depths=graft_depths,
                          light_under_strong=light_under_strong, strong_path_depths=strong_path_depths).tree()
