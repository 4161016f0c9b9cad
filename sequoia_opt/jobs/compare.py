"""Drafters side by side (``treeopt run --compare-drafters``, the demo's table): each drafter's own best tree,
solved from its own profiles (:func:`plan_drafter`), run against one plain baseline (:func:`compare_drafters`),
predicted against measured (:class:`DrafterRow`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Sequence

from ..drafting.drafters import Drafter
from ..model import Transformer
from ..profiles import AcceptanceProfile, LatencyCurve
from ..solver.hardware import Choice, run_costs
from ..tree import Tree, TreeMetadata, now_iso
from .run import RunReport, TreeEntry, run_trees

__all__ = ["DrafterPlan", "check_drafter_profiles", "plan_drafter", "check_plan", "check_plans", "CHECK_MISS",
           "CHECK_KEYS", "CHECK_PROMPTS", "check_warning", "DrafterRow", "drafter_rows", "drafter_table",
           "DrafterComparison", "compare_drafters"]


@dataclass
class DrafterPlan:
    """One drafter's hardware-aware tree, chosen from its own profiles (:func:`plan_drafter`).

    Attributes:
        label: the drafter (:attr:`~sequoia_opt.drafting.registry.DrafterSpec.label`: a checkpoint's name, ``self:L``,
            ``lookup:MIN-MAX``).
        cost_model: how the solver charged it, ``"per-level"`` or ``"one-pass"`` (its latency profile's).
        acceptance: its acceptance profile (:class:`~sequoia_opt.profiles.AcceptanceProfile`).
        curve: its latency profile (:class:`~sequoia_opt.profiles.LatencyCurve`): the target's T(n) and this
            drafter's c(w).
        context: the context length (tokens) the curve was read at.
        budget, max_depth, max_branching: the limits the solver was given (nodes incl. the root; depth; B).
        choice: :func:`~sequoia_opt.solver.hardware.choose`'s result (the tree, predicted G and speedup).
        metadata: the tree's metadata (predicted figures, profile ids, ``extra.drafter``), as saved in YAML.
        name: the tree's name in the run's results (default: the label).
        acceptance_model: the value model the tree was solved with, ``positional`` or ``by-depth``.
    """

    label: str
    cost_model: str
    acceptance: AcceptanceProfile
    curve: LatencyCurve
    context: int
    budget: int
    max_depth: int
    max_branching: int
    choice: Choice
    metadata: TreeMetadata
    name: str
    acceptance_model: str = "positional"

    @property
    def tree(self) -> Tree:
        """The chosen tree (``choice.tree``)."""
        return self.choice.tree

    def metadata_for(self, choice: Choice) -> TreeMetadata:
        """The tree file's metadata for ``choice`` (this plan's or one of its :attr:`Choice.smaller` rebuilt with
        :meth:`Choice.with_candidate`): predicted tokens/step and speedup, the profiles' ids, the limits, the spread
        between prompts and what was profiled (``extra.profiled_*``)."""
        from ..solver.depth import ValueModel
        from ..solver.intervals import spread_metadata

        acc, curve = self.acceptance, self.curve
        extra: dict[str, Any] = {"drafter": self.label, "draft_cost_model": self.cost_model,
                                 "max_branching": self.max_branching, "budget_limit": self.budget,
                                 "context_tokens": self.context, "acceptance_model": self.acceptance_model}
        for key, value in (("target", acc.measured.get("target")), ("draft", self.label),
                           ("draft_cost_model", self.cost_model), ("device", curve.device.get("name")),
                           ("dtype", curve.device.get("dtype") or acc.measured.get("dtype")),
                           ("omp_wait_policy", curve.device.get("omp_wait_policy")),
                           ("temperature", acc.measured.get("temperature")),
                           ("threads", curve.device.get("threads") if curve.device.get("type") == "cpu" else None)):
            if value is not None:
                extra[f"profiled_{key}"] = value
        step = next((c.cost for c in [*choice.alternatives, *choice.smaller]
                     if c.budget == choice.budget and c.depth == choice.depth), None)
        extra.update(spread_metadata(choice.tree, acc, self.acceptance_model, step))
        vm = ValueModel.of_profile(acc, self.acceptance_model)
        extra.update(vm.run_checks(choice.tree))
        extra.update(run_costs(choice.tree, curve, self.context, self.cost_model))
        return TreeMetadata(budget=choice.budget, max_depth=choice.depth,
                            expected_tokens_per_step=choice.expected_tokens, predicted_speedup=choice.speedup,
                            acceptance_profile=acc.id, latency_profile=curve.id, solver="sequoia-dp+hardware",
                            date=now_iso(), extra=extra)

    @property
    def c1_over_t1(self) -> float:
        """c(1) / T(1) at :attr:`context`: one draft forward (per-level) or one proposal of one node
        (one-pass) against one target forward over one token."""
        return self.curve.draft_ms(1, self.context) / self.curve.target_ms(1, self.context)

    def entry(self, draft: Transformer | Drafter | Callable[[], Transformer | Drafter]) -> TreeEntry:
        """This drafter's tree as a :class:`TreeEntry` run with ``draft`` (a factory, as :func:`run_trees`)."""
        return TreeEntry(self.name, self.tree, self.metadata, draft=draft, drafter=self.label)


