"""Hardware-aware choice of budget and depth: maximise expected tokens per second, not per step.

Cost model for one decoding step with a tree of n nodes and level widths ``w_0 = 1, w_1, .., w_L``
(Sequoia, Chen et al. 2024, section 4.2 uses the same split into draft and verification time). The drafter
is charged by its own cost model, the latency profile's ``cost_model`` (:attr:`LatencyCurve.cost_model`;
DESIGN.md, "Drafters and drafting policies")::

    per-level (a draft model, self layer-skip: one forward per tree level):
    draft_ms  = sum_{l = 0}^{L-1} c(w_l)     # to propose the nodes at depth l+1 the draft runs once over
                                            # the w_l nodes at depth l; the deepest level needs no draft run
    one-pass (Medusa heads, block diffusion drafters such as DFlash: one forward proposes every level):
    draft_ms  = c(n - 1)                     # one forward, read at the n - 1 speculated tokens; 0 when n = 1
    target_ms = T(n)                         # one target forward over all n tree tokens (root included)
    cost_ms   = draft_ms + target_ms + step_overhead_ms

Why c(n - 1) for a one-pass drafter: its one forward produces the n - 1 non-root tokens of the tree, and
its profile's draft table is measured as the cost of that forward against the number of tokens it proposes
(a block diffusion drafter denoises a block of that many positions; a heads drafter's table is flat, so
c(n - 1) = c(1) there). Reading c at the tree's speculated tokens is then right for both kinds, grows with
the tree as the real work does, and never charges a one-pass drafter per level.

    tokens_per_s = 1000 * G(tree) / cost_ms

Plain autoregressive decoding (same target, KV cache, device, precision) emits one token per step of
``T(1) + step_overhead_ms``, so ``speedup = tokens_per_s * (T(1) + step_overhead_ms) / 1000``. A root-only tree
has speedup exactly 1.

The step as the runner runs it (issue 31). When the latency profile timed the decoding loop's own steps
(:meth:`~sequoia_opt.profiles.LatencyCurve.has_loop`, :mod:`sequoia_opt.profiling.steps`), the parts above are
the loop's: ``target_ms = verify_ms(n)`` (the target forward and the logits handed to acceptance),
``overhead_ms = bookkeeping_ms(n)`` (accept, commit, observe), every draft forward costs ``c(w) +
draft_extra_ms`` (its logits read) and a step that drafts ``draft_step_extra_ms`` once more (its first forward
reloads the draft's weights after the target ran: :func:`~sequoia_opt.profiling.steps.draft_extras`), and plain
decoding ``verify_ms(1) + bookkeeping_ms(1)``: what a model's forward timed alone leaves out.

Maximising G / cost over all trees is hard (cost depends on the level widths), so :func:`choose` scores the
DP-optimal tree for every (budget m, depth d) with m on a grid (the measured token counts, quarter-octave
steps and the budget itself) and d = 1..D, and keeps the best. T and c come from a
:class:`~sequoia_opt.profiles.LatencyCurve` and are never extrapolated: a tree needing a draft forward outside
the measured draft counts (wider than the largest, or narrower than the smallest) is skipped, a budget past the
largest measured target count is refused (ProfileError).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import numpy as np

from ..errors import ProfileError, SolverError
from ..profiles import LatencyCurve, check_cost_model, validate_acceptance
from ..tree import Tree
from .dp import DPSolution, solve_dp


#: The single-drafter limits of ``treeopt solve`` / ``run`` when none is given: budget (nodes incl. the root), depth
#: D and branching B (a grafted tree's are in the graft solve).
SINGLE_DEFAULTS = {"budget": 128, "max_depth": 16, "max_branching": 32}


@dataclass(frozen=True)
class StepCost:
    """Predicted cost of one decoding step (all in ms) and the resulting rates.

    Attributes:
        expected_tokens: G, tokens per step.
        draft_ms / target_ms / overhead_ms / cost_ms: the parts of one step and their sum.
        tokens_per_s: 1000 * G / cost_ms.
        speedup: tokens_per_s over plain decoding's tokens per second (ratio).
    """

    expected_tokens: float
    draft_ms: float
    target_ms: float
    overhead_ms: float
    cost_ms: float
    tokens_per_s: float
    speedup: float


def plain_ms_per_token(curve: LatencyCurve, context: int | None = None) -> float:
    """Plain autoregressive decoding: ms per token = T(1) + step_overhead_ms (the loop's verify_ms(1) +
    bookkeeping_ms(1) when the profile timed the loop)."""
    return curve.step_target_ms(1, context) + curve.step_overhead(1, context)


def draft_forwards(level_widths: Sequence[int], cost_model: str) -> list[int]:
    """The token counts of a step's draft forwards (see the module docstring): per-level, one forward per
    level but the last over its width (``level_widths[:-1]``); one-pass, one forward over the n - 1
    speculated tokens (none for a root-only tree). Raises ProfileError for another cost model."""
    widths = [int(w) for w in level_widths]
    if check_cost_model(cost_model, "draft cost model") == "per-level":
        return widths[:-1]
    n = sum(widths)
    return [n - 1] if n > 1 else []


def forwards_outside(forwards: Sequence[int], lowest: int, highest: int) -> bool:
    """Whether draft forwards over ``forwards`` tokens each leave the measured draft counts ``lowest..highest``
    (:meth:`LatencyCurve.min_draft_tokens` / :meth:`~LatencyCurve.max_draft_tokens`): pricing them would
    extrapolate c(w) on either side. No forward is never outside."""
    return bool(forwards) and (max(forwards) > highest or min(forwards) < lowest)


def draft_outside(level_widths: Sequence[int], cost_model: str, lowest: int, highest: int) -> bool:
    """:func:`forwards_outside` of a tree's draft forwards under ``cost_model`` (:func:`draft_forwards`)."""
    return forwards_outside(draft_forwards(level_widths, cost_model), lowest, highest)


