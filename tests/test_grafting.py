"""Two drafters end to end on a tiny pair: profile_graft -> plan_graft -> graft_entries -> run_trees (greedy
output equal to plain decoding for every configuration), and the scheduled tree's prediction."""

from __future__ import annotations


import pytest
import torch
from test_decoding import _model, _perturbed

from sequoia_opt.drafting.policies import AlwaysGraft, LogisticScheduler, NeverGraft
from sequoia_opt.jobs.run import run_trees
from sequoia_opt.jobs.graft import (GraftProfileSettings, ScheduledPlan, choose_scheduled_plan, graft_acceptance,
                                  graft_entries, plan_graft, profile_graft, scheduled_candidates, scheduled_prediction)
from sequoia_opt.errors import SolverError
from sequoia_opt.solver.graft import graft_expected_tokens
from sequoia_opt.jobs.load import DrafterSpec, ModelPair
from sequoia_opt.profiling.graft import SchedulerSample
from sequoia_opt.tree import DrafterTree


class _Tok:
    eos_ids = frozenset()


@pytest.fixture(scope="module")
def profiled():
    torch.manual_seed(0)
    target = _model(0)
    weak, strong = _perturbed(target, 0.9, 1), _perturbed(target, 0.2, 2)
    light = ModelPair(target, weak, _Tok(), "tiny", "weak", DrafterSpec("model"))
    strong_pair = ModelPair(target, strong, _Tok(), "tiny", "strong", DrafterSpec("model"))
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5], [100, 3, 100, 3, 100], [42]]
    s = GraftProfileSettings(max_tokens=16, context=64, latency_rounds=1, latency_repeats=5, width=3, depth=3,
                             light_width=1, strong_width=2, pair_depth=3, prompts=4, new_tokens=16)
    prof = profile_graft(target, light, strong_pair, prompts, settings=s)
    return target, light, strong_pair, prompts, prof


def test_profiles_name_both_drafters_and_measure_the_pair(profiled):
    target, light, strong, prompts, prof = profiled
    assert (prof.light, prof.strong) == ("weak", "strong")
    assert prof.pair.drafters == ("weak", "strong") and prof.pair.light_width == 1 and prof.pair.strong_width == 2
    assert prof.light_curve.model["draft"] == "weak" and prof.strong_curve.model["draft"] == "strong"
    assert prof.light_acceptance.measured["draft"] == "weak"
    trials = sum(int(v.sum()) for v in prof.pair.counts_by_depth.values())
    assert trials == prof.pair.measured["num_samples"] > 0
    acc = graft_acceptance(prof)
    assert set(acc.strong) == {0, 1}


def test_every_configuration_runs_and_greedy_output_equals_plain(profiled):
    target, light, strong, prompts, prof = profiled
    plans = plan_graft(prof, budget=16, max_depth=4, max_branching=3, context=64)
    assert plans.choice.expected_tokens >= 1.0
    assert {r["name"] for r in plans.baselines} >= {"light alone", "strong alone", "specinfer merge"}
    # on this tiny pair the solver may not graft: schedule a hand-made grafted plan with a scheduler that never
    # calls the strong drafter
    from test_graft_policy import LABELS, PLAN

    dt = DrafterTree(PLAN, tuple(LABELS), ("weak", "strong"))
    sp = ScheduledPlan("test", dt, NeverGraft(), {}, 2.0, 1.5, 0.0, 10.0, 150.0, 1.5, [])
    entries = graft_entries(plans, light.new_drafter, strong.new_drafter, scheduled=sp, reselect=True)
    names = [e.name for e in entries]
    assert names[:3] == ["light alone", "strong alone", "specinfer merge"]
    assert names[3:] == ["graft (static)", "graft (scheduled)", "graft (scheduled, re-selected)"]
    run = run_trees(target, None, entries, prompts, max_new_tokens=12)
    assert run.greedy_ok
    by = {s.tree: s for s in run.summaries}
    merge = by["specinfer merge"]
    assert [d["name"] for d in merge.drafters] == ["weak", "strong"]
    for d, tree in zip(merge.drafters, (plans.light_plan.tree, plans.strong_plan.tree)):
        # each proposes its own tree every step but a root-only one (the last of an answer, with one token left)
        assert d["call_rate"] == (1.0 if tree.tree_depth > 0 else 0.0) and d["calls"] <= merge.steps
    # the scheduler that never calls: the strong drafter is never asked; the static tree asks it every step
    assert by["graft (scheduled)"].drafters[1]["calls"] == 0
    assert by["graft (static)"].drafters[1]["call_rate"] == 1.0
    assert by["graft (scheduled)"].predicted_tokens_per_step_steady == 1.5  # the plan's; less for 12-token answers
    assert 1.0 < by["graft (scheduled)"].predicted_tokens_per_step < 1.5
    # the hand-made plan puts a strong child next to 2 light ones, a width the pair profile did not measure
    assert by["graft (static)"].predicted_tokens_per_step is None
    with pytest.raises(SolverError, match="next to 2 light siblings"):
        graft_expected_tokens(dt, plans.acceptance)