def _same_name(a: Any, b: Any) -> bool:
    return str(a).strip().lower() == str(b).strip().lower()


def check_drafter_profiles(label: str, cost_model: str, acceptance: AcceptanceProfile, curve: LatencyCurve) -> None:
    """Refuse profiles measured with another drafter than ``label`` (nothing is loaded; call it before any
    weights load). Checked: the acceptance profile's ``measured.draft`` and ``measured.draft_cost_model``, the
    latency profile's ``model.draft`` and draft-table ``cost_model``. A name a profile does not record is not
    compared, except that a latency profile must have measured some drafter (without one its draft cost is
    recorded as 0 ms and every tree would look free to draft).

    Raises:
        ProfileError: one line naming the profile, the drafter it measured, and ``label``.
    """
    from ..errors import ProfileError

    measured = acceptance.measured.get("draft")
    if measured is not None and not _same_name(measured, label):
        raise ProfileError(f"acceptance profile {acceptance.id!r} measured drafter {measured!r}, not {label!r} (the "
                           "drafter it is paired with): each drafter needs its own profiles")
    a_cost = acceptance.measured.get("draft_cost_model")
    if a_cost is not None and str(a_cost) != cost_model:
        raise ProfileError(f"acceptance profile {acceptance.id!r} measured a {a_cost} drafter, but {label!r} is "
                           f"{cost_model}")
    timed = curve.model.get("draft")
    if timed is None:
        raise ProfileError(f"latency profile {curve.id!r} timed no drafter (its draft cost is recorded as 0 ms): "
                           f"profile {label!r} with treeopt profile latency --draft")
    if not _same_name(timed, label):
        raise ProfileError(f"latency profile {curve.id!r} timed drafter {timed!r}, not {label!r} (the drafter it is "
                           "paired with): each drafter needs its own profiles")
    if curve.cost_model != cost_model:
        raise ProfileError(f"latency profile {curve.id!r} charges a {curve.cost_model} drafter, but {label!r} is "
                           f"{cost_model}")


#: the chosen tree's checked speedup below the solver's by more than this fraction sends the check down the
#: ladder of smaller trees (:attr:`~sequoia_opt.solver.hardware.Choice.smaller`)
CHECK_MISS = 0.10

#: what :func:`check_plan` adds to a tree's ``metadata.extra``
CHECK_KEYS = ("solver_predicted_speedup", "step_check", "checked_trees", "rechosen_from")

#: profile prompts a chosen step is checked on (:func:`check_plans`; the demo's and ``run --compare-drafters``')
CHECK_PROMPTS = 4