def step_cost(
    level_widths: Sequence[int], expected_tokens: float, curve: LatencyCurve, context: int | None = None,
    cost_model: str | None = None,
) -> StepCost:
    """Cost of one step for a tree given by its level widths (``[1, w_1, .., w_L]``) and its G.

    The drafter is charged by ``cost_model`` (default: the curve's, :attr:`LatencyCurve.cost_model`):
    ``"per-level"`` sum of c(w_l) over every level but the last, ``"one-pass"`` c(n - 1) (module docstring); with
    the loop timed, plus its extras per forward and once per step (:meth:`LatencyCurve.step_draft_ms`).

    Raises ProfileError when a width or the size is outside the measured range of the curve, or for an
    unknown cost model.
    """
    widths = [int(w) for w in level_widths]
    forwards = draft_forwards(widths, curve.cost_model if cost_model is None else cost_model)
    draft = curve.step_draft_ms(forwards, context)
    n = sum(widths)
    return cost_of_step(expected_tokens, draft, curve.step_target_ms(n, context), curve, context,
                        curve.step_overhead(n, context))


def cost_of_step(expected_tokens: float, draft_ms: float, target_ms: float, curve: LatencyCurve,
                 context: int | None = None, overhead_ms: float | None = None) -> StepCost:
    """The :class:`StepCost` of a step whose draft and target times are known (ms): adds the per-step overhead
    (``overhead_ms``, default the curve's ``step_overhead_ms``) and derives tokens/s and the speedup over plain
    decoding (module docstring). What every cost model here ends in: a static tree's (:func:`step_cost`), a
    grafted tree's, a dynamic setting's mean step.

    Raises ProfileError when the step would cost 0 ms or less.
    """
    overhead = curve.step_overhead_ms if overhead_ms is None else float(overhead_ms)
    cost = draft_ms + target_ms + overhead
    if cost <= 0:
        raise ProfileError(f"latency profile {curve.id!r} predicts a step cost of {cost} ms; it must be > 0")
    tps = 1000.0 * expected_tokens / cost
    return StepCost(expected_tokens=float(expected_tokens), draft_ms=float(draft_ms), target_ms=float(target_ms),
                    overhead_ms=overhead, cost_ms=cost, tokens_per_s=tps,
                    speedup=tps * plain_ms_per_token(curve, context) / 1000.0)


