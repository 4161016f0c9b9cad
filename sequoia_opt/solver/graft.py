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

Why: the run-time graft policy (:mod:`~sequoia_opt.drafting.policies.graft`) runs the light drafter first,
over the plan's light-only subtree (the nodes whose root path holds light nodes only), and then lets the
strong drafter graft level by level; a grafted branch is the strong drafter's own recovered path, and
:func:`~sequoia_opt.drafting.policies.graft.check_graft_plan` refuses a light node under a strong one (the
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

    target_ms = T(n), overhead_ms = step_overhead_ms                   (target_curve; the loop's verify_ms(n)
                                                                        and bookkeeping_ms(n) when timed)
    draft_ms  = sum_k draft_k
    per-level drafter k: draft_k = sum over levels j with W_k(j) > 0 of c_k(W_k(j))
        W_k(j) = nodes at depth j that drafter k runs a forward over: the ancestors-or-self of the nodes
                 it expands (DrafterTree.processed_level_widths(k)); level 0 is the root, c_k(1)
    one-pass drafter k:  draft_k = c_k(N_k), N_k = non-root nodes labelled k (none when N_k = 0)
    with drafter k's loop timed: + draft_extra_ms per forward and draft_step_extra_ms once when it drafts
        (LatencyCurve.step_draft_ms)
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
import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import ProfileError, SolverError
from ..profiles import LatencyCurve, check_cost_model
from ..tree import DrafterTree, Tree
from .depth import solve_dp_by_depth
from .dp import _check_int
from .graft_dp import (GraftDPSolution, _allow, _check_bool, _check_limits, _drafter_widths, _graft_reconstruct,
                       _graft_tables, _normalize_graft_depths, _pack, _Packed, _reconstruct_tree, optimal_graft_tree,
                       solve_graft_dp)
from .graft_value import DEFAULT_NAMES, GraftAcceptance, graft_expected_tokens
from .hardware import (StepCost, budget_grid, check_budget_measured, choose, cost_of_step, forwards_outside,
                       plain_ms_per_token)

__all__ = ["GraftAcceptance", "GraftChoice", "GraftDPSolution", "drafter_costs_ms", "drafter_forwards",
           "graft_baselines", "graft_depth_family", "graft_expected_tokens", "graft_step_cost", "merge_trees",
           "optimal_graft_tree", "pair_curve", "solve_graft", "solve_graft_dp"]


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
    out = []
    for k, c in enumerate(curves):
        fw = drafter_forwards(dtree, k, c.cost_model)
        out.append(c.step_draft_ms(fw, context))
    return tuple(out)


def _step_cost(g: float, draft: float, n: int, target_curve: LatencyCurve, context: int | None) -> StepCost:
    return cost_of_step(g, draft, target_curve.step_target_ms(n, context), target_curve, context,
                        target_curve.step_overhead(n, context))


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
    ``draft_curve``'s c(w), cost model and loop extras (per draft forward and per step; the target's loop
    verify and bookkeeping stay), what :func:`~sequoia_opt.solver.hardware.choose` takes for one drafter. Raises
    ProfileError when the two were measured at different context lengths."""
    if draft_curve is target_curve:
        return target_curve
    if not np.array_equal(target_curve.contexts, draft_curve.contexts):
        raise ProfileError(f"latency profiles {target_curve.id!r} and {draft_curve.id!r} were measured at different "
                           f"contexts ({target_curve.contexts.tolist()} vs {draft_curve.contexts.tolist()}); "
                           "profile both at the same context lengths")
    # the loop's verify and bookkeeping are the target's; its draft extras (per forward, per step) the drafter's own
    loops = tuple(None if t is None else dataclasses.replace(
        t, draft_extra_ms=d.draft_extra_ms if d is not None else 0.0,
        draft_step_extra_ms=d.draft_step_extra_ms if d is not None else 0.0)
        for t, d in zip(target_curve._loop, draft_curve._loop))
    return dataclasses.replace(target_curve, id=f"{target_curve.id}+{draft_curve.id}", _draft=draft_curve._draft,
                               cost_model=draft_curve.cost_model, _loop=loops)


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
        """Predicted decoding rate of the grafted tree, tokens/s (1000 * G / the step's cost in ms)."""
        return self.cost.tokens_per_s

    @property
    def speedup(self) -> float:
        """Predicted tokens/s over plain decoding's on the target's curve (ratio)."""
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
            target count, or no candidate scoreable without extrapolating a draft curve (a draft forward wider than
            the largest or narrower than the smallest measured count: such candidates are skipped).
    """
    n, D, B = _check_limits(acc, budget, max_depth, max_branching)
    curves = _check_curves(draft_curves, 2)
    check_budget_measured(n, target_curve, context)
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
    min_draft = [c.min_draft_tokens(context) for c in curves]  # a table from a block size: no c(1) either
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
                if any(forwards_outside(f, min_draft[k], max_draft[k]) for k, f in enumerate(forwards)):
                    skipped += 1
                    continue
                per = tuple(c.step_draft_ms(f, context) for c, f in zip(curves, forwards))
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
        raise ProfileError("every candidate tree needs a draft forward outside the measured draft counts ("
                           + ", ".join(f"{c.id!r}: {lo}..{hi}" for c, lo, hi in zip(curves, min_draft, max_draft))
                           + "); profile the draft forwards over those counts")
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