def check_plan(plan: "DrafterPlan", target: Any, make_drafter: Any, context: int, *, backend: str = "auto",
               steps: int = 12, rounds: int = 2, prompts: Sequence[Sequence[int]] | None = None,
               miss: float = CHECK_MISS, fallbacks: int = 4) -> "DrafterPlan":
    """Time the plan's chosen tree's own step again, after the choice, and predict its speedup from that step
    (:class:`~sequoia_opt.profiling.steps.StepCheck` says why: the winner's curse of a noisy curve); where the
    checked speedup misses the solver's by more than ``miss``, time the ladder of smaller trees too
    (:attr:`~sequoia_opt.solver.hardware.Choice.smaller`: the best tree of at most 16, 8, 4, 2 nodes, the first
    ``fallbacks``) and keep the tree whose checked speedup is highest. A noisy curve misleads the solver most
    where T(n) is bumpy and the big trees' steps were timed low; the ladder's checks are independent of the
    choice, so the tree kept is chosen on timings that did not choose it (on a 2-core Xeon VM the demo's solver
    chose a 32-node tree at 1.26x that ran 1.08x while a chain of one ran 1.34x).

    The checks run on the profile's ``prompts`` when given (drafts accepted as they will be:
    :func:`~sequoia_opt.profiling.steps.check_chosen_step`), else on a random context. The returned plan's
    metadata: ``predicted_speedup`` from the kept tree's check, the solver's own figure as
    ``extra.solver_predicted_speedup``, its check as ``extra.step_check``, every tree checked as
    ``extra.checked_trees`` (nodes, level widths, solver's and checked speedup) and, where the kept tree is not
    the solver's, the solver's as ``extra.rechosen_from``; the speedup's spread between prompts rescaled.
    Tokens per step stay the solver's (the step check times cost, not acceptance).

    Returns:
        ``plan`` updated in place, or a new :class:`DrafterPlan` (same profiles and limits, another tree) when a
        smaller tree checked faster, or the root alone (plain decoding, 1x) when every tree checked ran below 1x.
        A root-only tree, or one no step of which ran, is returned unchanged.

    Raises:
        DecodingError: as the decoder.
    """
    from ..profiling.steps import check_chosen_step
    from ..solver.intervals import PromptSpread

    def check(choice: Choice):
        return check_chosen_step(target, make_drafter, choice.tree, context, backend=backend, steps=steps,
                                 rounds=rounds, prompts=prompts)

    if plan.metadata.expected_tokens_per_step is None:  # nothing to predict a speedup from: nothing timed
        return plan
    first = check(plan.choice)
    if first is None:
        return plan
    checked = [(plan.choice, first, first.speedup(plan.choice.expected_tokens))]
    if checked[0][2] < (1.0 - miss) * plan.choice.speedup:
        for cand in plan.choice.smaller[: max(0, int(fallbacks))]:
            choice = plan.choice.with_candidate(cand)
            if (chk := check(choice)) is not None:
                checked.append((choice, chk, chk.speedup(choice.expected_tokens)))
    # highest checked speedup; a tie goes to the smaller tree (less to draft, less to go wrong)
    kept_choice, kept_check, new = max(checked, key=lambda x: (round(x[2], 6), -x[0].tree.size))
    rows = [{"nodes": c.tree.size, "level_widths": list(c.tree.level_widths), "solver_speedup": round(c.speedup, 6),
             "checked_speedup": round(v, 6)} for c, _, v in checked]
    if new < 1.0:  # every tree checked slower than plain decoding: the root alone is plain decoding (1x exactly)
        kept_choice, kept_check, new = _root_alone(plan.choice), None, 1.0
    if kept_choice is not plan.choice:
        solver_row = rows[0]
        plan = replace(plan, choice=kept_choice, metadata=plan.metadata_for(kept_choice))
        plan.metadata.extra["rechosen_from"] = solver_row
    meta = plan.metadata
    old = meta.predicted_speedup
    meta.extra["solver_predicted_speedup"] = old
    meta.extra["step_check"] = kept_check.as_dict() if kept_check is not None else None
    meta.extra["checked_trees"] = rows
    spread = meta.extra.get("speedup_spread")
    if plan.tree.size == 1:  # plain decoding: no acceptance to spread between prompts
        meta.extra.pop("speedup_spread", None)
    elif isinstance(spread, dict) and old:
        ps = PromptSpread.from_dict(spread, (0.0, None))
        if ps is not None:
            meta.extra["speedup_spread"] = ps.scaled(new / old).to_dict(spread.get("new_prompts"))
    meta.predicted_speedup = new
    return plan


def _root_alone(choice: Choice) -> Choice:
    """``choice`` with the root alone chosen: plain decoding, one token a step at the plain step's cost (speedup
    1 exactly, :mod:`~sequoia_opt.solver.hardware`)."""
    from ..solver.hardware import Candidate, StepCost

    plain = choice.plain_ms_per_token
    cost = StepCost(expected_tokens=1.0, draft_ms=0.0, target_ms=plain, overhead_ms=0.0, cost_ms=plain,
                    tokens_per_s=1000.0 / plain, speedup=1.0)
    return choice.with_candidate(Candidate(budget=1, depth=0, size=1, tree_depth=0, level_widths=(1,), cost=cost))