def depth_step_ms(tree: Tree, curve: LatencyCurve, context: int | None = None,
                  cost_model: str | None = None) -> list[float] | None:
    """(D + 1,) one step's cost (ms) with ``tree`` cut to depth 0 .. D: entry 0 plain decoding's step (a root-only
    step asks no drafter, :func:`plain_ms_per_token`), entry d the tree's first d + 1 levels (:func:`step_cost`),
    entry D the whole tree's. The decoder cuts a row's last steps to what it can still emit
    (:meth:`~sequoia_opt.drafting.policies.StaticTreePolicy.step_depth_for`); a tree file records these costs
    (``depth_step_ms``) so that ``treeopt run`` prices those steps
    (:func:`~sequoia_opt.solver.generation.expected_cost`). None where a cut falls outside what the curve
    measured (ProfileError from :func:`step_cost`)."""
    widths = list(tree.level_widths)
    out = [plain_ms_per_token(curve, context)]
    try:
        for d in range(1, len(widths)):
            out.append(step_cost(widths[: d + 1], 1.0, curve, context, cost_model).cost_ms)
    except ProfileError:
        return None
    return [round(c, 6) for c in out]


def run_costs(tree: Tree, curve: LatencyCurve | None, context: int | None = None,
              cost_model: str | None = None) -> dict[str, Any]:
    """What a tree file records of the cost side for ``treeopt run``: ``{"depth_step_ms": ...}``
    (:func:`depth_step_ms`), or nothing without a curve or where a cut is off it. With
    :meth:`~sequoia_opt.solver.depth.ValueModel.run_checks` (the value side), the tree file's run figures."""
    costs = depth_step_ms(tree, curve, context, cost_model) if curve is not None else None
    return {} if costs is None else {"depth_step_ms": costs}


def score_tree(tree: Tree, acceptance: Sequence[float], curve: LatencyCurve, context: int | None = None,
               cost_model: str | None = None) -> StepCost:
    """:func:`step_cost` of a concrete tree under the acceptance vector (any tree: baselines, imports)."""
    return step_cost(tree.level_widths, tree.expected_tokens(acceptance), curve, context, cost_model)


@dataclass(frozen=True)
class Candidate:
    """One scored (budget, depth) pair: the DP's optimal tree for it and its predicted cost.

    ``budget``/``depth`` are the limits given to the DP; ``size``/``tree_depth`` what the tree really uses.
    """

    budget: int
    depth: int
    size: int
    tree_depth: int
    level_widths: tuple[int, ...]
    cost: StepCost

    def as_dict(self) -> dict[str, Any]:
        """A row of the solver's report (and a tree file's alternatives): the DP limits (``budget``, ``max_depth``),
        the tree's ``nodes``, ``depth`` and ``level_widths``, G (``expected_tokens_per_step``), the step's parts and
        total in ms, tokens/s and speedup over plain decoding."""
        c = self.cost
        return {
            "budget": self.budget,
            "max_depth": self.depth,
            "nodes": self.size,
            "depth": self.tree_depth,
            "level_widths": list(self.level_widths),
            "expected_tokens_per_step": c.expected_tokens,
            "draft_ms": c.draft_ms,
            "target_ms": c.target_ms,
            "overhead_ms": c.overhead_ms,
            "cost_ms": c.cost_ms,
            "tokens_per_s": c.tokens_per_s,
            "speedup": c.speedup,
        }


