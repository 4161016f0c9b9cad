"""The solvers' oracles: written the direct way, slow, for tests and benchmarks.

* :func:`reference_table` — the Sequoia DP in plain Python (no numba, no numpy in the loops): the same
  recurrence as :mod:`sequoia_opt.solver.dp` (Sequoia, Chen et al. 2024, section 3.2) in the direct "max over
  the child's size" form and over **all** B ranks (ranks >= K have weight 0), without the compiled solver's
  shortcuts (dropping trailing zero ranks, capping child sizes by depth). The cross-check in tests and the
  speed baseline in ``benchmarks/bench_solver.py``.
* :func:`brute_force_graft` — every grafted tree of a small budget enumerated and scored, the oracle of
  :func:`~sequoia_opt.solver.graft.solve_graft`.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Sequence

from ..errors import ProfileError, SolverError
from ..profiles import LatencyCurve, validate_acceptance
from ..tree import DrafterTree
from .graft import _check_curves, graft_step_cost
from .graft_dp import _check_bool, _check_limits
from .graft_value import GraftAcceptance, graft_expected_tokens
from .hardware import StepCost


def reference_table(acceptance: Sequence[float], max_nodes: int, max_depth: int, max_branching: int) -> list[list[float]]:
    """``table[m][d]`` = best expected tokens per step with at most m nodes and depth at most d.

    Shape ``(max_nodes + 1) x (max_depth + 1)`` as nested lists; row 0 is 0. O(D * B * n^2 / 2) Python steps.
    Raises SolverError on a bad acceptance vector.
    """
    p_arr = validate_acceptance(acceptance)
    n, D, B = int(max_nodes), int(max_depth), int(max_branching)
    p = [float(p_arr[i]) if i < len(p_arr) else 0.0 for i in range(B)]
    # f[d][m]: best value of a subtree with at most m nodes and depth limit d below its root
    f = [[0.0] + [1.0] * n]
    for d in range(1, D + 1):
        fprev = f[d - 1]
        g_next = [0.0] * n  # g(B, m) = 0 for m = 0..n-1
        for i in range(B - 1, -1, -1):
            g_cur = [0.0] * n
            for m in range(1, n):
                best = 0.0  # no child of rank i
                for s in range(1, m + 1):
                    v = p[i] * fprev[s] + g_next[m - s]
                    if v > best:
                        best = v
                g_cur[m] = best
            g_next = g_cur
        f.append([0.0] + [1.0 + g_next[m - 1] for m in range(1, n + 1)])
    return [[f[d][m] for d in range(D + 1)] for m in range(n + 1)]


# ---------------------------------------------------------------------------------------------- brute force
@dataclass(frozen=True)
class BruteForceGraft:
    """Every valid grafted tree up to a budget, scored (:func:`brute_force_graft`).

    Attributes:
        best: the tree with the highest tokens/s (None without curves, or when none could be scored), its
            StepCost in ``best_cost``.
        best_g_by_size: size -> (best G, a tree achieving it), exact sizes 1..budget.
        count: how many trees were enumerated.
    """

    best: DrafterTree | None
    best_cost: StepCost | None
    best_g_by_size: dict[int, tuple[float, DrafterTree]]
    count: int


def _patterns(acc: GraftAcceptance, B: int) -> list[tuple[int, ...]]:
    """The allowed label sequences of a node's children (module docstring), non-empty: light ranks, or light
    ranks then strong conditional ranks."""
    out = [(0,) * c for c in range(1, min(acc.light.shape[1], B) + 1)]
    for a in acc.keys:
        for b in range(1, min(acc.strong[a].shape[1], B - a) + 1):
            out.append((0,) * a + (1,) * b)
    return out


def _strong_patterns(acc: GraftAcceptance, B: int) -> list[tuple[int, ...]]:
    """The allowed label sequences of a strong node's children when no light node may lie under a strong one:
    the strong's own ranks (none without an a = 0 vector)."""
    if 0 not in acc.strong:
        return []
    return [(1,) * b for b in range(1, min(acc.strong[0].shape[1], B) + 1)]


def brute_force_graft(acc: GraftAcceptance, target_curve: LatencyCurve | None,
                      draft_curves: Sequence[LatencyCurve] | None, budget: int, max_depth: int,
                      max_branching: int = 32, *, light_under_strong: bool = False) -> BruteForceGraft:
    """Enumerate every valid two-drafter tree (strong grafts allowed at every depth; with
    ``light_under_strong`` False, the default, a strong node's children are the strong's own ranks only, as
    in :func:`solve_graft_dp`) with at most ``budget`` nodes, depth <= ``max_depth``, at most
    ``max_branching`` children per node, score each with :func:`graft_expected_tokens` and (with curves)
    :func:`graft_step_cost`; trees whose draft forwards lie outside a curve's measured range are not scored by
    tokens/s. For tests: refused above 7 nodes.

    Raises:
        SolverError: a budget above 7 (the count grows exponentially), bad limits.
    """
    n, D, B = _check_limits(acc, budget, max_depth, max_branching)
    if n > 7:
        raise SolverError(f"brute force enumerates every tree; budget {n} is too large (at most 7)")
    lus = _check_bool("light_under_strong", light_under_strong)
    pats = (_patterns(acc, B), _patterns(acc, B) if lus else _strong_patterns(acc, B))

    @functools.lru_cache(maxsize=None)
    def gen(t: int, s: int, label: int) -> tuple:
        """All subtrees rooted at depth t at a node of drafter ``label`` with exactly s nodes: tuples of
        (label, subtree) children."""
        if s == 1:
            return ((),)
        if t >= D:
            return ()
        out = []
        for pat in pats[label]:
            c = len(pat)
            if c > s - 1:
                continue
            for cut in itertools.combinations(range(1, s - 1), c - 1):  # compositions of s - 1 into c parts
                parts = [b - a for a, b in zip((0,) + cut, cut + (s - 1,))]
                for kids in itertools.product(*(gen(t + 1, x, k) for x, k in zip(parts, pat))):
                    out.append(tuple(zip(pat, kids)))
        return tuple(out)

    def build(sub: tuple) -> DrafterTree:
        parent, rank, drafter = [-1], [0], [0]

        def walk(node: tuple, me: int) -> None:
            for i, (label, kid) in enumerate(node):
                j = len(parent)
                parent.append(me)
                rank.append(i)
                drafter.append(label)
                walk(kid, j)

        walk(sub, 0)
        return DrafterTree.from_edges(parent, rank, drafter, acc.names)

    best, best_cost, by_size, count = None, None, {}, 0
    curves = None if draft_curves is None else _check_curves(draft_curves, 2)
    for s in range(1, n + 1):
        for sub in gen(0, s, 0):
            count += 1
            dt = build(sub)
            g = graft_expected_tokens(dt, acc)
            if s not in by_size or g > by_size[s][0]:
                by_size[s] = (g, dt)
            if target_curve is None or curves is None:
                continue
            try:
                c = graft_step_cost(dt, target_curve, curves, expected_tokens=g)
            except ProfileError:
                continue
            if best_cost is None or c.tokens_per_s > best_cost.tokens_per_s:
                best, best_cost = dt, c
    return BruteForceGraft(best, best_cost, by_size, count)