def check_plans(plans: list["DrafterPlan"], target: Any, make_drafters: Sequence[Any],
                prompts: Sequence[Sequence[Sequence[int]] | None], *, backend: str = "auto", steps: int = 12,
                rounds: int = 2, progress: Callable[[str, int, int], None] | None = None) -> list[str]:
    """:func:`check_plan` for every drafter's plan (``plans[i]`` drafted by ``make_drafters[i]``: a draft model,
    or a factory of a fresh drafter, as :func:`~sequoia_opt.profiling.steps.check_chosen_step` takes; checked on
    ``prompts[i]``: token ids of a few of its profile's prompts, None for a random context), each at its own
    context; ``progress(what, done, total)`` is told as each plan's check ends; ``plans`` is updated in place (a
    plan whose smaller tree checked faster is replaced). What the demo and ``treeopt run --compare-drafters`` run
    before their runs.

    Returns:
        :func:`check_warning`'s lines, one per plan that has one, in order.

    Raises:
        ValueError: ``plans``, ``make_drafters`` and ``prompts`` differ in length.
        DecodingError: as the decoder.
    """
    if not len(plans) == len(make_drafters) == len(prompts):
        raise ValueError(f"{len(plans)} plans, {len(make_drafters)} drafters and {len(prompts)} prompt sets: one "
                         "each per plan")
    warnings: list[str] = []
    for i, make in enumerate(make_drafters):
        plans[i] = check_plan(plans[i], target, make, plans[i].context, backend=backend, steps=steps, rounds=rounds,
                              prompts=prompts[i])
        if progress is not None:
            progress(f"{plans[i].label}: chosen step checked", i + 1, len(plans))
        if (line := check_warning(plans[i])) is not None:
            warnings.append(line)
    return warnings


def check_warning(plan: "DrafterPlan") -> str | None:
    """One line when :func:`check_plan` kept another tree than the solver's, or left the plan's tree predicting a
    loss where the solver predicted a gain (its checked speedup below 1x): the choice rode noise in the latency
    curve, and the user should know before the run says which figure held. None otherwise (or before a check)."""
    meta = plan.metadata
    old, new = meta.extra.get("solver_predicted_speedup"), meta.predicted_speedup
    was = meta.extra.get("rechosen_from")
    if isinstance(was, dict):
        if plan.tree.size == 1:
            smaller = [str(r["nodes"]) for r in (meta.extra.get("checked_trees") or [was])[1:]]
            also = (f", and every smaller tree checked ({', '.join(smaller)} nodes) below 1x too" if smaller
                    else ", and no smaller tree was left to check")
            return (f"{plan.label}: the solver's {was['nodes']}-node tree ({was['solver_speedup']:.2f}x) timed again "
                    f"after the choice predicted {was['checked_speedup']:.2f}x{also}: it runs the root alone (plain "
                    "decoding, 1x): the choice rode noise in the latency curve")
        return (f"{plan.label}: the solver's {was['nodes']}-node tree ({was['solver_speedup']:.2f}x) timed again "
                f"after the choice predicted {was['checked_speedup']:.2f}x; kept the {plan.tree.size}-node tree "
                f"that checked best ({new:.2f}x; the solver said {old:.2f}x): the choice rode noise in the latency "
                "curve")
    if old is None or new is None or not new < 1.0 < old:
        return None
    return (f"{plan.label}: its {plan.tree.size}-node tree's step, timed again after the choice, predicts {new:.2f}x "
            f"(the solver said {old:.2f}x): the choice rode noise in the latency curve; the run says which figure "
            "held (on a machine that nothing else loads, the curve is steadier)")


