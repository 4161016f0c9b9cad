"""Plain-Python reference for the Sequoia DP (no numba, no numpy in the loops).

Same recurrence as :mod:`sequoia_opt.solver.dp` (Sequoia, Chen et al. 2024, section 3.2), written in the
direct "max over the child's size" form and over **all** B ranks (ranks >= K have weight 0), without the
compiled solver's shortcuts (dropping trailing zero ranks, capping child sizes by depth). Used as the
cross-check in tests and the speed baseline in ``benchmarks/bench_solver.py``.
"""

from __future__ import annotations

from typing import Sequence

from ..profiles import validate_acceptance


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
