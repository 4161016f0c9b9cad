"""Baseline tree shapes, for comparison with the Sequoia DP under the same acceptance vector and cost model.

- :func:`chain`: one sequence of gamma speculated tokens (classic speculative decoding, Leviathan et al.
  2023); under a constant acceptance alpha = p_1 its G is (1 - alpha^(gamma+1)) / (1 - alpha).
- :func:`kary_tree`: the full k-ary tree of a given depth, optionally truncated (breadth-first) to a budget.
- :func:`specinfer`: SpecInfer-style k independent sequences of length L sharing only the root
  (rank i child of the root, then a rank-0 chain of L - 1 nodes below it).
- :func:`best_first`: Medusa-style greedy expansion that repeatedly adds the frontier node with the highest
  path probability; exact (equal to the DP) whenever p is non-increasing, with or without a depth limit
  (Sequoia section 3.2 discusses why it is not exact otherwise).

Every function returns a :class:`~sequoia_opt.tree.Tree` and raises :class:`~sequoia_opt.errors.SolverError`
on impossible arguments.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from ..errors import SolverError
from ..profiles import validate_acceptance
from ..tree import Tree


def _positive(name: str, value: int, low: int = 1) -> int:
    """``value`` as an int (numpy integers too, as solve_dp and choose take them). Raises SolverError when it is
    not an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise SolverError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def chain(gamma: int) -> Tree:
    """A chain of ``gamma`` speculated tokens below the root (gamma + 1 nodes, depth gamma, all rank 0): the
    draft of classic speculative decoding (Leviathan et al. 2023; Chen et al. 2023). Raises SolverError for a
    ``gamma`` that is not an integer >= 0."""
    gamma = _positive("gamma", gamma, 0)
    return Tree.chain(gamma + 1)


def kary_tree(k: int, depth: int, budget: int | None = None) -> Tree:
    """The full k-ary tree of the given depth: ``1 + k + .. + k^depth`` nodes, or its first ``budget`` nodes
    in breadth-first order (a valid tree: a prefix of canonical order never leaves a rank gap). Raises
    SolverError for ``k`` or ``budget`` not an integer >= 1, or ``depth`` not an integer >= 0."""
    k = _positive("k", k)
    depth = _positive("depth", depth, 0)
    if budget is not None:
        budget = _positive("budget", budget)
    parent, rank = [-1], [0]
    level = [0]
    for _ in range(depth):
        nxt = []
        for v in level:
            for r in range(k):
                if budget is not None and len(parent) >= budget:
                    break
                nxt.append(len(parent))
                parent.append(v)
                rank.append(r)
        level = nxt
        if budget is not None and len(parent) >= budget:
            break
    return Tree(parent=parent, rank=rank)


def specinfer(k: int, length: int) -> Tree:
    """SpecInfer-style (Miao et al. 2024): k independent sequences of ``length`` tokens sharing only the root.

    Root children take ranks 0..k-1; below each, a rank-0 chain of ``length - 1`` nodes. Size ``1 + k*length``.
    Raises SolverError for ``k`` or ``length`` not an integer >= 1.
    """
    k = _positive("k", k)
    length = _positive("length", length)
    parent, rank = [-1], [0]
    for r in range(k):
        parent.append(0)
        rank.append(r)
        for _ in range(length - 1):
            parent.append(len(parent) - 1)
            rank.append(0)
    return Tree.from_edges(parent, rank)


def best_first(
    acceptance: Sequence[float],
    budget: int,
    max_depth: int | None = None,
    max_branching: int | None = None,
    by_depth=None,
) -> Tree:
    """Greedy best-first expansion (Medusa-style, Cai et al. 2024): start from the root, repeatedly add the frontier node with
    the highest path probability until ``budget`` nodes (root included) or no frontier node has a positive
    probability (nodes that add nothing are not added).

    The frontier holds, for each node, its next child rank (ranks stay a prefix: no gap), within
    ``max_depth`` and ``max_branching``. Ties go to the node added first. Exact for non-increasing p.
    ``by_depth``: (R, K) per-depth vectors (row r: children at depth r + 1, deeper levels the last row) to
    take path probabilities from instead of ``acceptance`` (:class:`~sequoia_opt.solver.depth.ValueModel`).
    """
    p = validate_acceptance(acceptance)
    rows = None
    if by_depth is not None:
        from .depth import validate_acceptance_by_depth

        rows = validate_acceptance_by_depth(by_depth)
        p = rows[0]
    budget = _positive("budget", budget)
    if max_depth is not None:
        max_depth = _positive("max depth", max_depth)
    if max_branching is not None:
        max_branching = _positive("max branching", max_branching)
    K = p.size if max_branching is None else min(p.size, max_branching)
    parent, rank, prob, depth = [-1], [0], [1.0], [0]
    heap: list[tuple[float, int, int, int]] = []  # (-probability, tie-break, parent node, rank)
    counter = 0

    def offer(v: int, r: int) -> None:
        nonlocal counter
        if r >= K or (max_depth is not None and depth[v] >= max_depth):
            return
        q = prob[v] * float(p[r] if rows is None else rows[min(depth[v], len(rows) - 1), r])
        if q > 0.0:
            heapq.heappush(heap, (-q, counter, v, r))
            counter += 1

    offer(0, 0)
    while len(parent) < budget and heap:
        negq, _, v, r = heapq.heappop(heap)
        parent.append(v)
        rank.append(r)
        prob.append(-negq)
        depth.append(depth[v] + 1)
        offer(v, r + 1)
        offer(len(parent) - 1, 0)
    return Tree.from_edges(parent, rank)