def plan_drafter(label: str, cost_model: str, acceptance: AcceptanceProfile, curve: LatencyCurve, *,
                 budget: int | None = None,
                 max_depth: int = 10, max_branching: int = 8, context: int | None = None,
                 name: str | None = None, check: bool = True, acceptance_model: str = "auto") -> DrafterPlan:
    """Choose one drafter's best tree from its own profiles: :func:`~sequoia_opt.solver.hardware.choose` on
    its acceptance vector and its latency curve (the drafter charged by its cost model), as ``treeopt solve
    -a ACC -l LAT`` would.

    Args:
        label, cost_model: the drafter (:class:`~sequoia_opt.drafting.registry.DrafterSpec` ``label`` and
            ``cost_model``).
        acceptance: its :class:`~sequoia_opt.profiles.AcceptanceProfile`.
        curve: its :class:`~sequoia_opt.profiles.LatencyCurve`.
        budget: the largest tree considered (nodes incl. the root); None = the largest target token count
            the curve measured at ``context``.
        max_depth, max_branching: the solver's depth limit D (at most the profile's
            :attr:`~sequoia_opt.profiles.AcceptanceProfile.depth_limit`) and most children per node B.
        context: context length (tokens) to read the curve at; None = the smallest measured.
        name: the tree's name in results (default: ``label``).
        check: refuse profiles of another drafter first (:func:`check_drafter_profiles`).
        acceptance_model: ``auto`` | ``positional`` | ``by-depth``, as ``treeopt solve --acceptance-model``
            (:func:`~sequoia_opt.solver.depth.resolve_acceptance_model`: ``auto`` solves with the profile's
            per-depth vectors when its positional check failed, as it does for prompt lookup).

    Returns:
        :class:`DrafterPlan`.

    Raises:
        ProfileError: profiles of another drafter; a budget past what the curve measured; no tree the
            curve can score. SolverError: bad limits or acceptance vector.
    """
    from ..solver import choose
    from ..solver.depth import solve_profile

    if check:
        check_drafter_profiles(label, cost_model, acceptance, curve)
    ctx = int(curve.contexts[0]) if context is None else int(context)
    limit = curve.max_target_tokens(context) if budget is None else budget
    max_depth = acceptance.capped_depth(max_depth)  # Medusa's K heads: a deeper tree is cut every step
    solution, model_used = solve_profile(acceptance, limit, max_depth, max_branching, acceptance_model)
    choice = choose(acceptance.acceptance, curve, limit, max_depth, max_branching, context=context,
                    solution=solution)
    plan = DrafterPlan(label=label, cost_model=cost_model, acceptance=acceptance, curve=curve, context=ctx,
                       budget=limit, max_depth=max_depth, max_branching=max_branching, choice=choice,
                       metadata=TreeMetadata(), name=name or label, acceptance_model=model_used)
    plan.metadata = plan.metadata_for(choice)
    return plan


@dataclass
class DrafterRow:
    """One drafter's best tree against plain decoding, predicted and measured (one row of the side-by-side
    table; ``RunReport.drafters`` holds these as dicts).

    Attributes:
        drafter, cost_model: the drafter's label and cost model.
        tree: the tree's name in the run's summaries and rows.
        c1_over_t1: c(1) / T(1) from its latency profile (ratio).
        nodes, depth, level_widths: the tree (nodes incl. the root; widths from the root level down).
        predicted_tokens_per_step / predicted_speedup: from its profiles (:func:`plan_drafter`), for the run's
            generation lengths (:attr:`TreeSummary.predicted_tokens_per_step`, :attr:`TreeSummary.predicted_speedup`).
        tokens_per_step / tps_ci95: measured, as the steps emitted (:class:`TreeSummary`).
        speedup: measured tokens/s over the run's one plain baseline.  tokens_per_s: measured.
        equals_plain: greedy output equal to plain decoding on every prompt (None when sampling).
        mismatches: prompts whose greedy output differed.
        acceptance_profile, latency_profile: the profile ids.
        acceptance_model: how the prediction was solved, ``positional`` or ``by-depth`` (:func:`plan_drafter`).
    """

    drafter: str
    cost_model: str
    tree: str
    c1_over_t1: float
    nodes: int
    depth: int
    level_widths: list[int]
    predicted_tokens_per_step: float
    tokens_per_step: float
    tps_ci95: tuple[float, float]
    predicted_speedup: float
    speedup: float
    tokens_per_s: float
    equals_plain: bool | None
    mismatches: int
    acceptance_profile: str
    latency_profile: str
    acceptance_model: str = "positional"


def drafter_rows(plans: Sequence[DrafterPlan], run: RunReport) -> list[DrafterRow]:
    """One :class:`DrafterRow` per plan, from the run's summary of the plan's tree (by name).

    Raises:
        KeyError: a plan's tree is not in the run.
    """
    by_name = {s.tree: s for s in run.summaries}
    greedy = run.settings.get("temperature", 0.0) == 0
    out = []
    for p in plans:
        s = by_name[p.name]
        out.append(DrafterRow(
            drafter=p.label, cost_model=p.cost_model, tree=p.name, c1_over_t1=p.c1_over_t1, nodes=p.tree.size,
            depth=p.tree.tree_depth, level_widths=[int(w) for w in p.tree.level_widths],
            # for the run's generation lengths, as the speedup below (TreeSummary.predicted_tokens_per_step)
            predicted_tokens_per_step=(s.predicted_tokens_per_step if s.predicted_tokens_per_step is not None
                                       else p.choice.expected_tokens), tokens_per_step=s.tokens_per_step,
            tps_ci95=s.tps_ci95, speedup=s.speedup,
            # the run's: the metadata's (a step check after the choice may have replaced the solver's) over the
            # run's generation lengths (TreeSummary.predicted_speedup)
            predicted_speedup=s.predicted_speedup if s.predicted_speedup is not None else p.choice.speedup,
            tokens_per_s=s.tokens_per_s, equals_plain=(s.mismatches == 0) if greedy else None,
            mismatches=s.mismatches, acceptance_profile=p.acceptance.id, latency_profile=p.curve.id,
            acceptance_model=str(p.metadata.extra.get("acceptance_model", "positional"))))
    return out