@dataclass(frozen=True)
class Choice:
    """The hardware-aware choice (see module docstring for the cost model).

    Attributes:
        tree: the chosen tree (DP-optimal for ``budget`` and ``depth``).
        budget / depth: the DP limits that produced it (nodes incl. root; depth limit).
        expected_tokens: G (tokens per step).  cost_ms: one step (ms).  tokens_per_s, speedup: rates.
        plain_ms_per_token: T(1) + step_overhead_ms, the plain-decoding baseline.
        context: context length (tokens) the curve was read at, None = smallest measured.
        alternatives: the best distinct candidates, best first (the choice itself is ``alternatives[0]``).
        smaller: a ladder of smaller trees, largest first: for each cap 2, 4, 8, ... below the chosen tree's size,
            the best candidate of at most that many nodes (distinct ones only). What to fall back to when the
            chosen tree's step, timed again, misses its prediction (:func:`~sequoia_opt.jobs.compare.check_plan`).
        shallower: for each depth cap 1 .. the chosen tree's depth - 1, the best candidate whose DP depth limit is
            within it (what :func:`choose` with that ``max_depth`` picks: the same candidates, a subset of these).
        considered / skipped: how many (budget, depth) pairs were scored / skipped for lack of draft data.
        solution: the DP tables (for further queries).
    """

    tree: Tree
    budget: int
    depth: int
    expected_tokens: float
    cost_ms: float
    tokens_per_s: float
    speedup: float
    plain_ms_per_token: float
    context: int | None
    alternatives: list[Candidate]
    considered: int
    skipped: int
    solution: DPSolution = field(repr=False)
    smaller: list[Candidate] = field(default_factory=list)
    shallower: dict[int, Candidate] = field(default_factory=dict)

    def with_candidate(self, candidate: Candidate) -> "Choice":
        """This choice with ``candidate`` (one of :attr:`alternatives` or :attr:`smaller`) chosen instead: its tree
        rebuilt from the same DP tables, its predicted figures the candidate's."""
        c = candidate.cost
        return replace(self, tree=self.solution.tree(candidate.budget, candidate.depth), budget=candidate.budget,
                       depth=candidate.depth, expected_tokens=c.expected_tokens, cost_ms=c.cost_ms,
                       tokens_per_s=c.tokens_per_s, speedup=c.speedup)


def budget_grid(budget: int, measured: Sequence[int]) -> list[int]:
    """Budgets to score: every measured token count <= budget, quarter-octave steps (1, 2, 3, 4, 5, 6, 7,
    8, 10, 11, 13, 16, 19, ...) and the budget itself; sorted, unique."""
    grid = {int(t) for t in measured if 1 <= t <= budget}
    grid.add(int(budget))
    k = 0
    while True:
        v = int(round(2 ** (k / 4)))
        if v > budget:
            break
        grid.add(v)
        k += 1
    return sorted(grid)


def check_budget_measured(budget: int, curve: LatencyCurve, context: int | None) -> None:
    """Refuse a budget past the largest target token count measured in ``curve`` (no extrapolation).

    Raises:
        ProfileError: naming the budget, the largest measured count and the profile.
    """
    max_target = curve.max_target_tokens(context)
    if budget > max_target:
        raise ProfileError(
            f"budget {budget} exceeds the largest target token count {max_target} measured in latency "
            f"profile {curve.id!r}; refusing to extrapolate (lower --budget or profile more tokens)"
        )


class _MemoCurve:
    """A :class:`LatencyCurve` whose ``target_ms`` / ``draft_ms`` remember what they returned (one
    :func:`choose` reads the same few token counts hundreds of times); everything else is the curve's."""

    def __init__(self, curve: LatencyCurve) -> None:
        self._curve, self._t, self._c = curve, {}, {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._curve, name)

    def target_ms(self, n: float, context: int | None = None) -> float:
        key = (n, context)
        if key not in self._t:
            self._t[key] = self._curve.target_ms(n, context)
        return self._t[key]

    def draft_ms(self, w: float, context: int | None = None) -> float:
        key = (w, context)
        if key not in self._c:
            self._c[key] = self._curve.draft_ms(w, context)
        return self._c[key]

    def step_target_ms(self, n: float, context: int | None = None) -> float:
        key = ("step", n, context)
        if key not in self._t:
            self._t[key] = self._curve.step_target_ms(n, context)
        return self._t[key]

    def step_overhead(self, n: float, context: int | None = None) -> float:
        key = ("over", n, context)
        if key not in self._t:
            self._t[key] = self._curve.step_overhead(n, context)
        return self._t[key]

    def draft_extra_ms(self, context: int | None = None) -> float:
        key = ("extra", context)
        if key not in self._t:
            self._t[key] = self._curve.draft_extra_ms(context)
        return self._t[key]

    def draft_step_extra_ms(self, context: int | None = None) -> float:
        key = ("step extra", context)
        if key not in self._t:
            self._t[key] = self._curve.draft_step_extra_ms(context)
        return self._t[key]

    step_draft_ms = LatencyCurve.step_draft_ms  # the curve's formula over the memos above


