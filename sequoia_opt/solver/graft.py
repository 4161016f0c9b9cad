"""Multi-drafter ("grafted") trees: a light drafter and a strong drafter grow one draft tree (issue 16;
TreeGraft 2026). Value model, cost model, an exact DP for the expected tokens per step, the hardware-aware
choice, baselines and a brute force for tests.

Tree. A :class:`~sequoia_opt.tree.DrafterTree` with two drafters: 0 = light (prompt lookup, a small draft
model), 1 = strong (a bigger draft model). At the root and at each light node the children are either

(i)  light ranks ``0..c-1`` (any ``c <= K0``), or
(ii) light ranks ``0..a-1`` and then the strong drafter's *conditional* ranks ``0..b-1`` (``b >= 1``): its
     candidates among the tokens the light did not already propose there, for an ``a`` the acceptance model
     has a strong vector for (``a = 0``: the strong drafter alone).

At a strong node, by default (``light_under_strong=False``), the children are

(iii) the strong drafter's ranks ``0..b-1`` only, scored by its own vector ``strong[0]`` (no light sibling, so
      its conditional ranks are its plain ranks); without an ``a = 0`` vector strong nodes are leaves.

Why: the run-time graft policy (:mod:`~sequoia_opt.decoding.policies.graft`) runs the light drafter first,
over the plan's light-only subtree (the nodes whose root path holds light nodes only), and then lets the
strong drafter graft level by level; a grafted branch is the strong drafter's own recovered path, and
:func:`~sequoia_opt.decoding.policies.graft.check_graft_plan` refuses a light node under a strong one (the
light drafter would have to run again after the strong). With ``light_under_strong=True`` a strong node's
children follow (i) / (ii) like any node's: a larger search space (its G is at least the default's) for
analysis, not a plan the policy runs. :attr:`~sequoia_opt.tree.DrafterTree.light_under_strong` tells the two
kinds of trees apart; :func:`graft_expected_tokens` scores both.

Value model ("conditional vectors", :class:`GraftAcceptance`). ``light`` is an (R0, K0) array, row r = the
light's positional acceptance vector of children at depth r + 1 (deeper levels use the last row; the
convention of :mod:`~sequoia_opt.solver.depth`). ``strong[a]`` is an (R1, K1) array: entry (r, j) = the
probability that the strong's j-th conditional candidate is the accepted child at depth r + 1 of a node where
the light proposed exactly ``a`` children. Like Sequoia's positional vector (section 3.1) these are
unconditional on the rank: at a node with ``a`` light children, ``sum(light[r, :a]) + sum(strong[a][r])``
is the chance that any child is accepted, so it is at most 1. The expected tokens per step::

    G(tree) = sum over nodes v of prod over the non-root nodes u on the root->v path of w(u)
    w(u) = light[row(u), rank(u)]                         u a light node
         = strong[a(u)][row(u), drafter_rank(u)]          u a strong node with a(u) light siblings
    row(u) = min(depth(u) - 1, R - 1)                     (the root counts 1)

Cost model (Sequoia section 4.2's split into draft and verification time, one cost model per drafter as in
:mod:`~sequoia_opt.solver.hardware`)::

    target_ms = T(n), overhead_ms = step_overhead_ms                   (target_curve)
    draft_ms  = sum_k draft_k
    per-level drafter k: draft_k = sum over levels j with W_k(j) > 0 of c_k(W_k(j))
        W_k(j) = nodes at depth j that drafter k runs a forward over: the ancestors-or-self of the nodes
                 it expands (DrafterTree.processed_level_widths(k)); level 0 is the root, c_k(1)
    one-pass drafter k:  draft_k = c_k(N_k), N_k = non-root nodes labelled k (none when N_k = 0)
    cost_ms = draft_ms + target_ms + overhead_ms;  tokens_per_s = 1000 * G / cost_ms
    speedup = tokens_per_s over plain decoding's 1000 / (T(1) + step_overhead_ms)

For one drafter this charges a per-level drafter for the nodes that have children only, while
:func:`~sequoia_opt.solver.hardware.step_cost` charges every level but the last in full (the present decoder
feeds whole levels): the two agree when no level but the last holds a leaf. Everything in this module (the
graft DP's candidates, the baselines, the brute force) is scored with :func:`graft_step_cost`, so its rows are
comparable with one another. Curves are never extrapolated (ProfileError, as
:func:`~sequoia_opt.solver.hardware.step_cost`).

DP (exact for G). With the depth limit D fixed, the best value of a subtree depends only on the absolute
depth t of its root, the drafter of its root and its node budget, so, as in :mod:`~sequoia_opt.solver.depth`,
tables are built from the deepest level up in left-child / right-sibling form (Sequoia sections 3.2 / 4.1).
For a parent at depth t (row = min(t, R - 1)), ``F(t, m)`` = best G of a subtree rooted at a light node (or
the root) with at most m nodes, ``Fs(t, m)`` = the same rooted at a strong node, ``F(D, m) = Fs(D, m) = 1``::

    L(i, m)    = max(0, max_s light[row, i] * F(t+1, s) + L(i+1, m-s))          light ranks i.. (may stop)
    S_a(j, m)  = max(0, max_s strong[a][row, j] * Fs(t+1, s) + S_a(j+1, m-s))   strong ranks j >= 1 (may stop)
    H_a(a, m)  = max_{s>=1} strong[a][row, 0] * Fs(t+1, s) + S_a(1, m-s)       strong rank 0 (mandatory)
    H_a(i, m)  = max_{s>=1} light[row, i] * F(t+1, s) + H_a(i+1, m-s)         light ranks i < a (mandatory)
    F(t, m)    = 1 + max(L(0, m-1), max over allowed a of H_a(0, m-1))
    Ls(j, m)   = max(0, max_s strong[0][row, j] * Fs(t+1, s) + Ls(j+1, m-s))   a strong node's ranks (may stop)
    Fs(t, m)   = 1 + Ls(0, m-1)                       (Ls = 0, strong leaves, without an a = 0 vector)

(``-inf`` where the mandatory children do not fit). With ``light_under_strong=True``, ``Fs = F`` (a strong
node's children are (i) / (ii) like any node's; the pre-rule DP). Option (ii) is allowed only at parent
depths in ``graft_depths`` and only while ``a + b <= max_branching``. ``graft_depths`` limits where the strong
drafter grafts next to light siblings (under light parents), not a strong node's own children: below a strong
node its recovered path goes on wherever the depth limit allows (at run time the strong drafter proposes
those children from its forwards over its own path), limited only by the optional ``strong_path_depths`` (the parent depths where Ls may
be non-zero; :func:`solve_graft` tries all and none). Every tree the DP builds satisfies the rules of
:func:`graft_expected_tokens` (and, by default, the policy's) and every such tree is in its search space, so
the table is the exact maximum of G (tests check it against :func:`brute_force_graft` under both settings for
every budget <= 7 and depth <= 4). Cost per depth limit d: O(d * (K0 + K1 + sum_a (a + K1)) * n^2 / 2)
multiply-add-max steps, compiled with numba.

Hardware-aware choice (an approximation, :func:`solve_graft`). The step cost depends on the per-drafter
processed level widths, not on G alone, so tokens per second are not maximised exactly: the DP-optimal tree
is scored for every budget m on :func:`~sequoia_opt.solver.hardware.budget_grid`, every depth limit d = 1..D
and every plan of a small family, and the best by tokens/s is kept. The plans: a grafting set (the parent
depths where strong children may be grafted) among none (light only), the prefixes {0}, {0, 1}, .., all
depths, each single depth and each suffix {j..D-1}; and "strong only" (the DP over the strong's own vector).
By default each plan is tried twice: the strong's recovered paths allowed at every depth, and strong nodes as
leaves (``strong_path_depths`` all / none). A tree that gives up some G for a cheaper step outside that
family is missed. Measured against :func:`brute_force_graft` (every valid tree under the same rule) on 1000
random cases (tests/test_graft_solver.py's generator, seeds 0..999: K0, K1 <= 3, one or two depth rows,
random strong keys, synthetic curves with random slopes, the strong per-level or one-pass; budgets 4..7,
depth 2..4, branching 2..4), the ratio solve_graft / brute-force best tokens/s:

- the default (no light node under a strong one): worst 0.9839 (seed 927), then 0.9858 (seed 54), mean
  0.99994, 992 of 1000 exact, no chosen tree with a light node under a strong one. Without the strong-leaves
  variant the worst was 0.9754 (seed 555: the G-optimal trees extend the strong's path one level deeper,
  which costs a second strong forward; the best tree stops it at the graft) and the mean 0.99989;
- ``light_under_strong=True``: worst 0.9839 (seed 927), then 0.9864 (seed 378), mean 0.99992, 990 of 1000
  exact (92 chosen trees have a light node under a strong one). With the prefixes and single depths only
  (no suffixes, no strong-only plan) the worst was 0.9712 and the mean 0.99982.

On equal G the reconstruction puts nodes under fewer parents (fewer nodes to draft); with the opposite tie
rule (the smallest child subtree first, as solver/dp.py) the worst was 0.9622 (light under strong allowed).
The test asserts >= 0.98 on 17 of these cases, the worst two of each setting and seed 555 included.

Baselines (:func:`graft_baselines`): each drafter alone with its own best tree
(:func:`~sequoia_opt.solver.hardware.choose`), and the SpecInfer merge (Miao et al. 2024, section 4: the
token trees of several speculators merged by shared prefixes) of those two trees (:func:`merge_trees`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from numba import njit

from ..errors import ProfileError, SolverError
from ..profiles import SUM_TOLERANCE, LatencyCurve, check_cost_model, validate_acceptance
from ..tree import DrafterTree, Tree
from .depth import solve_dp_by_depth
from .dp import MAX_TABLE_ENTRIES, _check_int
from .hardware import StepCost, _check_budget_measured, budget_grid, choose, cost_of_step, plain_ms_per_token

#: Value of an impossible option (mandatory children that do not fit the budget).
_NEG = -1e300

#: Default drafter names of a :class:`GraftAcceptance` (light first).
DEFAULT_NAMES = ("light", "strong")


# ---------------------------------------------------------------------------------------------- value model
def _rows(value: Any, what: str) -> np.ndarray:
    """(R, K) float64 from one vector (one row) or a list of per-depth vectors, each a valid acceptance
    vector (:func:`~sequoia_opt.profiles.validate_acceptance`). Raises SolverError."""
    if isinstance(value, (str, bytes, dict)):
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors, got {type(value).__name__}")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors of one length") from None
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise SolverError(f"{what} must be a vector or a list of per-depth vectors, got shape {arr.shape}")
    rows = [validate_acceptance(r, what=f"{what}, row {i} (children at depth {i + 1})") for i, r in enumerate(arr)]
    return np.ascontiguousarray(np.stack(rows), dtype=np.float64)


@dataclass(frozen=True, eq=False)
class GraftAcceptance:
    """The value model of a two-drafter grafted tree (module docstring).

    Attributes:
        light: (R0, K0) float64; row r = the light drafter's positional acceptance vector of children at
            depth r + 1 (deeper levels use the last row). A 1-D vector is one row.
        strong: a -> (R1, K1) float64: the strong drafter's acceptance vector of its conditional ranks at a
            node where the light proposed exactly ``a`` children (``a = 0``: the strong drafter alone, its
            own vector). Only the keys present are allowed plans; may be empty (light only).
        names: the two drafters' names, light first (tree labels and reports).

    Raises:
        SolverError: a row that is not an acceptance vector (empty, NaN, negative, sum > 1 +
            :data:`~sequoia_opt.profiles.SUM_TOLERANCE`), rows of different lengths, a key that is not an
            integer in ``0..K0`` (the light proposes at most K0 ranked children), or a key a for which the
            light's first a entries plus the strong row sum above 1 + the tolerance at some depth.
    """

    light: np.ndarray
    strong: dict[int, np.ndarray] = field(default_factory=dict)
    names: tuple[str, str] = DEFAULT_NAMES

    def __post_init__(self) -> None:
        light = _rows(self.light, "light acceptance")
        if not isinstance(self.strong, dict):
            raise SolverError(f"strong must map a (light children) -> per-depth vectors, got "
                              f"{type(self.strong).__name__}")
        K0 = light.shape[1]
        strong: dict[int, np.ndarray] = {}
        for a, v in self.strong.items():
            if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a <= K0:
                raise SolverError(f"strong key {a!r} must be an integer in 0..{K0}: the number of light children "
                                  f"(the light vector has K0 = {K0} ranks)")
            a = int(a)
            rows = _rows(v, f"strong acceptance given {a} light children")
            for r in range(max(rows.shape[0], light.shape[0])):
                lrow = light[min(r, light.shape[0] - 1)]
                srow = rows[min(r, rows.shape[0] - 1)]
                total = float(lrow[:a].sum() + srow.sum())
                if total > 1.0 + SUM_TOLERANCE:
                    raise SolverError(
                        f"at depth {r + 1}, the light's first {a} entries ({lrow[:a].sum():.6g}) plus the strong "
                        f"vector given {a} light children ({srow.sum():.6g}) sum to {total:.6g} > 1; they are "
                        "probabilities of disjoint events at one node")
            strong[a] = rows
        strong = dict(sorted(strong.items()))
        names = tuple(self.names)
        if len(names) != 2 or not all(isinstance(x, str) and x for x in names) or names[0] == names[1]:
            raise SolverError(f"names must be two distinct drafter names (light, strong), got {self.names!r}")
        object.__setattr__(self, "light", light)
        object.__setattr__(self, "strong", strong)
        object.__setattr__(self, "names", names)

    @property
    def keys(self) -> tuple[int, ...]:
        """The allowed light-children counts a next to a strong graft, ascending."""
        return tuple(sorted(self.strong))


def _strong_parent_counts(dtree: DrafterTree) -> list[int]:
    """For each node, how many light (drafter 0) children its parent has (0 for the root)."""
    light_children = [sum(1 for c in kids if dtree.drafter[c] == 0) for kids in dtree.tree.children]
    return [0] + [light_children[dtree.tree.parent[v]] for v in range(1, dtree.size)]


def graft_expected_tokens(dtree: DrafterTree, acc: GraftAcceptance) -> float:
    """G(dtree), expected tokens per step (tokens), under the conditional vectors (module docstring).

    Raises:
        SolverError: a tree with more than two drafters, a strong node next to ``a`` light siblings when
            ``acc.strong`` has no vector for that a, or a rank beyond its vector (light rank >= K0, strong
            conditional rank >= K1).
    """
    if dtree.num_drafters > 2:
        raise SolverError(f"the graft value model covers two drafters (light, strong); this tree names "
                          f"{dtree.num_drafters}")
    light = acc.light
    a_of = _strong_parent_counts(dtree)
    depth = dtree.tree.depth
    prob = np.ones(dtree.size)
    for v in range(1, dtree.size):
        row = int(depth[v]) - 1
        if dtree.drafter[v] == 0:
            r = dtree.tree.rank[v]
            if r >= light.shape[1]:
                raise SolverError(f"node {v}: light rank {r} is beyond the light vector's {light.shape[1]} ranks")
            w = light[min(row, light.shape[0] - 1), r]
        else:
            a, r = a_of[v], dtree.drafter_rank[v]
            q = acc.strong.get(a)
            if q is None:
                raise SolverError(f"node {v}: a strong candidate next to {a} light siblings, but the acceptance "
                                  f"model has strong vectors only for a in {list(acc.keys)}")
            if r >= q.shape[1]:
                raise SolverError(f"node {v}: strong conditional rank {r} is beyond the strong vector given {a} "
                                  f"light children ({q.shape[1]} ranks)")
            w = q[min(row, q.shape[0] - 1), r]
        prob[v] = prob[dtree.tree.parent[v]] * w
    return float(prob.sum())


# ---------------------------------------------------------------------------------------------- cost model
def _check_curves(draft_curves: Sequence[LatencyCurve], k: int) -> list[LatencyCurve]:
    curves = list(draft_curves)
    if len(curves) != k:
        raise SolverError(f"{len(curves)} draft latency curves for a tree of {k} drafters; give one per drafter, "
                          "light first")
    for c in curves:
        if not isinstance(c, LatencyCurve):
            raise SolverError(f"draft curves must be LatencyCurve objects, got {type(c).__name__}")
    return curves


def drafter_forwards(dtree: DrafterTree, k: int, cost_model: str) -> list[int]:
    """The token counts of drafter k's forwards in one step (module docstring): per-level, the nonzero
    :meth:`~sequoia_opt.tree.DrafterTree.processed_level_widths`; one-pass, ``[N_k]`` (``[]`` when it
    proposes nothing). Raises ProfileError for an unknown cost model."""
    if check_cost_model(cost_model, "draft cost model") == "per-level":
        return [w for w in dtree.processed_level_widths(k) if w > 0]
    n_k = dtree.drafter_counts[k]
    return [n_k] if n_k > 0 else []


def drafter_costs_ms(dtree: DrafterTree, draft_curves: Sequence[LatencyCurve],
                     context: int | None = None) -> tuple[float, ...]:
    """Each drafter's draft time in one step (ms), light first, charged by its curve's cost model.
    Raises ProfileError when a forward is outside the measured range of its curve (no extrapolation)."""
    curves = _check_curves(draft_curves, dtree.num_drafters)
    return tuple(sum(c.draft_ms(w, context) for w in drafter_forwards(dtree, k, c.cost_model))
                 for k, c in enumerate(curves))


def _step_cost(g: float, draft: float, n: int, target_curve: LatencyCurve, context: int | None) -> StepCost:
    return cost_of_step(g, draft, target_curve.target_ms(n, context), target_curve, context)


def graft_step_cost(dtree: DrafterTree, target_curve: LatencyCurve, draft_curves: Sequence[LatencyCurve],
                    context: int | None = None, *, expected_tokens: float | None = None,
                    acceptance: GraftAcceptance | None = None) -> StepCost:
    """Predicted cost of one step with ``dtree`` (module docstring): target T(n) and step overhead from
    ``target_curve``, drafter k charged by ``draft_curves[k]`` (light first) under its cost model.

    Args:
        dtree: the tree; one curve per drafter it names.
        target_curve: T(n) and ``step_overhead_ms`` (its draft table is not used).
        draft_curves: c_k(w) of each drafter (their target tables are not used).
        context: context length in tokens (None = each curve's smallest measured).
        expected_tokens / acceptance: G (tokens per step), given or computed by
            :func:`graft_expected_tokens`; without either the rates (tokens_per_s, speedup) are NaN and
            ``expected_tokens`` is NaN: the cost alone.

    Returns:
        :class:`~sequoia_opt.solver.hardware.StepCost` (ms, tokens/s); speedup over plain decoding
        ``T(1) + step_overhead_ms`` (:func:`~sequoia_opt.solver.hardware.plain_ms_per_token`).

    Raises:
        ProfileError: a width or the size outside a curve's measured range, an unknown cost model.
        SolverError: not one draft curve per drafter; G errors of :func:`graft_expected_tokens`.
    """
    if expected_tokens is None:
        expected_tokens = graft_expected_tokens(dtree, acceptance) if acceptance is not None else math.nan
    draft = sum(drafter_costs_ms(dtree, draft_curves, context))
    return _step_cost(float(expected_tokens), draft, dtree.size, target_curve, context)


def pair_curve(target_curve: LatencyCurve, draft_curve: LatencyCurve) -> LatencyCurve:
    """One :class:`~sequoia_opt.profiles.LatencyCurve` with ``target_curve``'s T(n) and step overhead and
    ``draft_curve``'s c(w) and cost model (what :func:`~sequoia_opt.solver.hardware.choose` takes for one
    drafter). Raises ProfileError when the two were measured at different context lengths."""
    if draft_curve is target_curve:
        return target_curve
    if not np.array_equal(target_curve.contexts, draft_curve.contexts):
        raise ProfileError(f"latency profiles {target_curve.id!r} and {draft_curve.id!r} were measured at different "
                           f"contexts ({target_curve.contexts.tolist()} vs {draft_curve.contexts.tolist()}); "
                           "profile both at the same context lengths")
    return dataclasses.replace(target_curve, id=f"{target_curve.id}+{draft_curve.id}", _draft=draft_curve._draft,
                               cost_model=draft_curve.cost_model)


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


# ---------------------------------------------------------------------------------------------- choice
@dataclass(frozen=True)
class GraftChoice:
    """The hardware-aware choice of a grafted tree (:func:`solve_graft`).

    Attributes:
        dtree: the chosen tree (DP-optimal for ``plan``, ``budget``, ``depth``, ``graft_depths`` and
            ``strong_path_depths``).
        plan: ``light only`` (no grafting), ``graft`` or ``strong only`` (:func:`solve_graft`).
        budget / depth / graft_depths / strong_path_depths: the DP limits that produced it
            (:func:`solve_graft_dp`; ``strong_path_depths`` is None when light nodes were allowed under
            strong ones).
        expected_tokens: G (tokens per step).  cost: its :class:`~sequoia_opt.solver.hardware.StepCost`.
        drafter_ms: each drafter's draft time (ms), light first.
        plain_ms_per_token: T(1) + step_overhead_ms.  context: the context length used (None = smallest).
        candidates: the best distinct candidates, best first, as dicts (plan, budget, max_depth, graft_depths,
            strong_path_depths,
            nodes, depth, nodes_per_drafter, level_widths, processed_widths, expected_tokens_per_step,
            draft_ms, drafter_ms, target_ms, overhead_ms, cost_ms, tokens_per_s, speedup).
        considered / skipped: candidates scored / skipped (a draft forward past a curve's measured range).
    """

    dtree: DrafterTree
    plan: str
    budget: int
    depth: int
    graft_depths: tuple[int, ...]
    expected_tokens: float
    cost: StepCost
    drafter_ms: tuple[float, ...]
    plain_ms_per_token: float
    context: int | None
    candidates: list[dict[str, Any]]
    considered: int
    skipped: int
    strong_path_depths: tuple[int, ...] | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.cost.tokens_per_s

    @property
    def speedup(self) -> float:
        return self.cost.speedup


def graft_depth_family(max_depth: int) -> list[frozenset[int]]:
    """The grafting sets (parent depths where strong children may be grafted) :func:`solve_graft` tries:
    none (light only), the prefixes ``{0}``, ``{0, 1}``, .., ``{0..D-1}`` (all), each single depth ``{j}``
    and each suffix ``{j..D-1}``, j = 1..D-1 (3D - 1 sets)."""
    D = _check_int("max depth", max_depth, 1)
    fam = [frozenset()] + [frozenset(range(j + 1)) for j in range(D)]
    fam += [frozenset({j}) for j in range(1, D)] + [frozenset(range(j, D)) for j in range(1, D)]
    return list(dict.fromkeys(fam))


def solve_graft(acc: GraftAcceptance, target_curve: LatencyCurve, draft_curves: Sequence[LatencyCurve], *,
                budget: int, max_depth: int, context: int | None = None, max_branching: int = 32,
                graft_depths_family: Sequence[Iterable[int]] | None = None, strong_only: bool = True,
                top: int = 10, light_under_strong: bool = False) -> GraftChoice:
    """Pick the grafted tree with the highest predicted tokens per second (the approximation of the module
    docstring): the DP-optimal tree of every (budget m on :func:`~sequoia_opt.solver.hardware.budget_grid`,
    depth limit d = 1..D, plan) scored by :func:`graft_step_cost`, where a plan is a grafting set of
    :func:`graft_depth_family` (the empty set = light only) or, when ``acc.strong`` has an a = 0 vector,
    ``strong only`` (the DP over the strong's own vector, every node the strong's); without
    ``light_under_strong`` each plan is tried with the strong's recovered paths allowed at every depth and
    with strong nodes as leaves (``strong_path_depths`` all / none, :func:`solve_graft_dp`).

    Args:
        acc: the conditional vectors.  target_curve: T(n), overhead.  draft_curves: (light, strong) c(w).
        budget: largest n (nodes incl. root).  max_depth: D.  context: tokens (None = smallest measured).
        max_branching: B, children per node (both drafters).  graft_depths_family: other grafting sets to try
            instead of the default family.  strong_only: also try the strong-only plan (when there is an
            a = 0 vector).  top: distinct candidates kept in the table.
        light_under_strong: False (default; what the graft policy runs): no light node under a strong node
            (:func:`solve_graft_dp`); True: allowed.

    Returns:
        :class:`GraftChoice`; its ``candidates`` rows carry ``plan`` (what the tree holds: ``light only``,
        ``graft`` = both drafters' nodes, ``strong only``) and the ``graft_depths`` and ``strong_path_depths``
        its DP was allowed.

    Raises:
        SolverError: bad model / limits / curves count.  ProfileError: budget beyond the largest measured
            target count, or no candidate scoreable without extrapolating a draft curve.
    """
    n, D, B = _check_limits(acc, budget, max_depth, max_branching)
    curves = _check_curves(draft_curves, 2)
    _check_budget_measured(n, target_curve, context)
    family = (graft_depth_family(D) if graft_depths_family is None
              else [_normalize_graft_depths(s, D) for s in graft_depths_family])
    if not family:
        raise SolverError("graft_depths_family is empty: give at least one set of parent depths")
    lus = _check_bool("light_under_strong", light_under_strong)
    pk = _pack(acc)
    plans = [("graft", pk, gd) for gd in family]
    if strong_only and 0 in acc.strong:
        alone = GraftAcceptance(np.zeros((1, 1)), {0: acc.strong[0]}, acc.names)
        plans.append(("strong", _pack(alone), frozenset(range(D))))
    grid = budget_grid(n, target_curve.target_tokens(context))
    max_draft = [c.max_draft_tokens(context) for c in curves]
    scored: list[tuple[tuple, dict[str, Any], _Packed]] = []
    skipped = 0
    seen: set[tuple] = set()
    arrays = [np.empty(n, dtype=np.int64) for _ in range(4)]
    for d in range(1, D + 1):
        todo = {}
        every = frozenset(range(d))
        paths = (every,) if lus else (every, frozenset())
        for name, packed, gd in plans:  # grafting sets that differ only below the depth limit are one plan
            for sd in paths:
                todo.setdefault((name, id(packed), gd & every, sd), (name, packed, gd & every, sd))
        for name, packed, gd, sd in sorted(todo.values(), key=lambda x: (x[0], len(x[2]), sorted(x[2]), -len(x[3]))):
            allow = _allow(gd, d)
            tabs = _graft_tables(packed.P, packed.Q, packed.akeys, packed.K1s, allow, _allow(sd, d), n, d, B, lus)
            for m in grid:
                cnt = _graft_reconstruct(packed.P, packed.Q, packed.akeys, packed.K1s, allow, B, lus, *tabs, m,
                                         *arrays)
                parent, rank, drafter, depth = (x[:cnt] for x in arrays)
                levels = int(depth.max()) + 1
                widths, counts = _drafter_widths(parent, drafter, depth, cnt, levels)
                g = float(tabs[0][0, m])
                key = (tuple(sorted(zip(parent.tolist(), rank.tolist(), drafter.tolist()))), round(g, 9))
                if key in seen:
                    continue
                seen.add(key)
                forwards = []
                for k, c in enumerate(curves):
                    if c.cost_model == "per-level":
                        forwards.append([int(w) for w in widths[k] if w > 0])
                    else:
                        forwards.append([int(counts[k])] if counts[k] > 0 else [])
                if any(max(f, default=1) > max_draft[k] for k, f in enumerate(forwards)):
                    skipped += 1
                    continue
                per = tuple(sum(c.draft_ms(w, context) for w in f) for c, f in zip(curves, forwards))
                cost = _step_cost(g, sum(per), cnt, target_curve, context)
                lw = np.bincount(depth, minlength=levels)
                plan = "graft" if counts[0] and counts[1] else ("strong only" if counts[1] else "light only")
                row = {
                    "plan": plan, "budget": m, "max_depth": d, "graft_depths": sorted(gd),
                    "strong_path_depths": None if lus else sorted(sd), "nodes": cnt,
                    "depth": levels - 1, "nodes_per_drafter": [int(x) for x in counts],
                    "level_widths": [int(x) for x in lw],
                    "processed_widths": [[int(x) for x in widths[k]] for k in range(2)],
                    "expected_tokens_per_step": g, "draft_ms": cost.draft_ms, "drafter_ms": list(per),
                    "target_ms": cost.target_ms, "overhead_ms": cost.overhead_ms, "cost_ms": cost.cost_ms,
                    "tokens_per_s": cost.tokens_per_s, "speedup": cost.speedup,
                }
                # best first; ties go to fewer strong nodes, then the smaller, shallower tree
                order = (-round(cost.tokens_per_s, 9), int(counts[1]), cnt, levels, m, d, len(gd))
                scored.append((order, row, packed))
    if not scored:
        raise ProfileError(f"every candidate tree needs a draft forward wider than the measured draft counts "
                           f"({', '.join(f'{c.id!r}: {w}' for c, w in zip(curves, max_draft))}); profile wider "
                           "draft forwards")
    scored.sort(key=lambda x: x[0])
    _, best, packed = scored[0]
    dtree = _reconstruct_tree(acc.names, packed, n, best["max_depth"], B, frozenset(best["graft_depths"]),
                              best["budget"], lus, frozenset(best["strong_path_depths"] or ()))
    cost = graft_step_cost(dtree, target_curve, curves, context, expected_tokens=best["expected_tokens_per_step"])
    return GraftChoice(
        dtree=dtree, plan=best["plan"], budget=best["budget"], depth=best["max_depth"],
        graft_depths=tuple(best["graft_depths"]), expected_tokens=best["expected_tokens_per_step"], cost=cost,
        drafter_ms=drafter_costs_ms(dtree, curves, context), plain_ms_per_token=plain_ms_per_token(target_curve, context),
        context=context, candidates=[r for _, r, _ in scored[: max(1, top)]], considered=len(scored), skipped=skipped,
        strong_path_depths=None if lus else tuple(best["strong_path_depths"]),
    )


# ---------------------------------------------------------------------------------------------- baselines
def merge_trees(light_tree: Tree, strong_tree: Tree, names: Sequence[str] = DEFAULT_NAMES) -> DrafterTree:
    """The SpecInfer merge (Miao et al. 2024, section 4) of the light's and the strong's own trees, as a
    :class:`~sequoia_opt.tree.DrafterTree`: the two token trees share their root; at the root the light keeps
    its children (and their light subtrees) and the strong's children follow as its conditional ranks
    (with their strong subtrees, where the light proposes nothing, so a = 0 below them).

    Its G under the conditional vectors is an estimate of the real union's, not a bound either way. At the
    root it is optimistic: the strong's unconditional top-b may repeat light tokens, and its top-b less those
    is a subset of its conditional top-b, so the root's strong candidates are credited at least their real
    acceptance. But where the strong repeats a light token, the real union hangs the strong's subtree under
    that light node, which this model does not credit: the estimate can then fall below the strong's own
    tree (tests/test_graft_solver.py has such a case: 3.04 against 3.30 tokens per step), although the
    union holds both trees, so its real G is at least the larger of theirs (:func:`graft_baselines` reports
    that bound beside the estimate). The draft cost is exactly each drafter's own tree's (per-level: the
    nodes with children; :func:`graft_step_cost`) plus the target over the union.
    """
    parent, rank, drafter = [-1], [0], [0]

    def copy(tree: Tree, v: int, new_parent: int, new_rank: int, label: int) -> None:
        me = len(parent)
        parent.append(new_parent)
        rank.append(new_rank)
        drafter.append(label)
        for c in tree.children[v]:
            copy(tree, c, me, tree.rank[c], label)

    a = len(light_tree.children[0])
    for c in light_tree.children[0]:
        copy(light_tree, c, 0, light_tree.rank[c], 0)
    for c in strong_tree.children[0]:
        copy(strong_tree, c, 0, a + strong_tree.rank[c], 1)
    return DrafterTree.from_edges(parent, rank, drafter, tuple(names))


def _label(tree: Tree, k: int, names: Sequence[str]) -> DrafterTree:
    return DrafterTree(tree, (0,) + (k,) * (tree.size - 1), tuple(names))


def graft_baselines(acc: GraftAcceptance, target_curve: LatencyCurve, draft_curves: Sequence[LatencyCurve], *,
                    budget: int, max_depth: int, context: int | None = None,
                    max_branching: int = 32) -> list[dict[str, Any]]:
    """Rows to compare a grafted tree with, all scored by :func:`graft_step_cost` (same cost model):

    - ``light alone``: :func:`~sequoia_opt.solver.hardware.choose` with ``acc.light`` (the by-depth DP when
      it has more than one row) and a curve of the target's T(n) and the light's c(w) (:func:`pair_curve`);
    - ``strong alone``: the same with ``acc.strong[0]`` (left out when the model has no a = 0 vector);
    - ``specinfer merge``: :func:`merge_trees` of the two (an estimate of G, see there), cost = each
      drafter's own tree + T(n_union); ``expected_tokens_at_least`` = the larger G of the two trees (the
      union holds both), with a note when the estimate is below it.

    Each row: name, expected_tokens, cost_ms, tokens_per_s, speedup, size, depth, choices (the rank paths of
    the single drafter's tree, or None), ``choose_cost_ms`` (what choose predicted for a single drafter,
    charging its levels in full as :func:`~sequoia_opt.solver.hardware.step_cost` does) and a ``note`` when a
    row could not be scored (its cost fields are then None).

    Raises:
        SolverError / ProfileError: as :func:`~sequoia_opt.solver.hardware.choose`.
    """
    n, D, B = _check_limits(acc, budget, max_depth, max_branching)
    curves = _check_curves(draft_curves, 2)
    names = acc.names
    rows: list[dict[str, Any]] = []

    def best_alone(vectors: np.ndarray, k: int) -> tuple[Tree, float]:
        solution = solve_dp_by_depth(vectors, n, D, B) if vectors.shape[0] > 1 else None
        ch = choose(vectors[0], pair_curve(target_curve, curves[k]), n, D, B, context=context, solution=solution)
        return ch.tree, ch.cost_ms

    def row(name: str, dtree: DrafterTree, choose_ms: float | None, choices) -> dict[str, Any]:
        out: dict[str, Any] = {"name": name, "size": dtree.size, "depth": dtree.tree_depth,
                               "nodes_per_drafter": list(dtree.drafter_counts), "choices": choices,
                               "choose_cost_ms": choose_ms}
        try:
            g = graft_expected_tokens(dtree, acc)
            c = graft_step_cost(dtree, target_curve, curves, context, expected_tokens=g)
            out.update(expected_tokens=g, cost_ms=c.cost_ms, tokens_per_s=c.tokens_per_s, speedup=c.speedup)
        except (SolverError, ProfileError) as err:
            out.update(expected_tokens=None, cost_ms=None, tokens_per_s=None, speedup=None,
                       note=f"{name} not scored: {err}")
        return out

    light_tree, light_ms = best_alone(acc.light, 0)
    rows.append(row("light alone", _label(light_tree, 0, names), light_ms, light_tree.choices()))
    if 0 in acc.strong:
        strong_tree, strong_ms = best_alone(acc.strong[0], 1)
        rows.append(row("strong alone", _label(strong_tree, 1, names), strong_ms, strong_tree.choices()))
        merged = row("specinfer merge", merge_trees(light_tree, strong_tree, names), None, None)
        at_least = max(r["expected_tokens"] for r in rows if r["expected_tokens"] is not None)
        merged["expected_tokens_at_least"] = at_least
        if merged["expected_tokens"] is not None and merged["expected_tokens"] < at_least:
            merged["note"] = (f"specinfer merge: the conditional model's G {merged['expected_tokens']:.4g} is below "
                              f"{at_least:.4g}, the larger of the two trees' own G; the union holds both trees, so "
                              "its real G is at least that (the model credits no strong subtree under a light "
                              "token the strong also proposed)")
        rows.append(merged)
    return rows


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


__all__ = [
    "BruteForceGraft",
    "GraftAcceptance",
    "GraftChoice",
    "GraftDPSolution",
    "brute_force_graft",
    "drafter_costs_ms",
    "drafter_forwards",
    "graft_baselines",
    "graft_depth_family",
    "graft_expected_tokens",
    "graft_step_cost",
    "merge_trees",
    "optimal_graft_tree",
    "pair_curve",
    "solve_graft",
    "solve_graft_dp",
]