def drafter_table(rows: Sequence[DrafterRow]) -> tuple[str, list[str], list[list[Any]]]:
    """The side-by-side table (title, column names, rows) of :class:`DrafterRow` s, for a
    :class:`~sequoia_opt.report.Report`: one row per drafter, its best tree, predicted against measured."""
    cols = ["drafter", "cost model", "acc. model", "c(1)/T(1)", "nodes", "depth", "level widths", "pred. tokens/step",
            "tokens/step", "95% CI", "pred. speedup", "speedup", "tokens/s", "= plain"]
    body = [[r.drafter, r.cost_model, r.acceptance_model, r.c1_over_t1, r.nodes, r.depth,
             " ".join(map(str, r.level_widths)),
             r.predicted_tokens_per_step, r.tokens_per_step, f"{r.tps_ci95[0]:.2f} to {r.tps_ci95[1]:.2f}",
             r.predicted_speedup, r.speedup, r.tokens_per_s,
             "-" if r.equals_plain is None else ("yes" if r.equals_plain else f"NO ({r.mismatches})")]
            for r in rows]
    return ("drafters side by side: each drafter's own best tree (its profiles, this device) against one plain "
            "baseline", cols, body)


@dataclass
class DrafterComparison:
    """What :func:`compare_drafters` ran: the run (one plain baseline, every tree), and one row per drafter."""

    run: RunReport
    rows: list[DrafterRow]
    plans: list[DrafterPlan]

    @property
    def greedy_ok(self) -> bool:
        """True unless some tree's greedy output differed from plain decoding (:attr:`RunReport.greedy_ok`)."""
        return self.run.greedy_ok


def compare_drafters(
    target: Transformer,
    plans: Sequence[DrafterPlan],
    drafts: Sequence[Transformer | Drafter | Callable[[], Transformer | Drafter]],
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    extra_entries: Sequence[TreeEntry] = (),
    draft: Transformer | Drafter | Callable[[], Transformer | Drafter] | None = None,
    **run_kw: Any,
) -> DrafterComparison:
    """Run every drafter's best tree (``plans[i]`` with ``drafts[i]``, each decoder getting a fresh drafter
    from it) and plain decoding once, on the same prompts, in one :func:`run_trees` call; return the run
    and one :class:`DrafterRow` per drafter (also stored as ``run.drafters``).

    Args:
        target: the target model.
        plans: the drafters' trees (:func:`plan_drafter`), distinct names.
        drafts: per plan, its proposer as :func:`run_trees` takes ``draft`` (a draft Transformer, or a
            function making a fresh drafter: ``ModelPair.new_drafter``).
        prompts: token-id lists.  max_new_tokens: tokens per prompt.
        extra_entries: more trees to run in the same call after the drafters' (baselines), with their own
            drafter or ``draft``.
        draft: the proposer of ``extra_entries`` that have none of their own.
        run_kw: passed to :func:`run_trees` (``temperature``, ``top_p``, ``seed``, ``eos_ids``, ``backend``,
            ``warmup``, ``settings``, ``progress``).

    Raises:
        ValueError: ``drafts`` and ``plans`` of different lengths, no plans, duplicate tree names.
        DecodingError: as :func:`run_trees`, before the first timed forward.
    """
    if not plans:
        raise ValueError("no drafters to compare")
    if len(drafts) != len(plans):
        raise ValueError(f"{len(plans)} drafter plans but {len(drafts)} drafts")
    entries = [p.entry(d) for p, d in zip(plans, drafts)] + list(extra_entries)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"tree names must be distinct within one run, got {names}")
    run = run_trees(target, draft, entries, prompts, max_new_tokens=max_new_tokens, **run_kw)
    rows = drafter_rows(plans, run)
    run.drafters = [asdict(r) for r in rows]
    return DrafterComparison(run=run, rows=rows, plans=list(plans))
