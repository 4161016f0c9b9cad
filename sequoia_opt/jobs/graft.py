"""Two drafters, one tree: from the profiles of a light and a strong drafter to the runs that compare the
grafted tree (TreeGraft, 2026) with each drafter alone and with SpecInfer's merge, on one plain baseline.

* :func:`graft_acceptance` — the solver's value model (:class:`~sequoia_opt.solver.graft.GraftAcceptance`)
  from the three acceptance profiles: the light drafter's own vector (per depth), the strong drafter's own
  vector (its children where it proposes alone, ``a = 0``), and the pair profile's conditional vector (the
  strong drafter's candidates next to A light ones, ``a = A``).
* :func:`plan_graft` — every plan from the same profiles: each drafter's own best tree
  (:func:`~sequoia_opt.jobs.compare.plan_drafter`), the hardware-aware grafted tree
  (:func:`~sequoia_opt.solver.graft.solve_graft`) and the SpecInfer merge of the two own trees, with
  predicted tokens per step and speedup for each.
* :func:`graft_entries` — those plans as :class:`~sequoia_opt.jobs.run.TreeEntry` s for
  :func:`~sequoia_opt.jobs.run.run_trees`: light alone, strong alone, merge, the grafted tree with the
  strong drafter called every step ("static"), and, with a trained scheduler, called when the scheduler says.
* :func:`scheduled_prediction` — the scheduled tree's predicted tokens per step: the light part's G plus the
  share of the strong drafter's contribution that the scheduler's calls keep on the profile steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..drafting.policies import GraftPolicy, GraftScheduler, MergePolicy
from ..errors import ProfileError, SolverError
from .run import TreeEntry
from .compare import DrafterPlan, plan_drafter
from ..profiles import PAIR_MIN_TRIALS, AcceptanceProfile, LatencyCurve, PairAcceptanceProfile
from ..profiling.graft import SchedulerSample
from ..model.tuned_linear import linear_record
from ..solver.graft import GraftAcceptance, GraftChoice, graft_baselines, graft_expected_tokens, graft_step_cost, \
    merge_trees, solve_graft
from ..solver.hardware import plain_ms_per_token
from ..tree import DrafterTree, TreeMetadata, now_iso

__all__ = ["GraftProfiles", "GraftPlans", "graft_acceptance", "pair_graft_acceptance", "plan_graft", "graft_entries", "scheduled_prediction",
           "GraftProfileSettings", "profile_graft", "ScheduledPlan", "scheduled_candidates", "choose_scheduled_plan",
           "in_context_prediction", "graft_weights", "graft_weights_warnings"]


@dataclass
class GraftProfiles:
    """What the graft plans are solved from.

    Attributes:
        light, strong: the drafters' labels (:attr:`~sequoia_opt.drafting.registry.DrafterSpec.label`), light first.
        light_cost_model, strong_cost_model: ``per-level`` or ``one-pass``.
        light_curve, strong_curve: each drafter's latency profile (the target's T(n), its own c(w)).
        light_acceptance, strong_acceptance: each drafter's own acceptance profile.
        pair: the pair profile (the strong drafter's conditional vector).
    """

    light: str
    strong: str
    light_cost_model: str
    strong_cost_model: str
    light_curve: LatencyCurve
    strong_curve: LatencyCurve
    light_acceptance: AcceptanceProfile
    strong_acceptance: AcceptanceProfile
    pair: PairAcceptanceProfile


def pair_graft_acceptance(pair: PairAcceptanceProfile, *, strong_alone: AcceptanceProfile | None = None,
                          light_alone: AcceptanceProfile | None = None, names: Sequence[str] | None = None,
                          min_trials: int = PAIR_MIN_TRIALS) -> GraftAcceptance:
    """The graft solver's value model (:class:`~sequoia_opt.solver.graft.GraftAcceptance`) of a pair profile:
    strong = {A: the pair's conditional rows (the strong drafter beside the light's A candidates), 0: the strong
    drafter's own per-depth rows when ``strong_alone`` is given (the plan where it proposes alone)}; light = the
    light drafter's own per-depth rows when ``light_alone`` is given and they form a valid model with the pair's
    conditional rows (two measurements: their sum may pass 1 by noise), else the pair's own light rows (the same
    trials as the conditional rows). Names: ``names`` or the pair's drafters.

    Raises:
        SolverError: no valid model.
    """
    strong = {pair.light_width: pair.strong_rows(min_trials)}
    if strong_alone is not None:
        strong[0] = strong_alone.depth_rows()
    names = tuple(names) if names is not None else tuple(pair.drafters)
    if light_alone is not None:
        try:
            return GraftAcceptance(light_alone.depth_rows(), strong, names)
        except SolverError:
            pass
    return GraftAcceptance(pair.light_rows(min_trials), strong, names)


def graft_acceptance(p: GraftProfiles) -> GraftAcceptance:
    """The value model of a pair's profiles (:func:`pair_graft_acceptance` with both drafters' own profiles).

    Raises:
        SolverError: no valid model.
    """
    return pair_graft_acceptance(p.pair, strong_alone=p.strong_acceptance, light_alone=p.light_acceptance,
                                 names=(p.light, p.strong))


@dataclass
class GraftPlans:
    """Every plan of one pair (:func:`plan_graft`).

    Attributes:
        profiles: what they were solved from.  acceptance: the value model.
        light_plan, strong_plan: each drafter's own best tree (as ``treeopt run --compare-drafters``).
        choice: the grafted tree (:func:`~sequoia_opt.solver.graft.solve_graft`).
        merge: the SpecInfer merge of the two own trees, as a drafter tree.
        baselines: :func:`~sequoia_opt.solver.graft.graft_baselines`' rows (all under the graft cost model).
        metadata: per plan name (``graft``, ``merge``), the tree metadata (predictions, profile ids).
        extrapolated: per drafter vector valued past the depth it was measured to, what
            :func:`~sequoia_opt.solver.graft_value.deepen_conservatively` says; empty when none was.
    """

    profiles: GraftProfiles
    acceptance: GraftAcceptance
    light_plan: DrafterPlan
    strong_plan: DrafterPlan
    choice: GraftChoice
    merge: DrafterTree
    baselines: list[dict[str, Any]]
    metadata: dict[str, TreeMetadata]
    extrapolated: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def graft_weights(p: GraftProfiles) -> dict[str, Any]:
    """``{"profiled_weights": {"target", "light", "strong"}}`` for a grafted tree's metadata: the fingerprints the
    light and strong acceptance profiles recorded (``measured.weights``, :func:`~sequoia_opt.jobs.load.weights_record`;
    a drafter without a checkpoint of its own, lookup or self:L, records none), which ``run`` compares with the
    checkpoints it loads (:func:`graft_weights_warnings`). ``{}`` when neither profile recorded any."""
    light, strong = (a.measured.get("weights") for a in (p.light_acceptance, p.strong_acceptance))
    light, strong = (w if isinstance(w, dict) else {} for w in (light, strong))
    out = {k: v for k, v in (("target", light.get("target") or strong.get("target")), ("light", light.get("draft")),
                             ("strong", strong.get("draft"))) if isinstance(v, dict)}
    return {"profiled_weights": out} if out else {}


def graft_weights_warnings(name: str, meta: TreeMetadata, light: dict | None, strong: dict | None) -> list[str]:
    """One line per model (target, light, strong drafter) whose weights in use (``light`` / ``strong``: the light and
    strong pairs' :func:`~sequoia_opt.jobs.load.weights_record`) are not the ones the grafted tree ``name`` was
    profiled with (its ``profiled_weights``, :func:`graft_weights`): another checkpoint of one name accepts
    otherwise, so the tree's predicted figures describe that checkpoint."""
    from ..profiles import weights_mismatch

    pw = meta.extra.get("profiled_weights")
    if not isinstance(pw, dict):
        return []
    out = []
    for role, used in (("light", light), ("strong", strong)):
        used = used if isinstance(used, dict) else {}
        recorded = {"draft": pw.get(role), **({"target": pw.get("target")} if role == "light" else {})}
        have = {"draft": used.get("draft"), **({"target": used.get("target")} if role == "light" else {})}
        out += [f"tree {name!r} was solved from profiles measured with other weights: {w}; its predicted figures "
                "describe that checkpoint"
                for w in weights_mismatch({"weights": recorded}, have, names={"draft": f"{role} drafter"})]
    return out


def plan_graft(p: GraftProfiles, *, budget: int, max_depth: int, max_branching: int = 8,
               context: int | None = None) -> GraftPlans:
    """Solve every plan of the pair from its profiles (module docstring).

    Raises:
        ProfileError / SolverError: profiles of another drafter, bad limits, a budget past what a curve measured.
    """
    from ..solver.graft_value import deepen_conservatively

    acc, extrapolated = deepen_conservatively(graft_acceptance(p), max_depth)
    light_plan = plan_drafter(p.light, p.light_cost_model, p.light_acceptance, p.light_curve, budget=budget,
                              max_depth=max_depth, max_branching=max_branching, context=context)
    strong_plan = plan_drafter(p.strong, p.strong_cost_model, p.strong_acceptance, p.strong_curve, budget=budget,
                               max_depth=max_depth, max_branching=max_branching, context=context)
    curves = [p.light_curve, p.strong_curve]
    choice = solve_graft(acc, p.light_curve, curves, budget=budget, max_depth=max_depth, context=context,
                         max_branching=max_branching)
    baselines = graft_baselines(acc, p.light_curve, curves, budget=budget, max_depth=max_depth, context=context,
                                max_branching=max_branching)
    merge = merge_trees(light_plan.tree, strong_plan.tree, (p.light, p.strong))
    extra = {"drafters": [p.light, p.strong], **graft_weights(p), "pair_acceptance_profile": p.pair.id,
             "strong_acceptance_profile": p.strong_acceptance.id, "light_acceptance_profile": p.light_acceptance.id,
             "strong_latency_profile": p.strong_curve.id, "graft_plan": choice.plan,
             "graft_depths": list(choice.graft_depths),
             # G of the plan's light part alone: a scheduler's prediction starts from it (scheduled_prediction)
             "light_part_expected_tokens_per_step": graft_expected_tokens(choice.dtree.light_only()[0], acc),
             **({"extrapolated": [x["text"] for x in extrapolated]} if extrapolated else {})}
    meta = {"graft": TreeMetadata(budget=choice.budget, max_depth=choice.depth,
                                  expected_tokens_per_step=choice.expected_tokens, predicted_speedup=choice.speedup,
                                  acceptance_profile=p.pair.id, latency_profile=p.light_curve.id,
                                  solver="graft-dp+hardware", date=now_iso(), extra=extra)}
    try:  # the merge's G is an estimate (graft_baselines' note); the larger own tree's G is a floor
        g_merge = max(graft_expected_tokens(merge, acc), light_plan.choice.expected_tokens,
                      strong_plan.choice.expected_tokens)
        c_merge = graft_step_cost(merge, p.light_curve, curves, context, expected_tokens=g_merge)
        meta["merge"] = TreeMetadata(budget=merge.size, max_depth=merge.tree_depth, expected_tokens_per_step=g_merge,
                                     predicted_speedup=c_merge.speedup, acceptance_profile=p.pair.id,
                                     latency_profile=p.light_curve.id, solver="specinfer-merge", date=now_iso(),
                                     extra=extra)
    except SolverError:
        meta["merge"] = TreeMetadata(solver="specinfer-merge", date=now_iso(), extra=extra)
    return GraftPlans(p, acc, light_plan, strong_plan, choice, merge, baselines, meta, extrapolated)


def scheduled_prediction(expected_tokens: float, light_tokens: float, samples: Sequence[SchedulerSample],
                         scheduler: GraftScheduler) -> tuple[float, float]:
    """The scheduled tree's predicted tokens per step and call rate.

    G_sched = G_light + kappa * (G_full - G_light): the model's G of the plan's light part (``light_tokens``)
    plus the share kappa of the strong drafter's contribution (``expected_tokens - light_tokens``) that the
    scheduler's calls keep, measured on the profile steps: kappa = the nodes the strong drafter added on the steps
    it calls it / on every step (1 when it never added any). Under greedy verification what a step loses
    without the strong drafter is exactly the nodes it added there, so kappa is what the scheduler keeps of
    the value; the model gives the levels, the profile steps the correlation between the features and that
    value. Returns ``(G_sched, call_rate)``.

    Raises:
        ValueError: no samples.
    """
    from ..drafting.policies.scheduler import GraftFeatures

    if not samples:
        raise ValueError("no scheduler samples to predict from")
    calls = np.array([scheduler.decide(GraftFeatures(*s.features)) for s in samples])
    added = np.array([s.accepted_full - s.accepted_light for s in samples], dtype=float)
    kappa = float(added[calls].sum() / added.sum()) if added.sum() > 0 else 1.0
    return float(light_tokens + kappa * (expected_tokens - light_tokens)), float(calls.mean())


def graft_entries(plans: GraftPlans, light: Callable[[], Any], strong: Callable[[], Any], *,
                  scheduled: "ScheduledPlan | None" = None, reselect: bool = False,
                  names: Sequence[str] = ("light alone", "strong alone", "specinfer merge", "graft (static)",
                                          "graft (scheduled)", "graft (scheduled, re-selected)")
                  ) -> list[TreeEntry]:
    """The plans as run entries (module docstring). ``light`` / ``strong`` make a fresh drafter each (each
    decoder binds its own). The grafted tree is ``scheduled.dtree`` when given (then run with the strong drafter
    called every step, "static", and with its scheduler, "scheduled"), else the solver's choice when it holds
    both drafters (static only). ``reselect`` adds the scheduled tree again with the graft positions re-selected
    each step from the strong drafter's scores (:class:`GraftPolicy` ``reselect``; predicted as the fixed
    positions, a lower bound)."""
    p = plans.profiles
    dn = (p.light, p.strong)
    curves = [p.light_curve, p.strong_curve]
    ctx = plans.light_plan.context
    merge_trees_ = (plans.light_plan.tree, plans.strong_plan.tree)
    out = [TreeEntry(names[0], plans.light_plan.tree, plans.light_plan.metadata, draft=light, drafter=p.light),
           TreeEntry(names[1], plans.strong_plan.tree, plans.strong_plan.metadata, draft=strong, drafter=p.strong),
           TreeEntry(names[2], plans.merge.tree, plans.metadata["merge"], drafter="+".join(dn),
                     policy=lambda _: MergePolicy([light(), strong()], merge_trees_, dn))]
    dt = scheduled.dtree if scheduled is not None else (plans.choice.dtree if plans.choice.plan == "graft" else None)
    if dt is None:
        return out
    ic = scheduled.in_context if scheduled is not None else {}
    spreads = {}
    if ic:  # valued in the plan it runs in (in_context_prediction)
        g, speedup = ic["tokens_per_step"], ic["speedup"]
        spreads = {k: ic[k] for k in ("tokens_per_step_spread", "speedup_spread") if k in ic}
    else:
        try:  # a plan the conditional model cannot score (e.g. a light width it did not measure) has no prediction
            g = graft_expected_tokens(dt, plans.acceptance)
            speedup = graft_step_cost(dt, p.light_curve, curves, ctx, expected_tokens=g).speedup
        except (SolverError, ProfileError):
            g = speedup = None
    base = plans.metadata["graft"]
    static_meta = TreeMetadata(budget=dt.size, max_depth=dt.tree_depth, expected_tokens_per_step=g,
                               predicted_speedup=speedup,
                               acceptance_profile=base.acceptance_profile, latency_profile=base.latency_profile,
                               solver=base.solver + ("+in-context" if ic else ""), date=now_iso(),
                               extra={**base.extra, "plan": scheduled.name if scheduled else "solver graft",
                                      **spreads, **({"in_context": {k: v for k, v in ic.items() if "spread" not in k}}
                                                    if ic else {})})
    out.append(TreeEntry(names[3], dt.tree, static_meta, drafter="+".join(dn),
                         policy=lambda _: GraftPolicy.from_drafter_tree(light(), strong(), dt)))
    if scheduled is not None:
        sm = TreeMetadata(budget=dt.size, max_depth=dt.tree_depth, expected_tokens_per_step=scheduled.expected_tokens,
                          predicted_speedup=scheduled.speedup, acceptance_profile=base.acceptance_profile,
                          latency_profile=base.latency_profile, solver="graft+scheduler", date=now_iso(),
                          extra={**{k: v for k, v in static_meta.extra.items() if "spread" not in k},
                                 "predicted_call_rate": scheduled.call_rate})
        sched = scheduled.scheduler
        out.append(TreeEntry(names[4], dt.tree, sm, drafter="+".join(dn),
                             policy=lambda _: GraftPolicy.from_drafter_tree(light(), strong(), dt, sched)))
        if reselect:
            out.append(TreeEntry(names[5], dt.tree, sm, drafter="+".join(dn), policy=lambda _: GraftPolicy.from_drafter_tree(
                light(), strong(), dt, sched, reselect=True)))
    return out


@dataclass
class GraftProfileSettings:
    """Sizes of :func:`profile_graft`'s measurements (the demo's scale by default; ``quick`` for smoke tests).

    Attributes:
        max_tokens: largest target token count / draft width timed (the largest budget considered).
        context: context length the latency is measured at (tokens).
        latency_rounds, latency_repeats: timing rounds and repeats per point (median of round medians).
        width, depth: K and spine depth D of each drafter's own acceptance measurement.
        light_width, strong_width, pair_depth: A, B and D of the pair measurement.
        prompts, new_tokens: profile prompts used and tokens generated per prompt (acceptance and pair).
        loop_rounds: sweeps of the decoding loop's own steps per tree size (0: not timed; :mod:`~sequoia_opt.
            profiling.steps`).
    """

    max_tokens: int = 32
    context: int = 256
    latency_rounds: int = 3
    latency_repeats: int = 5
    width: int = 4
    depth: int = 6
    light_width: int = 1
    strong_width: int = 3
    pair_depth: int = 6
    prompts: int = 8
    new_tokens: int = 64
    loop_rounds: int = 1  # the decoding loop's own step per tree size (profiling/steps.py); 0: not timed

    @classmethod
    def quick(cls) -> "GraftProfileSettings":
        """Smoke-test sizes: T(n) up to 16 tokens, 2 prompts of 16 new tokens, depth 3, the loop's own step not
        timed."""
        return cls(max_tokens=16, latency_rounds=1, latency_repeats=5, width=3, depth=3, strong_width=2,
                   pair_depth=3, prompts=2, new_tokens=16, loop_rounds=0)


def profile_graft(target, light, strong, prompts: Sequence[Sequence[int]], *, settings: GraftProfileSettings,
                  temperature: float = 0.0, top_p: float = 1.0, seed: int = 0, eos_ids: Sequence[int] = (),
                  backend: str = "auto", device_label: str | None = None, prompts_file: str = "",
                  progress: Callable[[str, int, int], None] | None = None) -> GraftProfiles:
    """Measure everything the graft plans are solved from, on this device: the target's T(n) (once), each
    drafter's c(w) in its cost model, each drafter's own acceptance profile and the pair profile.

    Args:
        target: the target :class:`~sequoia_opt.model.Transformer`.
        light, strong: :class:`~sequoia_opt.jobs.load.ModelPair` s of the target with each drafter (their
            ``new_drafter`` makes a fresh proposer, ``draft_name`` and ``cost_model`` name it).
        prompts: profile prompts (token ids); the first ``settings.prompts`` are used.
        temperature, top_p, seed: the acceptance measurements' mode (0 = greedy).

    Raises:
        DecodingError / ProfileError: as the profilers (vocabularies, a grid past the context).
    """
    import torch

    from ..model import Transformer
    from ..profiles import PairAcceptanceProfile
    from ..profiling.acceptance import build_acceptance_profile, measure_acceptance
    from ..device import device_name, device_slug
    from ..profiling.graft import measure_pair_acceptance
    from ..profiling.latency import build_latency_profile, measure_step_overhead, method_text, profile_drafter, \
        profile_model
    from ..profiling.timing import token_grid
    from .load import drafter_slug

    s = settings
    dev = target.device
    dtype_name = str(target.dtype).removeprefix("torch.")
    tname = light.target_name
    grid = token_grid(s.max_tokens)
    timing = dict(rounds=s.latency_rounds, min_repeats=min(5, s.latency_repeats), max_repeats=s.latency_repeats)
    tt = profile_model(target, grid, [s.context], what="target", backend=backend, progress=progress, paired=True,
                       **timing)
    mode = "greedy" if temperature == 0 else "sampling"

    def side(pair) -> tuple[LatencyCurve, AcceptanceProfile]:
        dtab = profile_drafter(target, pair.cost_probe(), grid, [s.context], backend=backend, progress=progress,
                               **timing)
        overhead = measure_step_overhead(target, pair.new_drafter, backend=backend)
        loops = None
        if s.loop_rounds:  # the runner's own step per tree size, this drafter's static trees
            from ..profiling.steps import static_loop_decoders, time_loop

            make_dec = static_loop_decoders(target, pair.new_drafter, backend=backend,
                                            max_len=s.context + 2 * s.max_tokens + 16)
            loops = [time_loop(make_dec, grid, s.context, target.config.vocab_size, rounds=s.loop_rounds,
                               progress=progress)]
        slug = drafter_slug(pair.draft_name)
        curve = build_latency_profile(
            target_tables=tt, draft_tables=dtab, step_overhead_ms=overhead, device=dev, dtype=target.dtype,
            target_name=tname, target_config=target.config, draft_name=pair.draft_name,
            draft_config=pair.draft.config if isinstance(pair.draft, Transformer) else None, random_weights=False,
            profile_id=f"{device_label or device_slug(dev)}_{tname}__{slug}_{dtype_name}",
            method=method_text(s.latency_rounds, True, grid), draft_cost_model=pair.cost_model,
            command="treeopt profile graft", linear=linear_record(target),
            draft_linear=linear_record(pair.draft) if isinstance(pair.draft, Transformer) else None,
            loop_tables=loops)
        ids = list(prompts[: s.prompts])
        counts = measure_acceptance(target, pair.new_drafter, ids, width=s.width, depth=s.depth,
                                    temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=s.new_tokens,
                                    eos_ids=eos_ids, backend=backend, progress=progress)
        acc = build_acceptance_profile(
            counts, profile_id=f"{tname}__{slug}_{mode}", target_name=tname, draft_name=pair.draft_name,
            temperature=temperature, top_p=top_p, depth=s.depth, device=device_name(dev), dtype=dtype_name,
            prompts_file=prompts_file, num_prompts=len(ids), max_new_tokens=s.new_tokens, seed=seed,
            draft_cost_model=pair.cost_model, command="treeopt profile graft")
        if pair.target_path is not None:  # a pair load_drafters made (tests build some by hand)
            acc.measured["weights"] = pair.weights
        return curve, acc

    light_curve, light_acc = side(light)
    strong_curve, strong_acc = side(strong)
    ids = list(prompts[: s.prompts])
    counts = measure_pair_acceptance(target, light.new_drafter, strong.new_drafter, ids, light_width=s.light_width,
                                     strong_width=s.strong_width, depth=s.pair_depth, temperature=temperature,
                                     top_p=top_p, seed=seed, max_new_tokens=s.new_tokens, eos_ids=eos_ids,
                                     backend=backend, progress=progress)
    pid = f"{tname}__{drafter_slug(light.draft_name)}+{drafter_slug(strong.draft_name)}_{mode}"
    pair_profile = PairAcceptanceProfile(
        id=pid, drafters=(light.draft_name, strong.draft_name), cost_models=(light.cost_model, strong.cost_model),
        light_width=s.light_width, strong_width=s.strong_width, counts_by_depth=dict(counts.by_depth),
        measured={"target": tname, "mode": mode, "temperature": float(temperature), "top_p": float(top_p),
                  "depth": s.pair_depth, "num_samples": counts.trials, "steps": counts.steps,
                  "tokens_per_step": round(counts.tokens / counts.steps, 4) if counts.steps else None,
                  "prompts": prompts_file, "num_prompts": len(ids), "max_new_tokens": s.new_tokens, "seed": seed,
                  "device": device_name(dev), "dtype": dtype_name, "threads": torch.get_num_threads(), "date": now_iso()},
        source=(f"measured by treeopt profile graft: decoder verifier on a light rank-0 spine of depth "
                f"{s.pair_depth}, {s.light_width} light + {s.strong_width} grafted strong candidates per spine node"))
    return GraftProfiles(light.draft_name, strong.draft_name, light.cost_model, strong.cost_model, light_curve,
                         strong_curve, light_acc, strong_acc, pair_profile)


@dataclass
class ScheduledPlan:
    """A graft plan run with a trained scheduler, and its prediction from the profile steps
    (:func:`choose_scheduled_plan`).

    Attributes:
        name: where the plan came from (``solver graft`` or ``merge as graft``).
        dtree: the plan.  scheduler: the trained scheduler (or :class:`AlwaysGraft` / :class:`NeverGraft` when
            the strong drafter paid at every / no profile step; ``card`` says which).
        card: the scheduler's card.
        static_tokens: G of the plan with the strong drafter called every step (the conditional model).
        expected_tokens: the scheduled tree's G (:func:`scheduled_prediction`).  call_rate: its predicted rate.
        cost_ms: its predicted step cost: the light part's step (light draft, T(n_light), overhead) plus, at
            the call rate, the strong drafter's draft time and T(n_full) - T(n_light).
        tokens_per_s / speedup: 1000 G / cost_ms, and over plain decoding (T(1) + overhead).
        samples: the profile steps it was trained and predicted on.
        in_context: the plan valued inside itself (:func:`in_context_prediction`): its tokens per step and draft
            times measured by running it on the profile prompts, what ``static_tokens`` and the costs above come from.
    """

    name: str
    dtree: DrafterTree
    scheduler: GraftScheduler
    card: dict[str, Any]
    static_tokens: float
    expected_tokens: float
    call_rate: float
    cost_ms: float
    tokens_per_s: float
    speedup: float
    samples: list[SchedulerSample]
    in_context: dict[str, Any] = dataclasses.field(default_factory=dict)


def in_context_prediction(dtree: DrafterTree, samples: Sequence[SchedulerSample], curve: LatencyCurve,
                          context: int | None, model_tokens: float | None = None) -> dict[str, Any]:
    """A graft plan valued in the plan it will run in (issue 31): its steps on the profile prompts with the strong
    drafter called every step (:func:`~sequoia_opt.profiling.graft.collect_scheduler_samples`) give its tokens per
    step (accepted nodes + 1; the light part's alone: the accepted path's prefix on light nodes), and its drafters'
    draft times as the runner spends them (the light drafter's catch-up chunks after accepted strong nodes
    included). The step adds the loop's verify and bookkeeping at the plan's size (the target curve's,
    :meth:`~sequoia_opt.profiles.LatencyCurve.step_target_ms`). The conditional vectors value the strong drafter
    out of context (its runs measured from a root of its own, its deepest row extrapolated); measured in the
    plan, nothing is.

    Returns:
        ``{tokens_per_step, light_tokens_per_step, light_ms, strong_ms, cost_ms, tokens_per_s, speedup, steps,
        prompts, tokens_per_step_spread, speedup_spread, model_tokens_per_step}`` (ms per step means; the spreads
        between the profile prompts, :func:`~sequoia_opt.solver.intervals.ratio_spread`); empty without samples.
    """
    from ..solver.intervals import ratio_spread

    if not samples:
        return {}
    n = len(samples)
    by_prompt: dict[int, list[float]] = {}
    for s_ in samples:
        row = by_prompt.setdefault(s_.prompt_index, [0.0, 0.0])
        row[0] += 1 + s_.accepted_full
        row[1] += 1
    g = sum(1 + s_.accepted_full for s_ in samples) / n
    g_light = sum(1 + s_.accepted_light for s_ in samples) / n
    light_ms = sum(s_.light_ms for s_ in samples) / n
    strong_ms = sum(s_.strong_ms for s_ in samples) / n
    cost = light_ms + strong_ms + curve.step_target_ms(dtree.size, context) + curve.step_overhead(dtree.size, context)
    tps = 1000.0 * g / cost
    speedup = tps * plain_ms_per_token(curve, context) / 1000.0
    out: dict[str, Any] = {"tokens_per_step": g, "light_tokens_per_step": g_light, "light_ms": light_ms,
                           "strong_ms": strong_ms, "cost_ms": cost, "tokens_per_s": tps, "speedup": speedup,
                           "steps": n, "prompts": len(by_prompt), "model_tokens_per_step": model_tokens}
    sp = ratio_spread([v[0] for v in by_prompt.values()], [v[1] for v in by_prompt.values()], clip=(1.0, None))
    if sp is not None:
        out["tokens_per_step_spread"] = sp.to_dict(sp.prompts)
        out["speedup_spread"] = sp.scaled(speedup / g).to_dict(sp.prompts)
    return out


def scheduled_candidates(plans: GraftPlans) -> list[tuple[str, DrafterTree]]:
    """Plans worth scheduling: the solver's best tree that holds both drafters' nodes (even where, called every
    step, it loses to a drafter alone: a scheduler calls the strong drafter only where it pays), and the
    SpecInfer merge of the two own trees read as a graft plan (the light drafter's best tree, the strong
    drafter's best tree grafted at the root: skipped, the light tree alone runs), when the pair profile can
    score it (it measured the strong drafter next to A light candidates: the light tree's root must have A
    children)."""
    from ..drafting.policies import check_graft_plan
    from ..errors import DecodingError
    from ..solver.graft import graft_depth_family, optimal_graft_tree

    p = plans.profiles
    out: list[tuple[str, DrafterTree]] = []
    lp = plans.light_plan
    try:  # every candidate solve_graft scores; the best by tokens/s that holds both drafters' nodes, rebuilt
        fam = [g for g in graft_depth_family(lp.max_depth) if g]
        c = solve_graft(plans.acceptance, p.light_curve, [p.light_curve, p.strong_curve], budget=lp.budget,
                        max_depth=lp.max_depth, context=lp.context, max_branching=lp.max_branching,
                        graft_depths_family=fam, strong_only=False, top=10_000)
        both = [x for x in c.candidates if x["plan"] == "graft"]
        if both:
            x = max(both, key=lambda x: x["tokens_per_s"])
            dt = optimal_graft_tree(plans.acceptance, x["budget"], x["max_depth"], max_branching=lp.max_branching,
                                    graft_depths=x["graft_depths"], strong_path_depths=x["strong_path_depths"])
            out.append(("solver graft", dataclasses.replace(dt, names=(p.light, p.strong))))
    except (SolverError, ProfileError):
        pass
    if plans.light_plan.tree.tree_depth and plans.strong_plan.tree.tree_depth:
        try:
            check_graft_plan(plans.merge.tree, plans.merge.drafter)
            graft_expected_tokens(plans.merge, plans.acceptance)  # a light width at the root the pair measured
            out.append(("merge as graft", plans.merge))
        except (DecodingError, SolverError):
            pass
    return out


def choose_scheduled_plan(plans: GraftPlans, target, light: Callable[[], Any], strong: Callable[[], Any],
                          prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 0.0,
                          top_p: float = 1.0, eos_ids: Sequence[int] = (), pair: dict[str, str] | None = None,
                          extra_card: dict[str, Any] | None = None,
                          progress: Callable[[str, int, int], None] | None = None) -> list[ScheduledPlan]:
    """For each of :func:`scheduled_candidates`: run it on the profile ``prompts`` with the strong drafter called
    every step (:func:`~sequoia_opt.profiling.graft.collect_scheduler_samples`), train its scheduler
    (:func:`~sequoia_opt.profiling.graft.train_scheduler`) and predict the scheduled tree's tokens per step and
    step cost (:class:`ScheduledPlan`). Returns them best predicted tokens/s first (empty when no plan holds
    both drafters).

    Raises:
        DecodingError: as the decoder, before decoding.
    """
    from ..drafting.policies import AlwaysGraft, NeverGraft
    from ..profiling.graft import NothingToLearn, collect_scheduler_samples, train_scheduler

    p = plans.profiles
    ctx = plans.light_plan.context
    out = []
    for name, dt in scheduled_candidates(plans):
        samples = collect_scheduler_samples(target, light, strong, dt.tree, dt.drafter, prompts,
                                            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                            eos_ids=eos_ids, progress=progress)
        if not samples:
            continue
        try:
            sched = train_scheduler(samples, p.light_curve, pair=pair or {}, context=ctx,
                                    extra_card={"plan": name, **(extra_card or {})})
            card = sched.card
        except NothingToLearn as err:  # scikit-learn missing is not this: it stops the job, named
            sched = AlwaysGraft() if err.always else NeverGraft()
            card = {"kind": sched.name, "why": str(err), "plan": name, **(extra_card or {})}
        light_dt, _ = dt.light_only()
        curve = p.light_curve
        # valued in context: the plan's own steps on the profile prompts (its G and its drafters' times)
        ic = in_context_prediction(dt, samples, curve, ctx, graft_expected_tokens(dt, plans.acceptance))
        g_static = ic["tokens_per_step"]
        g, rate = scheduled_prediction(g_static, ic["light_tokens_per_step"], samples, sched)
        ms_light, ms_strong = ic["light_ms"], ic["strong_ms"]
        base = ms_light + curve.step_target_ms(light_dt.size, ctx) + curve.step_overhead(light_dt.size, ctx)
        extra = (ms_strong + curve.step_target_ms(dt.size, ctx) + curve.step_overhead(dt.size, ctx)
                 - curve.step_target_ms(light_dt.size, ctx) - curve.step_overhead(light_dt.size, ctx))
        cost = base + extra * rate
        tps = 1000.0 * g / cost
        plain = plain_ms_per_token(curve, ctx)
        out.append(ScheduledPlan(name, dt, sched, card, g_static, g, rate, cost, tps, tps * plain / 1000.0, samples,
                                 ic))
    out.sort(key=lambda sp: -sp.tokens_per_s)
    return out