def choose(
    acceptance: Sequence[float],
    curve: LatencyCurve,
    budget: int,
    max_depth: int,
    max_branching: int = 32,
    *,
    context: int | None = None,
    top: int = 5,
    solution: DPSolution | None = None,
) -> Choice:
    """Pick the budget and depth whose DP-optimal tree maximises predicted tokens per second, the drafter
    charged by the curve's cost model (:func:`step_cost`; a one-pass drafter's single forward over n - 1
    tokens must lie in the measured draft range, as every per-level forward must). This is Sequoia's
    hardware-aware selection (Chen et al. 2024, section 4.2): the DP maximises tokens per step for each
    (budget, depth), the curve picks among those trees.

    Exact over every tree within the limits (at the budgets of :func:`budget_grid`) when a step's cost depends
    on the tree through its size and depth only: a one-pass drafter, or a per-level drafter whose c(w) does not
    grow with w (a GPU's flat draft forward). A per-level c(w) that grows steeply with w can make a narrower tree
    of the same size faster than the DP's (c(2) = 50 c(1): a chain), which this selection does not see; the
    chain baseline of :func:`compare_baselines` shows such a case, and ``max_branching`` 1 solves it.

    Args:
        acceptance: p_1..p_K.  budget: largest n considered (nodes incl. root).  max_depth: D.
        max_branching: B.  context: context length in tokens (None = smallest measured).
        top: how many distinct alternatives to keep.  solution: reuse DP tables solved for >= these limits
        (a :class:`~sequoia_opt.solver.depth.DepthDPSolution` carries the per-depth value model, and must have
        this ``max_branching``; positional tables of another vector or B are solved anew: a reused one returned
        a wrong tree with wrong figures).

    Raises:
        SolverError: bad acceptance / budget / depth, a by-depth ``solution`` of another branching limit.
        ProfileError: budget beyond the largest measured
            target token count, or no candidate could be scored without extrapolating the draft curve.
    """
    p = validate_acceptance(acceptance)
    if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):  # numpy ints too (a review)
        check_budget_measured(int(budget), curve, context)
    if isinstance(solution, DPSolution) and (solution.max_branching != max_branching
                                             or solution.acceptance.shape != p.shape
                                             or not np.array_equal(solution.acceptance, p)):
        solution = None  # positional tables of another vector or branching limit hold other trees: solved anew
    elif solution is not None and getattr(solution, "max_branching", max_branching) != max_branching:
        raise SolverError(f"the {type(solution).__name__} given was solved with max_branching "
                          f"{solution.max_branching}, not {max_branching}: solve it with this limit")  # its model
    if solution is None or solution.max_nodes < budget or solution.max_depth < max_depth:
        solution = solve_dp(p, budget, max_depth, max_branching)
    ms, ds = [], []
    for m in budget_grid(budget, curve.target_tokens(context)):
        for d in range(1, max_depth + 1):
            ms.append(m)
            ds.append(d)
    widths_all = solution.level_widths_many(ms, ds)
    max_draft = curve.max_draft_tokens(context)
    min_draft = curve.min_draft_tokens(context)
    curve = _MemoCurve(curve)  # the candidates share most token counts: read each T(n), c(w) once
    scored: list[Candidate] = []
    skipped = 0
    for j, (m, d) in enumerate(zip(ms, ds)):
        row = widths_all[j]
        nz = np.nonzero(row)[0]
        widths = tuple(int(x) for x in row[: int(nz[-1]) + 1])
        if draft_outside(widths, curve.cost_model, min_draft, max_draft):  # a table from w = 4: no c(1) either
            skipped += 1
            continue
        cost = step_cost(widths, float(solution.table[m, d]), curve, context)
        scored.append(Candidate(m, d, sum(widths), len(widths) - 1, widths, cost))
    if not scored:
        raise ProfileError(
            f"latency profile {curve.id!r}: every candidate tree needs a draft forward outside the measured draft "
            f"counts {min_draft}..{max_draft} tokens; profile the draft forward over those counts"
        )
    # best first; ties (equal rate) go to the smaller, shallower tree
    scored.sort(key=lambda c: (-round(c.cost.tokens_per_s, 9), c.size, c.tree_depth, c.budget, c.depth))
    distinct: list[Candidate] = []
    seen: set[tuple] = set()
    for c in scored:
        key = (c.level_widths, round(c.cost.expected_tokens, 9))
        if key in seen:
            continue
        seen.add(key)
        distinct.append(c)
        if len(distinct) >= max(1, top):
            break
    best = distinct[0]
    tree = solution.tree(best.budget, best.depth)
    smaller: list[Candidate] = []
    cap = 2
    while cap < best.size:  # scored is best first: the first that fits is the cap's best
        fit = next((c for c in scored if c.size <= cap), None)
        if fit is not None and all(fit.level_widths != s.level_widths for s in smaller):
            smaller.append(fit)
        cap *= 2
    smaller.reverse()
    shallower = {cap: c for cap in range(best.tree_depth - 1, 0, -1)
                 if (c := next((c for c in scored if c.depth <= cap), None)) is not None}
    return Choice(
        tree=tree,
        budget=best.budget,
        depth=best.depth,
        expected_tokens=best.cost.expected_tokens,
        cost_ms=best.cost.cost_ms,
        tokens_per_s=best.cost.tokens_per_s,
        speedup=best.cost.speedup,
        plain_ms_per_token=plain_ms_per_token(curve, context),
        context=context,
        alternatives=distinct,
        considered=len(scored),
        skipped=skipped,
        solution=solution,
        smaller=smaller,
        shallower=shallower,
    )


