"""The Sequoia dynamic program under a depth-dependent acceptance model: the tree of at most n nodes, depth
<= D, branching <= B that maximises expected tokens per step G when a child's acceptance depends on its rank
*and its depth*.

Why. Sequoia's positional assumption (section 3.1) is that p_k, the chance that a node's k-th candidate is
the accepted one, is the same at every depth. It holds for a draft model on ordinary text; it fails for
drafters whose candidates come in runs, above all prompt lookup: once a suffix matches an earlier passage,
the next tokens continue that passage and are accepted far more often than the first one was. `treeopt
profile acceptance` measures on a rank-0 spine, so its per-depth vector at depth d is the acceptance of the
depth-d children *given that the path reached depth d - 1*, exactly the conditional a tree's path
probability multiplies (for the rank-0 path; other paths are assumed to behave like it). On the demo pair
the lookup drafter's p_1 is 0.18 at depth 1 and 0.67 to 0.92 at depths 2 to 4: the pooled vector
under-predicts a chain's G by a third.

Model. ``P`` is an (R, K) array; row r is the acceptance vector of children at depth r + 1 (row 0: the
root's children), and depths beyond R use the last row. G(tree) = sum over nodes of the product, along the
node's path, of ``P[min(depth - 1, R - 1), rank]`` (root counts 1): :func:`expected_tokens_by_depth`.

Recurrence (this project's extension of Sequoia's DP, Chen et al. 2024, section 3.2, to a rank-and-depth
acceptance model; derived here). With the depth limit D fixed, the value of a subtree depends on the absolute depth a of its
root (which row its children use) and on the levels D - a left below it, so the table is built per D, from
the deepest level up: ``F_D(m, D) = 1`` and, for a < D, ``F_D(m, a) = 1 + g_a(0, m - 1)`` with
``g_a(i, m) = max(0, max_s P[row(a), i] * F_D(s, a + 1) + g_a(i + 1, m - s))``, the same
left-child / right-sibling form as :mod:`~sequoia_opt.solver.dp` (children take a prefix of ranks).
``table[m, D] = F_D(m, 0)``. With a single row it equals the positional DP (a test checks it).

Cost: O(D^2 * B_eff * n^2 / 2) for every depth limit up to D (D times the positional DP): 128 nodes, 10
levels, B = 8 is a few ms. The tables of one depth limit, (D + 1) * (B_eff + 1) * n floats, are rebuilt when
a tree is reconstructed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from numba import njit

from ..errors import SolverError
from ..profiles import validate_acceptance
from ..tree import Tree
from .dp import MAX_TABLE_ENTRIES, _check_int

_TIE_RTOL = 1e-12


@njit(cache=True)
def _depth_tables(P, n, D):  # pragma: no cover - compiled
    """For depth limit D: F (D+1, n+1), F[a, m] = best G of a subtree rooted at absolute depth a with at most m
    nodes; G (D+1, Be+1, n), G[a, i, m] = g_a(i, m) (module docstring). P: (R, Be)."""
    R = P.shape[0]
    Be = P.shape[1]
    F = np.zeros((D + 1, n + 1))
    G = np.zeros((D + 1, Be + 1, n))
    for m in range(1, n + 1):
        F[D, m] = 1.0
    cur = np.zeros(n)
    nxt = np.zeros(n)
    for a in range(D - 1, -1, -1):
        row = a if a < R else R - 1
        # largest useful child subtree: 1 + Be + ... + Be^(D-a-1) nodes, capped at n - 1
        cap = 0
        level = 1
        for _ in range(D - a):
            cap += level
            if cap >= n - 1:
                cap = n - 1
                break
            level *= Be
        if cap > n - 1:
            cap = n - 1
        fchild = F[a + 1]
        for m in range(n):
            nxt[m] = 0.0
        for i in range(Be - 1, -1, -1):
            pi = P[row, i]
            for m in range(n):
                cur[m] = 0.0
            for s in range(1, cap + 1):
                c = pi * fchild[s]
                for m in range(s, n):
                    v = c + nxt[m - s]
                    cur[m] = v if v > cur[m] else cur[m]
            for m in range(n):
                G[a, i, m] = cur[m]
                nxt[m] = cur[m]
        for m in range(1, n + 1):
            F[a, m] = 1.0 + G[a, 0, m - 1]
    return F, G


@njit(cache=True)
def _reconstruct_depth(P, F, G, m, parent, rank, depth):  # pragma: no cover - compiled
    """The optimal tree with at most m nodes for the tables of one depth limit; depth-first order. Returns
    the number of nodes."""
    R = P.shape[0]
    Be = P.shape[1]
    D = F.shape[0] - 1
    stack_node = np.empty(m, dtype=np.int64)
    stack_budget = np.empty(m, dtype=np.int64)
    parent[0] = -1
    rank[0] = 0
    depth[0] = 0
    count = 1
    stack_node[0] = 0
    stack_budget[0] = m
    top = 1
    while top > 0:
        top -= 1
        v = stack_node[top]
        budget = stack_budget[top]
        a = depth[v]
        if a >= D or budget <= 1:
            continue
        row = a if a < R else R - 1
        r = budget - 1
        i = 0
        while i < Be and r > 0:
            target = G[a, i, r]
            tol = 1e-12 * (target if target > 1.0 else 1.0)
            if 0.0 >= target - tol:
                break
            best_s = 0
            for s in range(1, r + 1):
                val = P[row, i] * F[a + 1, s] + G[a, i + 1, r - s]
                if val >= target - tol:
                    best_s = s
                    break
            if best_s == 0:
                best_s = r
            parent[count] = v
            rank[count] = i
            depth[count] = a + 1
            stack_node[top] = count
            stack_budget[top] = best_s
            top += 1
            count += 1
            r -= best_s
            i += 1
    return count


def validate_acceptance_by_depth(acceptance_by_depth) -> np.ndarray:
    """(R, K) float64 from a sequence of per-depth vectors (row r: children at depth r + 1), each a valid
    acceptance vector (:func:`~sequoia_opt.profiles.validate_acceptance`), all of one length.

    Raises:
        SolverError: no rows, rows of different lengths, or a row that is not an acceptance vector.
    """
    rows = [validate_acceptance(r, what=f"acceptance vector of depth {i + 1}")
            for i, r in enumerate(acceptance_by_depth)]
    if not rows:
        raise SolverError("a depth-dependent acceptance model needs at least one per-depth vector")
    if len({r.size for r in rows}) != 1:
        raise SolverError(f"per-depth acceptance vectors must have one length, got {[r.size for r in rows]}")
    return np.ascontiguousarray(np.stack(rows), dtype=np.float64)


def expected_tokens_by_depth(tree: Tree, acceptance_by_depth) -> float:
    """G(tree) (tokens per step) under a depth-dependent acceptance model: the sum over nodes of the product
    of ``P[min(depth - 1, R - 1), rank]`` along each node's path (root counts 1; ranks >= K weigh 0).

    Raises SolverError for a bad ``acceptance_by_depth`` (:func:`validate_acceptance_by_depth`).
    """
    return float(path_probabilities_by_depth(tree, acceptance_by_depth).sum())


def path_probabilities_by_depth(tree: Tree, acceptance_by_depth) -> np.ndarray:
    """(n,) float64: each node's probability of being accepted under the depth-dependent model of
    :func:`expected_tokens_by_depth` (root 1). Raises SolverError for a bad ``acceptance_by_depth``."""
    w = node_weights_by_depth(tree, acceptance_by_depth)
    prob = np.zeros(tree.size)
    prob[0] = 1.0
    for v in range(1, tree.size):  # breadth-first order: a parent comes before its children
        prob[v] = prob[tree.parent[v]] * w[v]
    return prob


def node_weights_by_depth(tree: Tree, acceptance_by_depth) -> np.ndarray:
    """(n,) float64: each node's probability of being accepted once its parent is, under the depth-dependent model
    of :func:`expected_tokens_by_depth` (``P[min(depth - 1, R - 1), rank]``; 0 for a rank >= K; the root 1): the
    factors of :func:`path_probabilities_by_depth`. Raises SolverError for a bad ``acceptance_by_depth``."""
    P = validate_acceptance_by_depth(acceptance_by_depth)
    R, K = P.shape
    rank, depth = np.asarray(tree.rank), np.asarray(tree.depth)
    w = np.where(rank < K, P[np.clip(depth - 1, 0, R - 1), np.minimum(rank, K - 1)], 0.0)
    w[0] = 1.0
    return w


@dataclass(frozen=True)
class DepthDPSolution:
    """The optimal values for budgets ``m <= max_nodes`` and depth limits ``d <= max_depth`` under a
    depth-dependent acceptance model, with reconstruction; the interface of
    :class:`~sequoia_opt.solver.dp.DPSolution` that :func:`~sequoia_opt.solver.choose` uses (pass it as
    ``solution=``).

    Attributes:
        acceptance_by_depth: (R, K) the validated per-depth vectors.
        max_nodes / max_depth / max_branching: the limits n, D, B.
        table: (n+1, D+1) float64, ``table[m, d]`` = best G (tokens per step) with at most m nodes and depth
            at most d.
    """

    acceptance_by_depth: np.ndarray
    max_nodes: int
    max_depth: int
    max_branching: int
    table: np.ndarray
    _P: np.ndarray = field(repr=False)  # (R, B_eff)

    def _check(self, m: int | None, d: int | None) -> tuple[int, int]:
        m = self.max_nodes if m is None else _check_int("budget", m, 1)
        d = self.max_depth if d is None else _check_int("depth", d, 0)
        if m > self.max_nodes or d > self.max_depth:
            raise SolverError(f"(budget {m}, depth {d}) is outside the solved range (budget <= {self.max_nodes}, "
                              f"depth <= {self.max_depth})")
        return m, d

    def expected_tokens(self, m: int | None = None, d: int | None = None) -> float:
        """Best G (tokens per step) with at most m nodes and depth at most d. Raises SolverError outside the
        solved range."""
        m, d = self._check(m, d)
        return float(self.table[m, d])

    def _edges(self, m: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._P.shape[1] == 0 or d == 0:
            zero = np.zeros(1, dtype=np.int64)
            return zero - 1, zero, zero
        F, G = _depth_tables(self._P, self.max_nodes, d)
        parent, rank, depth = (np.empty(m, dtype=np.int64) for _ in range(3))
        cnt = _reconstruct_depth(self._P, F, G, m, parent, rank, depth)
        return parent[:cnt], rank[:cnt], depth[:cnt]

    def tree(self, m: int | None = None, d: int | None = None) -> Tree:
        """The optimal tree with at most m nodes and depth at most d (its :func:`expected_tokens_by_depth`
        equals ``table[m, d]``). Raises SolverError outside the solved range."""
        m, d = self._check(m, d)
        parent, rank, _ = self._edges(m, d)
        return Tree.from_edges(parent.tolist(), rank.tolist(), max_branching=self.max_branching)

    def level_widths_many(self, budgets, depths) -> np.ndarray:
        """Level widths of the optimal trees for many (budget, depth) pairs: ``(len(budgets), max(depths)+1)``
        int64 (the tables are built once per distinct depth).

        Raises:
            SolverError: unequal or empty sequences; a pair outside the solved range.
        """
        ms = np.asarray(budgets, dtype=np.int64)
        ds = np.asarray(depths, dtype=np.int64)
        if ms.shape != ds.shape or ms.ndim != 1 or ms.size == 0:
            raise SolverError("budgets and depths must be equal-length, non-empty 1-D sequences")
        for m, d in zip(ms.tolist(), ds.tolist()):
            self._check(m, d)
        out = np.zeros((ms.size, int(ds.max()) + 1), dtype=np.int64)
        out[:, 0] = 1
        if self._P.shape[1] == 0:
            return out
        mmax = int(ms.max())
        parent, rank, depth = (np.empty(mmax, dtype=np.int64) for _ in range(3))
        for d in sorted(set(ds.tolist())):
            if d == 0:
                continue
            F, G = _depth_tables(self._P, self.max_nodes, d)
            for j in np.nonzero(ds == d)[0]:
                cnt = _reconstruct_depth(self._P, F, G, int(ms[j]), parent, rank, depth)
                out[j] = 0
                np.add.at(out[j], depth[:cnt], 1)
        return out


def solve_dp_by_depth(acceptance_by_depth: Sequence[Sequence[float]], max_nodes: int, max_depth: int,
                      max_branching: int = 32) -> DepthDPSolution:
    """Solve the depth-dependent DP (module docstring) for every budget ``m <= max_nodes`` and depth limit
    ``d <= max_depth``.

    Args:
        acceptance_by_depth: (R, K) per-depth acceptance vectors, row r for children at depth r + 1 (deeper
            levels use the last row), e.g. an acceptance profile's ``acceptance_by_depth``.
        max_nodes: budget n (nodes incl. the root, >= 1). max_depth: D >= 1. max_branching: B >= 1.

    Returns:
        :class:`DepthDPSolution`, ``table`` (n+1, D+1) in tokens per step.

    Raises:
        SolverError: bad vectors, budget / depth / branching < 1, or tables beyond
            :data:`~sequoia_opt.solver.dp.MAX_TABLE_ENTRIES`.
    """
    P = validate_acceptance_by_depth(acceptance_by_depth)
    n = _check_int("budget", max_nodes, 1)
    D = _check_int("max depth", max_depth, 1)
    B = _check_int("max branching", max_branching, 1)
    P = P[:, :B]
    pos = np.nonzero((P > 0.0).any(axis=0))[0]
    P_eff = np.ascontiguousarray(P[:, : (int(pos[-1]) + 1 if pos.size else 0)])
    entries = (D + 1) * (P_eff.shape[1] + 1) * n
    if entries > MAX_TABLE_ENTRIES:
        raise SolverError(f"budget {n}, depth {D}, branching {P_eff.shape[1]} needs {entries:,} table entries "
                          f"(limit {MAX_TABLE_ENTRIES:,}); lower --budget or --max-depth")
    table = np.zeros((n + 1, D + 1))
    table[1:, :] = 1.0
    if P_eff.shape[1] > 0:
        for d in range(1, D + 1):
            F, _ = _depth_tables(P_eff, n, d)
            table[:, d] = F[0]
    return DepthDPSolution(validate_acceptance_by_depth(acceptance_by_depth), n, D, B, table, P_eff)


#: ``treeopt solve --acceptance-model`` values.
ACCEPTANCE_MODELS = ("auto", "positional", "by-depth")


def check_acceptance_model(name: str, models: tuple[str, ...] = ACCEPTANCE_MODELS) -> str:
    """``name`` when it is one of ``models`` (the ``--acceptance-model`` values a command takes). Raises
    SolverError (one line) otherwise."""
    if name not in models:
        raise SolverError(f"unknown --acceptance-model {name!r}; use {' | '.join(models)}")
    return name


@dataclass(frozen=True)
class ValueModel:
    """How a table scores every static tree it shows: G (expected tokens per step) under Sequoia's positional
    vector (Sequoia, section 3.1) or under the profile's per-depth vectors (:func:`expected_tokens_by_depth`).
    A table builds every predicted figure with one ValueModel and names it in its title (:attr:`label`), so
    one tree has one score wherever it appears.

    Attributes:
        name: ``"positional"`` or ``"by-depth"``.
        acceptance: (K,) the pooled positional vector.
        rows: (R, K) the per-depth vectors (row r: children at depth r + 1) for ``by-depth``, else None.
        profile_id: the acceptance profile's id (for the label), or None.
    """

    name: str
    acceptance: np.ndarray
    rows: np.ndarray | None = None
    profile_id: str | None = None

    @classmethod
    def of_profile(cls, profile, model: str = "auto") -> "ValueModel":
        """The value model ``treeopt solve --acceptance-model model`` solves a profile with
        (:func:`resolve_acceptance_model`). Raises SolverError as that function."""
        used = resolve_acceptance_model(profile, model)
        return cls(used, validate_acceptance(profile.acceptance),
                   profile.depth_rows() if used == "by-depth" else None, profile.id)

    def expected_tokens(self, tree: Tree) -> float:
        """G(tree), tokens per step, under this model."""
        if self.rows is not None:
            return expected_tokens_by_depth(tree, self.rows)
        return tree.expected_tokens(self.acceptance)

    def path_probabilities(self, tree: Tree) -> np.ndarray:
        """(n,) each node's probability of being accepted under this model (root 1; they sum to G)."""
        if self.rows is not None:
            return path_probabilities_by_depth(tree, self.rows)
        return tree.path_probabilities(self.acceptance)

    def node_rates(self, tree: Tree) -> list[float]:
        """Per non-root node in index order, the probability this model gives it of being accepted once its parent
        is (positional: ``p`` of its rank; by depth: ``P[min(depth - 1, R - 1), rank]``; 0 past the vector), rounded
        to 6 digits: what ``treeopt run`` compares each node's measured rate with
        (:class:`~sequoia_opt.decoding.stats.NodeAcceptance`)."""
        w = node_weights_by_depth(tree, self.rows) if self.rows is not None else tree.node_weights(self.acceptance)
        return [round(float(q), 6) for q in w[1:]]

    def run_checks(self, tree: Tree) -> dict[str, Any]:
        """What a tree file records for ``treeopt run`` to predict and check the tree with under this model:
        ``end_overshoot_tokens`` (:meth:`end_overshoot_tokens`) and ``node_rates`` (:meth:`node_rates`); the cost
        side (``depth_step_ms``) is :func:`~sequoia_opt.solver.hardware.run_costs`'."""
        return {"end_overshoot_tokens": self.end_overshoot_tokens(tree), "node_rates": self.node_rates(tree)}

    def end_overshoot_tokens(self, tree: Tree) -> float:
        """Tokens the last step of a generation emits past its end, on average
        (:func:`~sequoia_opt.solver.generation.end_overshoot_tokens`): what a finite generation costs the tree
        beyond its steady-state speedup."""
        from .generation import end_overshoot_tokens

        return end_overshoot_tokens(tree.depth, self.path_probabilities(tree))

    def answer_length_factor(self, tree: Tree, new_tokens: int, depth_costs: Sequence[float] | None = None) -> float:
        """The factor on the tree's steady-state rate over answers of ``new_tokens`` tokens under this model
        (:func:`~sequoia_opt.solver.generation.answer_length_factor`: the exact expected steps, the last one
        truncated; with ``depth_costs``, (D + 1,) a step's cost with the tree cut to each depth, each step at its
        cost). Raises ValueError for ``new_tokens`` < 1 or bad ``depth_costs``."""
        from .generation import answer_length_factor

        return answer_length_factor(tree.depth, self.path_probabilities(tree), new_tokens, depth_costs)

    @property
    def label(self) -> str:
        """E.g. ``"by-depth acceptance of profile 'x'"``: what a table's title says its predictions use."""
        return f"{self.name} acceptance" + (f" of profile {self.profile_id!r}" if self.profile_id else "")