def test_scheduled_plans_are_trained_and_predicted_from_the_profile_steps(profiled):
    target, light, strong, prompts, prof = profiled
    plans = plan_graft(prof, budget=16, max_depth=4, max_branching=3, context=64)
    cands = scheduled_candidates(plans)
    for name, dt in cands:
        assert name in ("solver graft", "merge as graft") and set(dt.drafter[1:]) == {0, 1}
    got = choose_scheduled_plan(plans, target, light.new_drafter, strong.new_drafter, prompts, max_new_tokens=12,
                                pair={"target": "tiny", "light": "weak", "strong": "strong"})
    assert [sp.name for sp in got] == sorted((n for n, _ in cands), key=lambda n: -next(
        sp.tokens_per_s for sp in got if sp.name == n)) and len(got) == len(cands)
    for sp in got:
        assert sp.samples and 0.0 <= sp.call_rate <= 1.0
        assert 1.0 <= sp.expected_tokens <= sp.static_tokens + 1e-9  # between the light part's G and the plan's
        assert sp.tokens_per_s == pytest.approx(1000.0 * sp.expected_tokens / sp.cost_ms)


def test_scheduled_prediction_keeps_the_share_of_the_strong_drafters_value_its_calls_capture():
    s = [SchedulerSample((0.9, 0.9, 0.9, 2.0), 3, 1, 5.0, 1.0, 9, 5, 0),   # the strong drafter added 2 nodes
         SchedulerSample((0.1, 0.1, 0.1, 0.0), 3, 2, 5.0, 1.0, 9, 5, 0),   # added 1
         SchedulerSample((0.4, 0.4, 0.4, 0.0), 2, 2, 5.0, 1.0, 9, 5, 0)]   # added 0
    assert scheduled_prediction(3.0, 2.0, s, AlwaysGraft()) == (3.0, 1.0)
    assert scheduled_prediction(3.0, 2.0, s, NeverGraft()) == (2.0, 0.0)
    calls_confident = LogisticScheduler(weights=[10.0, 0.0, 0.0, 0.0], bias=-5.0)  # calls when conf_root >= 0.5
    g, rate = scheduled_prediction(3.0, 2.0, s, calls_confident)
    assert rate == pytest.approx(1 / 3) and g == pytest.approx(2.0 + (2 / 3) * 1.0)
    with pytest.raises(ValueError):
        scheduled_prediction(3.0, 2.0, [], NeverGraft())


def test_a_grafted_tree_records_its_profiles_weights_and_run_compares_them():
    """A grafted tree carried no fingerprint of the checkpoints its profiles measured, so run said nothing when a
    retrained light or strong drafter of the same name ran it. plan_graft records them (profiled_weights: target,
    light, strong) and run names each that differs."""
    from types import SimpleNamespace

    from sequoia_opt.jobs.graft import graft_weights, graft_weights_warnings
    from sequoia_opt.tree import TreeMetadata

    T, L, S = ({"path": f"/m/{n}", "fingerprint": f"fp-{n}"} for n in ("target", "light", "strong"))
    light_acc = SimpleNamespace(measured={"weights": {"target": T, "draft": L}})
    strong_acc = SimpleNamespace(measured={"weights": {"target": T, "draft": S}})
    rec = graft_weights(SimpleNamespace(light_acceptance=light_acc, strong_acceptance=strong_acc))
    assert rec == {"profiled_weights": {"target": T, "light": L, "strong": S}}
    # lookup (light) records no draft weights: only the target and the strong drafter are kept
    lookup = SimpleNamespace(measured={"weights": {"target": T}})
    assert graft_weights(SimpleNamespace(light_acceptance=lookup, strong_acceptance=strong_acc)) == {
        "profiled_weights": {"target": T, "strong": S}}
    assert graft_weights(SimpleNamespace(light_acceptance=SimpleNamespace(measured={}),
                                         strong_acceptance=SimpleNamespace(measured={}))) == {}
    meta = TreeMetadata(extra=rec)
    same = graft_weights_warnings("g", meta, {"target": T, "draft": L}, {"target": T, "draft": S})
    assert same == []
    retrained = dict(S, fingerprint="fp-strong-2")
    got = graft_weights_warnings("g", meta, {"target": T, "draft": L}, {"target": T, "draft": retrained})
    assert got == ["tree 'g' was solved from profiles measured with other weights: its strong drafter weights "
                   "(fingerprint fp-strong) are not the strong drafter weights in use at /m/strong (fp-strong-2); its "
                   "predicted figures describe that checkpoint"]
    other_target = dict(T, path="/n/target", fingerprint="fp-t2")
    got = graft_weights_warnings("g", meta, {"target": other_target, "draft": L}, {"target": other_target, "draft": S})
    assert len(got) == 1 and "its target weights at /m/target (fingerprint fp-target)" in got[0]
    assert graft_weights_warnings("g", TreeMetadata(), {"target": other_target}, None) == []