# ---------------------------------------------------------------------------------------------- baselines
@dataclass(frozen=True)
class BaselineResult:
    """A baseline family's best member under the same vector and cost model.

    ``name`` e.g. ``"chain"``; ``params`` e.g. ``{"gamma": 5}``; ``cost`` None without a latency curve, or
    when the curve cannot score the tree (a draft forward wider than it measured): ``note`` then says so.
    """

    name: str
    params: dict[str, int]
    tree: Tree
    expected_tokens: float
    cost: StepCost | None
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A row of the baselines report: ``name``, ``params``, the tree's ``nodes`` and ``depth``, G
        (``expected_tokens_per_step``), then ``cost_ms`` (ms), ``tokens_per_s`` and ``speedup`` when scored and
        ``note`` when set."""
        d: dict[str, Any] = {
            "name": self.name,
            "params": dict(self.params),
            "nodes": self.tree.size,
            "depth": self.tree.tree_depth,
            "expected_tokens_per_step": self.expected_tokens,
        }
        if self.cost is not None:
            d.update(cost_ms=self.cost.cost_ms, tokens_per_s=self.cost.tokens_per_s, speedup=self.cost.speedup)
        if self.note is not None:
            d["note"] = self.note
        return d


def compare_baselines(
    acceptance: Sequence[float],
    budget: int,
    max_depth: int,
    max_branching: int = 32,
    curve: LatencyCurve | None = None,
    *,
    context: int | None = None,
    best_first_budget: int | None = None,
    by_depth=None,
) -> list[BaselineResult]:
    """Best chain (over gamma), best k-ary tree (over k and depth, truncated to the budget), best SpecInfer
    k x L, and best-first with ``best_first_budget`` (default: ``budget``) nodes, all within the budget,
    depth and branching limits. "Best" = highest tokens/s with a curve, else highest G (ties: fewer nodes).
    G is the positional vector's, or with ``by_depth`` ((R, K) per-depth vectors, the ``by-depth`` model of
    :class:`~sequoia_opt.solver.depth.ValueModel`) the per-depth model's, for choosing and for scoring: the
    baselines are scored as the solved tree they are shown next to.

    Nothing is clamped: a budget the curve was not measured to is refused, as :func:`choose` refuses it (a
    caller that wants baselines within the curve lowers the budget itself and says so).

    Raises:
        SolverError: bad acceptance / budget / depth, or ``best_first_budget`` outside ``1..budget``.
        ProfileError: ``budget`` beyond the largest target token count measured in ``curve``.
    """
    from .baselines import best_first, chain, kary_tree, specinfer

    p = validate_acceptance(acceptance)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise SolverError(f"budget must be an integer >= 1, got {budget!r}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
        raise SolverError(f"max depth must be an integer >= 1, got {max_depth!r}")
    if best_first_budget is not None and not 1 <= best_first_budget <= budget:
        raise SolverError(f"best-first budget must be in 1..{budget} (the baselines' budget), got "
                          f"{best_first_budget!r}")
    if curve is not None:
        check_budget_measured(budget, curve, context)
        max_draft = curve.max_draft_tokens(context)
        min_draft = curve.min_draft_tokens(context)
    rows = None
    if by_depth is not None:
        from .depth import expected_tokens_by_depth, validate_acceptance_by_depth

        rows = validate_acceptance_by_depth(by_depth)

    def value(tree: Tree) -> float:  # G under the table's one value model
        return tree.expected_tokens(p) if rows is None else expected_tokens_by_depth(tree, rows)

    # ranks past the last positive p_k add nodes and cost but never expected tokens
    pos = np.any(rows > 0, axis=0) if rows is not None else p > 0
    k_pos = int(np.nonzero(pos)[0][-1]) + 1 if np.any(pos) else 1
    B = max(1, min(max_branching, budget - 1, max(2, k_pos)))

    def key(g: float, widths: Sequence[int]) -> tuple[float, int]:
        if curve is None:
            return (round(g, 12), -sum(widths))
        if draft_outside(widths, curve.cost_model, min_draft, max_draft):
            return (-1.0, 0)
        return (round(step_cost(widths, g, curve, context).tokens_per_s, 9), -sum(widths))

    out: list[BaselineResult] = []

    def add(name: str, params: dict[str, int], tree: Tree) -> None:
        g = value(tree)
        cost, note = None, None
        if curve is not None:
            forwards = draft_forwards(tree.level_widths, curve.cost_model)
            if forwards_outside(forwards, min_draft, max_draft):  # scoring it would extrapolate c(w)
                wide = max(forwards) > max_draft
                note = (f"{name} not scored: it needs a draft forward over {max(forwards) if wide else min(forwards)} "
                        f"tokens; latency profile {curve.id!r} measured draft forwards "
                        + (f"up to {max_draft}" if wide else f"from {min_draft}"))
            else:
                cost = step_cost(tree.level_widths, g, curve, context)
        out.append(BaselineResult(name, params, tree, g, cost, note))

    # chain: widths all 1 (positional G = sum_{j=0..gamma} p1^j)
    best = None
    for gamma in range(0, min(budget - 1, max_depth) + 1):
        k = key(value(chain(gamma)), [1] * (gamma + 1))
        if best is None or k > best[0]:
            best = (k, gamma)
    add("chain", {"gamma": best[1]}, chain(best[1]))

    # k-ary, truncated breadth-first to the budget; deeper than the depth that fills the budget is the same tree
    best = None
    for k_ in range(2, B + 1):
        for d in range(1, max_depth + 1):
            t = kary_tree(k_, d, budget)
            kk = key(value(t), t.level_widths)
            if best is None or kk > best[0]:
                best = (kk, k_, d, t)
            if t.size >= budget:
                break
    if best is not None:
        add("k-ary", {"k": best[1], "depth": best[2]}, best[3])

    # SpecInfer k x L: widths [1, k, .., k] (positional G = 1 + sum_{r<k} p_{r+1} * sum_{j<L} p1^j)
    best = None
    for k_ in range(1, B + 1):
        for L in range(1, max_depth + 1):
            if 1 + k_ * L > budget:
                break
            kk = key(value(specinfer(k_, L)), [1] + [k_] * L)
            if best is None or kk > best[0]:
                best = (kk, k_, L)
    if best is not None:
        add("specinfer", {"k": best[1], "length": best[2]}, specinfer(best[1], best[2]))

    bf_budget = budget if best_first_budget is None else best_first_budget
    add("best-first", {"budget": bf_budget}, best_first(p, bf_budget, max_depth, max_branching, by_depth=rows))
    return out