def resolve_acceptance_model(profile, model: str = "auto") -> str:
    """``"positional"`` or ``"by-depth"`` for an :class:`~sequoia_opt.profiles.AcceptanceProfile`: ``auto``
    takes ``by-depth`` when the profile measured two depths or more and its positional check failed
    (``positional_consistent`` False), else ``positional``. ``by-depth`` asked of a profile without per-depth
    vectors is refused.

    Raises:
        SolverError: an unknown model, or ``by-depth`` without per-depth vectors.
    """
    if model not in ACCEPTANCE_MODELS:
        raise SolverError(f"unknown acceptance model {model!r}; use one of {', '.join(ACCEPTANCE_MODELS)}")
    if model == "by-depth" and len(profile.by_depth) < 1:
        raise SolverError(f"acceptance profile {profile.id!r} has no per-depth vectors (acceptance_by_depth): "
                          "it can only be solved with the positional model")
    if model == "auto":
        return "by-depth" if (len(profile.by_depth) >= 2 and profile.positional_consistent is False) else "positional"
    return model


def solve_profile(profile, max_nodes: int, max_depth: int, max_branching: int = 32, model: str = "auto"):
    """Solve the DP for an acceptance profile under ``model`` (:func:`resolve_acceptance_model`). Returns
    ``(solution, model_used)``: a :class:`~sequoia_opt.solver.dp.DPSolution` (positional) or a
    :class:`DepthDPSolution` (``profile.depth_rows()``), either of which :func:`~sequoia_opt.solver.choose`
    takes as ``solution=``.

    Raises:
        SolverError: as :func:`resolve_acceptance_model`, :func:`~sequoia_opt.solver.solve_dp`,
            :func:`solve_dp_by_depth`.
    """
    from .dp import solve_dp

    used = resolve_acceptance_model(profile, model)
    if used == "by-depth":
        return solve_dp_by_depth(profile.depth_rows(), max_nodes, max_depth, max_branching), used
    return solve_dp(profile.acceptance, max_nodes, max_depth, max_branching), used
