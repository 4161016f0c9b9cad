"""Adaptive speculation plans (issues 29 and 31): the per-depth chain estimate and its prior, the re-ranking against
brute force, the plan file round trip and refusals, and the policy run exactly on tiny models while it switches."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from sequoia_opt.decoding.sampling import NodeVisit
from sequoia_opt.drafting.policies.adaptive_schedule import (AdaptiveSchedulePolicy, ChainEstimate, PlanAdapter,
                                                             PlanCandidates, chain_g_from_hazards,
                                                             hazards_from_chain_g)
from sequoia_opt.errors import DecodingError, ProfileError, TreeoptError
from sequoia_opt.solver.schedule import (ChainValue, load_schedule, merge_ranges, plan_document, save_schedule,
                                        solve_plan)

sys.path.insert(0, str(Path(__file__).parent))
from test_schedule import PROFILE, _acc, _curve, _profile  # noqa: E402


def _chain_visits(accepted: int, drafted: int) -> list[NodeVisit]:
    """One row's trials on a chain of ``drafted`` drafts of which the first ``accepted`` were accepted."""
    return [NodeVisit(d, 1, 0 if d < accepted else None) for d in range(min(accepted + 1, drafted))]


def test_hazards_and_tokens_per_step_invert_each_other():
    g = ChainValue(_acc(), 4).g  # positional p = (0.7, 0.1, 0.05): a chain accepts rank 0 only, 0.7 per depth
    h = hazards_from_chain_g(g)
    np.testing.assert_allclose(h, [0.7, 0.7, 0.7, 0.7])
    np.testing.assert_allclose(chain_g_from_hazards(h), g)
    np.testing.assert_allclose(chain_g_from_hazards([0.5, 0.0, 0.9]), [1.0, 1.5, 1.5, 1.5])
    np.testing.assert_allclose(hazards_from_chain_g([1.0, 1.5, 1.5, 1.5]), [0.5, 0.0, 0.0])
    for bad in ([1.0], [2.0, 2.5], [1.0, float("nan")]):
        with pytest.raises(ProfileError, match="must start at G"):
            hazards_from_chain_g(bad)


def test_chain_estimate_shrinks_towards_the_prior_scaled_by_the_live_ratio():
    est = ChainEstimate([1.0, 1.7, 2.19], window=4, prior_weight=8.0)  # h0 = (0.7, 0.7)
    np.testing.assert_allclose(est.g(), [1.0, 1.7, 2.19])  # no trials: the prior
    for _ in range(10):  # 10 rows, 9 accept the first draft of a chain of 1: depth 2 is never tried
        est.add_step([_chain_visits(1, 1)] * 9 + [_chain_visits(0, 1)])
    # the window keeps the last 4 steps: 40 trials at depth 1, 36 hits
    assert est.trials.tolist() == [40, 0] and est.hits.tolist() == [36, 0] and est.steps == 10
    rho = (36 + 8) / (40 * 0.7 + 8)
    h1 = (36 + 8 * min(1.0, rho * 0.7)) / (40 + 8)
    np.testing.assert_allclose(est.hazards, [h1, min(1.0, rho * 0.7)])
    np.testing.assert_allclose(est.g(), [1.0, 1 + h1, 1 + h1 + h1 * rho * 0.7])
    for _ in range(4):  # plain steps take their places in the window: the prior is back
        est.add_step([])
    np.testing.assert_allclose(est.g(), [1.0, 1.7, 2.19])
    assert est.ratio == 1.0
    with pytest.raises(DecodingError, match="window"):
        ChainEstimate([1.0, 1.5], window=0)
    with pytest.raises(DecodingError, match="prior weight"):
        ChainEstimate([1.0, 1.5], prior_weight=-1)


def test_chain_estimate_counts_only_tried_drafts_within_its_depth():
    est = ChainEstimate([1.0, 1.5, 1.7])
    t, h = est.counts(_chain_visits(2, 4))  # drafts 1, 2 accepted, 3 rejected: three trials, one past K = 2
    assert t.tolist() == [1, 1] and h.tolist() == [1, 1]
    t, h = est.counts(_chain_visits(0, 3))
    assert t.tolist() == [1, 0] and h.tolist() == [0, 0]


def test_re_ranking_is_the_brute_force_best_and_flips_a_close_call():
    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    ad = PlanAdapter.of_plan(plan, every=2, window=8)
    assert ad.ranges == tuple((1 if i == 0 else r.lo, r.hi, r.setting.draft_tokens) for i, r in enumerate(plan.ranges))
    assert ad.rank(ChainValue(_acc(), 6).g) == ad.ranges  # the prior ranks as the plan solved
    for g in ([1.0] * 7, list(1 + np.arange(7.0)), [1, 1.95, 2.5, 2.9, 3.1, 3.2, 3.25]):
        want = []
        for c in ad.candidates:
            rates = {k: g[k] * lf / ms for k, ms, lf in zip(c.ks, c.step_ms, c.length_factor)}
            want.append((c.batch, max(rates, key=lambda k: (rates[k], -k))))
        got = ad.rank(g)
        assert got == tuple((1 if i == 0 else lo, hi, k) for i, (lo, hi, k) in enumerate(merge_ranges(want, 64)))
    assert ad.rank([1.0] * 7) == ((1, 64, 0),)  # nothing accepted: plain decoding everywhere
    assert ad.rank(list(1 + np.arange(7.0)))[0][2] == 6  # everything accepted: the longest chain at batch 1
    # every draft of the run rejected: after two steps the plan re-ranks to plain decoding everywhere
    assert ad.end_step([_chain_visits(0, 6)] * 8) is None
    assert ad.end_step([_chain_visits(0, 6)] * 8) == ((1, 64, 0),)
    assert ad.log[-1].changed and ad.log[-1].step == 2 and ad.log[-1].trials[0] == 16
    assert ad.report()["final_ranges"] == [[1, 64, 0]]
    ad.reset()
    assert ad.ranges == ad.initial and ad.log == []


def test_plain_waits_for_its_probe_and_failed_probes_back_off():
    # one batch size, K = 0..2 at 10 / 12 / 14 ms; the prior (h = 0.7) ranks K = 2 first
    ad = PlanAdapter([PlanCandidates(1, (0, 1, 2), (10.0, 12.0, 14.0), (1.0, 1.0, 1.0))], [1.0, 1.7, 2.19],
                     [(1, 1, 2)], every=2, window=4, prior_weight=1.0)
    reject, accept, plain = [_chain_visits(0, 2)], [_chain_visits(2, 2)], []
    assert ad.end_step(reject, 2, 1) is None
    assert ad.end_step(reject, 2, 1) == ((1, 1, 0),)  # 2 trials, no hit: plain decoding
    for _ in range(3):  # plain steps 3-5: no re-ranking while the plain batch size waits (nothing new measured)
        assert ad.end_step(plain, 0, 1) is None
    assert len(ad.log) == 1
    assert ad.end_step(plain, 0, 1) == ((1, 1, 2),)  # step 6: 4 plain steps, the window drained: the probe
    assert (ad.log[-1].reason, ad.log[-1].step, ad.backoff) == ("probe", 6, 1)
    ad.end_step(reject, 2, 1)
    assert ad.end_step(reject, 2, 1) == ((1, 1, 0),)  # the probe's drafts rejected: plain again, twice the wait
    assert (ad.log[-1].reason, ad.backoff) == ("probe failed", 2)
    for _ in range(7):  # steps 9-15: 7 plain steps of the 8 the wait now lasts
        assert ad.end_step(plain, 0, 1) is None
    assert ad.end_step(plain, 0, 1) == ((1, 1, 2),) and ad.log[-1].reason == "probe"
    ad.end_step(accept, 2, 1)
    assert ad.end_step(accept, 2, 1) is None  # the probe's drafts accepted: the chain stays, on trial
    assert (ad.log[-1].reason, ad.backoff) == ("probe on trial", 2)
    ad.end_step(accept, 2, 1)
    assert ad.end_step(accept, 2, 1) is None  # it held a whole window (4 steps): passed, the wait is reset
    assert (ad.log[-1].reason, ad.backoff, ad.ranges) == ("probe passed", 1, ((1, 1, 2),))
    rep = ad.report()
    assert rep["probes"] == 2 and rep["backoff"] == 1 and [r["reason"] for r in rep["resolves"]] == [
        "scheduled", "probe", "probe failed", "probe", "probe on trial", "probe passed"]
    # a plain batch size re-ranks on schedule when other rows measured something since the last ranking
    ad = PlanAdapter([PlanCandidates(1, (0, 1), (10.0, 12.0), (1.0, 1.0)),
                      PlanCandidates(2, (0, 1), (10.0, 16.0), (1.0, 1.0))], [1.0, 1.7], [(1, 1, 1), (2, 2, 0)],
                     every=2, window=64, prior_weight=1.0)
    ad.end_step(accept * 2, 1, 1)
    ad.end_step(plain, 0, 2)
    assert ad.log[-1].reason == "scheduled" and ad.ranges == ((1, 2, 1),)  # batch 2 drafts now: h ~0.96
    # without the batch size (the adapter alone), every ``every`` steps as before
    ad.reset()
    for _ in range(4):
        ad.end_step(plain, 0)
    assert [(r.step, r.reason) for r in ad.log] == [(2, "scheduled"), (4, "scheduled")]


def test_plan_file_round_trip_and_refusals(tmp_path):
    plan = solve_plan(ChainValue(_acc(), 6), PROFILE, output_tokens=16)
    doc = plan_document(plan, engine="treeopt")
    path = save_schedule(tmp_path / "p.yaml", doc)
    loaded = yaml.safe_load(path.read_text())
    a, b = PlanAdapter.of_plan(plan), PlanAdapter.of_document(loaded, str(path))
    assert a.ranges == b.ranges and a.ks == b.ks == tuple(range(7))
    for ca, cb in zip(a.candidates, b.candidates, strict=True):
        assert ca.batch == cb.batch and ca.ks == cb.ks
        np.testing.assert_allclose(cb.step_ms, ca.step_ms, rtol=1e-5)
        np.testing.assert_allclose(cb.length_factor, ca.length_factor, rtol=1e-5)
    np.testing.assert_allclose(b.estimate.g(), a.estimate.g(), rtol=1e-5)
    with pytest.raises(ProfileError, match="no by_batch candidates"):
        PlanAdapter.of_document({k: v for k, v in loaded.items() if k != "by_batch"})
    bad = yaml.safe_load(path.read_text())
    bad["by_batch"][0]["candidates"][0]["setting"] = "envelope:3x2x6"
    with pytest.raises(ProfileError, match="is not one"):
        PlanAdapter.of_document(bad)
    bad = yaml.safe_load(path.read_text())
    bad["by_batch"][1]["candidates"][0]["step_ms"] = -1
    with pytest.raises(ProfileError, match=r"by_batch\[1\].candidates\[0\]: step_ms"):
        PlanAdapter.of_document(bad)
    bad = yaml.safe_load(path.read_text())
    del bad["by_batch"][0]["candidates"][0]["length_factor"]  # a plan from before tune priced answer lengths
    with pytest.raises(ProfileError, match=r"by_batch\[0\].candidates\[0\] lacks length_factor: a plan written "
                                           r"before .* re-run treeopt tune --schedule FILE"):
        PlanAdapter.of_document(bad)
    bad = yaml.safe_load(path.read_text())
    bad["by_batch"][1]["candidates"] = [c for c in bad["by_batch"][1]["candidates"] if c["setting"] != "chain:2"]
    with pytest.raises(ProfileError, match="scores draft lengths .0, 1, 3, 4, 5, 6., not every K from 0 to 6"):
        PlanAdapter.of_document(bad)


def _tiny_draft():
    """A drafter over a tiny model (the policy is built, not run)."""
    from test_decoding import _model

    return _model(0)


def test_adaptive_schedule_from_the_registry(tmp_path):
    from sequoia_opt.drafting.registry import parse_policy

    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    path = save_schedule(tmp_path / "p.yaml", plan_document(plan, engine="treeopt"))
    kind, opts = parse_policy(f"adaptive-schedule:{path}")
    assert kind.name == "adaptive-schedule" and kind.policy is AdaptiveSchedulePolicy
    with pytest.raises(TreeoptError, match="needs a treeopt-schedule/1 file"):
        parse_policy("adaptive-schedule")
    kind, opts = parse_policy(f"adaptive-schedule:{path},every=4,window=32,prior-weight=0.5")
    assert opts["live"] == {"every": 4, "window": 32, "prior_weight": 0.5}
    ad = kind.build(_tiny_draft(), None, opts).adapter
    assert (ad.every, ad.estimate.window, ad.estimate.prior_weight) == (4, 32, 0.5)
    for bad in ("every=0", "window=x", "prior-weight=-1", "step=3"):
        with pytest.raises(TreeoptError, match=f"'{bad}' is not every=N"):
            parse_policy(f"adaptive-schedule:{path},{bad}")
    with pytest.raises(TreeoptError, match="gives every twice"):  # it kept the last one without a word
        parse_policy(f"adaptive-schedule:{path},every=1,every=2")
    comma = save_schedule(tmp_path / "plan,v2.yaml", plan_document(plan, engine="treeopt"))  # a comma in the path
    assert parse_policy(f"adaptive-schedule:{comma}")[1]["source"] == str(comma)
    kind, opts = parse_policy(f"adaptive-schedule:{comma},window=16")
    assert opts["source"] == str(comma) and opts["live"] == {"window": 16}
    doc = yaml.safe_load(path.read_text())
    del doc["by_batch"]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="no by_batch candidates"):
        parse_policy(f"adaptive-schedule:{tmp_path / 'q.yaml'}")


def test_policy_switches_to_longer_chains_when_drafts_are_accepted_and_stays_exact():
    """A drafter equal to the target accepts every draft: the plan, solved for weak acceptance (h = 0.5 at every
    depth: K = 1 at batch 1-3, none at 4), re-ranks after 4 steps of chains of 1 (depth 1 accepted 8 of 8: the
    untried depths scaled by the live ratio) to K = 4 / K = 2, after 4 more (every depth seen) to K = 4 everywhere,
    and decodes exactly as plain decoding."""
    from test_decoding import _model, _perturbed

    from sequoia_opt.decoding import AutoregressiveDecoder, Decoder

    target = _model(0)
    draft = _perturbed(target, 0.0, seed=1)
    ks = (0, 1, 2, 3, 4)
    cands = [PlanCandidates(1, ks, (10.0, 13.0, 16.0, 19.0, 22.0), (1.0,) * 5),
             PlanCandidates(4, ks, (12.0, 20.0, 28.0, 36.0, 44.0), (1.0,) * 5)]
    prior = [1.0, 1.5, 1.75, 1.875, 1.9375]
    ad = PlanAdapter(cands, prior, [(1, 3, 1), (4, 4, 0)], every=4, window=16, prior_weight=2.0)
    pol = AdaptiveSchedulePolicy(draft, ad)
    assert pol.max_size == 5 and pol.max_depth == 4  # sized for the longest candidate, not the first ranges
    prompts = [[5, 17, 3], list(range(40, 52))]
    dec = Decoder(target, pol, max_len=128, max_batch=4)
    state = dec.start_batch(prompts, 40)
    while not state.finished:
        dec.step(state)
    for p, r in zip(prompts, state.results):
        assert r.tokens == AutoregressiveDecoder(target, max_len=128).generate(p, 40).tokens
    # step 4: rho = (8 + 2) / (8 x 0.5 + 2), G = 1, 1.967, 2.772, 3.444, 4.003: batch 1 K = 4, batch 4 K = 2
    assert ad.log[0].step == 4 and ad.log[0].ranges == ((1, 3, 4), (4, 4, 2))
    np.testing.assert_allclose(ad.log[0].tokens_per_step, [1.0, 1.96667, 2.77222, 3.44352, 4.00293], rtol=1e-4)
    assert ad.log[1].step == 8 and ad.log[1].ranges == ((1, 4, 4),) and ad.ranges == ((1, 4, 4),)
    assert ad.estimate.hits.tolist() == ad.estimate.trials.tolist() and ad.estimate.trials[3] > 0
    assert max(size for _, size in pol.used) == 5 and pol.used[0][1] == 2  # a chain of 1 first, then of 4


def test_the_predicted_tokens_per_step_are_the_chains_the_steps_ran_cut_at_an_answers_end():
    """A step near an answer's end drafts its chain cut to what the row can still emit: G of that chain is its
    prediction, not G(K) (a tryout: the same plan predicted 2.77 tokens/step as adaptive-schedule, 2.46 as
    schedule, with no re-ranking in the run)."""
    from test_decoding import _model, _perturbed

    from sequoia_opt.decoding import Decoder

    target = _model(0)
    draft = _perturbed(target, 0.0, seed=1)  # always accepted
    ks = (0, 1, 2, 3)
    cands = [PlanCandidates(1, ks, (10.0, 11.0, 12.0, 13.0), (1.0,) * 4)]
    prior = [1.0, 1.5, 1.75, 1.875]
    ad = PlanAdapter(cands, prior, [(1, 4, 3)], every=1000, window=16, prior_weight=2.0)
    pol = AdaptiveSchedulePolicy(draft, ad)
    res = Decoder(target, pol, max_len=128).generate([5, 17, 3], 10)
    assert [s.tree_depth for s in res.steps] == [3, 3, 1] and [s.accepted_len for s in res.steps] == [4, 4, 2]
    assert ad.log == [] and ad.predicted_tokens_per_step == pytest.approx((1.875 + 1.875 + 1.5) / 3, rel=1e-12)


def test_re_ranking_keeps_the_plans_min_gain_and_first_is_longest_rule(tmp_path):
    """A plan solved with min_gain or TensorRT-LLM's first-is-longest rule ranks its own prior as the solver did
    (the adapter applies both), from the plan and from its file."""
    prior = ChainValue(_acc(), 6)
    for kw in ({"min_gain": 0.9}, {"min_gain": 1.2}, {"first_is_longest": True}, {}):
        plan = solve_plan(prior, PROFILE, **kw)
        want = tuple((1 if i == 0 else r.lo, r.hi, r.setting.draft_tokens) for i, r in enumerate(plan.ranges))
        doc = yaml.safe_load(save_schedule(tmp_path / "p.yaml", plan_document(plan, engine="treeopt")).read_text())
        for ad in (PlanAdapter.of_plan(plan), PlanAdapter.of_document(doc)):
            assert ad.rank(prior.g) == want, kw
    assert want != PlanAdapter.of_plan(solve_plan(prior, PROFILE, min_gain=1.2)).initial  # the rules matter here
    # where TensorRT-LLM's rule binds (batch 1 drafts past its own best so that larger batch sizes may): the re-rank
    # chose the cap again from candidates the plan had already capped, and threw the plan away at its first re-rank
    for draft_ms in (5.0, 8.0):
        dear = _profile({1: _curve(0.1, 10.0, draft_ms=draft_ms), **{b: _curve(0.1, 10.0) for b in (2, 4, 8)}})
        plan = solve_plan(prior, dear, first_is_longest=True)
        assert any("engine's rule" in n for n in plan.notes) and plan.rows[0].best.setting.speculates
        want = tuple((1 if i == 0 else r.lo, r.hi, r.setting.draft_tokens) for i, r in enumerate(plan.ranges))
        doc = yaml.safe_load(save_schedule(tmp_path / "p.yaml", plan_document(plan, engine="tensorrt-llm")).read_text())
        for ad in (PlanAdapter.of_plan(plan), PlanAdapter.of_document(doc)):
            assert ad.rank(prior.g) == want, draft_ms
    assert PlanAdapter.of_plan(solve_plan(prior, PROFILE, min_gain=1.2)).rank(prior.g) == ((1, 64, 0),)


def test_a_given_schedule_scoring_only_its_own_settings_is_refused():
    from sequoia_opt.solver.schedule import SpecSetting, plan_from_ranges

    plan = plan_from_ranges([(1, 7, SpecSetting.chain(3)), (8, 64, SpecSetting.none())], ChainValue(_acc(), 6), PROFILE)
    with pytest.raises(ProfileError, match="scores draft lengths .0, 3., not every K from 0 to 3: re-ranking needs"):
        PlanAdapter.of_plan(plan)
    doc = plan_document(solve_plan(ChainValue(_acc(), 6), PROFILE), engine="treeopt")
    doc["ranges"][0]["batch_range"] = 3
    with pytest.raises(ProfileError, match=r"ranges\[0\].batch_range must be \[lo, hi\]"):
        PlanAdapter.of_document(doc)
    with pytest.raises(ProfileError, match="needs 7 entries"):
        PlanAdapter.of_plan(solve_plan(ChainValue(_acc(), 6), PROFILE)).rank([1.0, 1.5])


def test_the_registry_policy_runs_through_treeopt_runs_job(tmp_path):
    """``--policy adaptive-schedule:FILE`` as ``treeopt run`` builds it: exact, and its adaptation in the summary."""
    from test_decoding import _model, _perturbed

    from sequoia_opt.drafting.registry import parse_policy
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.tree import Tree

    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    path = save_schedule(tmp_path / "p.yaml", plan_document(plan, engine="treeopt"))
    kind, opts = parse_policy(f"adaptive-schedule:{path}")
    target = _model(0)
    draft = _perturbed(target, 0.3, seed=1)
    entry = TreeEntry("live", Tree.chain(2), policy=lambda d: kind.build(d, None, opts))
    report = run_trees(target, draft, [entry], [[5, 17, 3], list(range(40, 52))], max_new_tokens=24, warmup=False)
    assert report.greedy_ok
    live = next(s for s in report.summaries if s.tree == "live")
    ad = live.adaptive
    assert ad["initial_ranges"] == [[1 if i == 0 else r.lo, r.hi, r.setting.draft_tokens]
                                    for i, r in enumerate(plan.ranges)]
    assert ad["steps"] >= 8 and len(ad["resolves"]) == ad["steps"] // 16
    # batch 1 runs the first range's chain until the first re-ranking: its predicted G is the plan's there
    first_k = plan.ranges[0].setting.draft_tokens
    if not ad["resolves"]:
        assert live.predicted_tokens_per_step == pytest.approx(ChainValue(_acc(), 6).g[first_k], rel=1e-5)
    assert live.predicted_tokens_per_step >= 1.0
    from sequoia_opt.cli.run import _resolve_table  # treeopt run's report of adaptive entries reads it

    (_, _, rows), notes = _resolve_table(report)
    assert rows == [] and len(notes) == 1
    assert notes[0].startswith(f"live: {len(ad['resolves'])} re-rankings over {ad['steps']} steps")
    assert notes[0].count("K=") == len(ad["initial_ranges"]) + len(ad["final_ranges"])


def test_run_drafts_with_the_drafter_a_plan_names_when_no_draft_is_given(tmp_path):
    """A plan from `tune --draft lookup` run as `run --policy schedule:plan.yaml` drafted with the bundled draft
    model (and warned that the plan was solved for lookup): run now makes the plan's drafter where its name is
    enough (lookup, self:L, a bundled head); --draft still chooses; a checkpoint's label is no path: not taken."""
    import json

    from tiny_pair import make_pair
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    target, draft, prompts = make_pair(tmp_path)
    doc = plan_document(solve_plan(ChainValue(_acc(), 4), PROFILE), engine="treeopt")
    args = ["--target", str(target), "--prompts", str(prompts), "--num-prompts", "1", "--max-new-tokens", "6",
            "--results-dir", str(tmp_path), "--json"]
    for drafter, given, used in (("lookup:1-3", [], "lookup:1-3"), ("lookup:1-3", ["--draft", str(draft)], None),
                                 ("my-draft-model", ["--draft", str(draft)], None)):
        plan = save_schedule(tmp_path / "plan.yaml", {**doc, "drafter": drafter})
        r = CliRunner().invoke(app, ["run", "--policy", f"schedule:{plan}", *args, *given])
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        said = [n for n in out["notes"] if n.startswith("drafting with the plan's drafter")]
        assert said == ([f"drafting with the plan's drafter {used} (--draft to choose another)"] if used else [])
        mismatch = [w for w in out["warnings"] if "measured with draft" in w]
        assert bool(mismatch) == (used is None), out["warnings"]  # the plan's drafter, or a warning naming it
    # a plan's drafter that cannot run on this target is named as the plan's (it read as '--draft self:999')
    plan = save_schedule(tmp_path / "plan.yaml", {**doc, "drafter": "self:999"})
    r = CliRunner().invoke(app, ["run", "--policy", f"schedule:{plan}", *args])
    assert r.exit_code == 2 and f"{plan} names drafter self:999, which cannot run here: " in " ".join(r.output.split())
    # a hand-edited threads: one line naming the file
    for bad in ("abc", -1, 0, 1.5, True):
        plan = save_schedule(tmp_path / "plan.yaml", {**doc, "threads": bad})
        r = CliRunner().invoke(app, ["run", "--policy", f"schedule:{plan}", *args])
        assert r.exit_code == 2 and f"{plan}: threads = {bad!r}: the CPU threads" in " ".join(r.output.split()), \
            r.output


def test_a_plan_naming_the_bundled_head_by_its_label_drafts_with_it():
    """tune records a drafter by its label: the bundled head's is 'eagle3:treeopt-smollm2-eagle3', which names no
    path, so run drafted with the draft model (and warned); a plan saying 'eagle3' was run with the head but
    warned that the plan's 'eagle3' was another drafter than 'eagle3:treeopt-smollm2-eagle3'."""
    from sequoia_opt.cli.run import _plan_drafter
    from sequoia_opt.jobs.load import parse_drafter_spec

    head = parse_drafter_spec("eagle3")
    for name in ("eagle3", head.label):
        assert _plan_drafter(name) == head
    assert _plan_drafter("eagle3:another-head") is None and _plan_drafter("treeopt-smollm2-draft") is None


@pytest.mark.parametrize("kind", ["schedule", "adaptive-schedule"])
def test_treeopt_run_takes_a_plan_without_a_tree_file(tmp_path, kind):
    """``treeopt tune --schedule FILE`` then ``treeopt run --policy KIND:FILE``: the plan brings its own chains, so
    no --tree is asked for; its row is named after the file and equals plain decoding."""
    import json

    from tiny_pair import make_pair
    from typer.testing import CliRunner

    from sequoia_opt.cli import app

    target, draft, prompts = make_pair(tmp_path)
    plan = save_schedule(tmp_path / "tuned.yaml", plan_document(solve_plan(ChainValue(_acc(), 4), PROFILE),
                                                               engine="treeopt"))
    r = CliRunner().invoke(app, ["run", "--target", str(target), "--draft", str(draft), "--policy",
                                 f"{kind}:{plan}", "--prompts", str(prompts), "--num-prompts", "2",
                                 "--max-new-tokens", "12", "--results-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    by = {s["tree"]: s for s in doc["summaries"]}
    name = f"tuned ({kind})"
    assert set(by) == {"plain", name}
    row = by[name]
    assert row["mismatches"] == 0 and row["new_tokens"] == by["plain"]["new_tokens"] == 24
    assert row["tokens_per_step"] > 1.0 and row["steps"] < 24  # it speculated: the plan's chains, not plain decoding
    assert row["node_acceptance"] is None  # the chain changes with the batch: no fixed tree to check node by node
    if kind == "adaptive-schedule":
        assert row["adaptive"]["steps"] == row["steps"] and row["adaptive"]["initial_ranges"]
    else:
        assert row["adaptive"] is None
    assert not [w for w in doc["warnings"] if "was solved from profiles" in w]
    # the same plan solved for another pair and engine: each difference named, the run still made
    other = load_schedule(plan).doc | {"target": "another-model", "drafter": "another-draft", "engine": "vllm",
                                       "threads": 999}  # T(b, n) timed on other CPU threads than this run's
    other_plan = save_schedule(tmp_path / "other.yaml", other)
    r = CliRunner().invoke(app, ["run", "--target", str(target), "--draft", str(draft), "--policy",
                                 f"{kind}:{other_plan}", "--prompts", str(prompts), "--num-prompts", "1",
                                 "--max-new-tokens", "4", "--results-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    warned = [w for w in json.loads(r.stdout)["warnings"] if "was solved from profiles" in w]
    assert [w.split(" measured with ")[1].split(",")[0] for w in warned] == [
        "target 'another-model'", "draft 'another-draft'", "engine 'vllm'", "threads 999"]
    assert all(w.startswith(f"tree 'other ({kind})'") for w in warned)
    r = CliRunner().invoke(app, ["run", "--target", str(target), "--draft", str(draft), "--policy", f"{kind}:{plan}",
                                 "--compare", "-a", str(plan)])
    assert r.exit_code == 2 and "does not combine with --compare" in r.output


@pytest.mark.parametrize("change,message", [
    (lambda d: d["ranges"][0]["setting"].update(draft_tokens=20), "runs chain:20 at batch size 1, where 'by_batch' scored only"),
    (lambda d: d.update(min_gain="abc"), "min_gain must be a number >= 0, got 'abc'"),
    (lambda d: d.update(min_gain=-0.5), "min_gain must be a number >= 0, got -0.5"),
    (lambda d: d.update(first_is_longest="no"), "first_is_longest must be true or false, got 'no'"),
    (lambda d: d["by_batch"].reverse(), "batch sizes must be distinct and ascending"),
])
def test_an_adaptive_plan_file_with_bad_fields_is_refused_naming_the_file(tmp_path, change, message):
    """Fields the ranking reads are checked when the policy is parsed (before any model loads): a range's K past
    the candidates was a KeyError mid-run, a text min_gain a ValueError; each error names the file."""
    from sequoia_opt.drafting.registry import parse_policy

    doc = plan_document(solve_plan(ChainValue(_acc(), 6), PROFILE), engine="treeopt")
    change(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(TreeoptError) as err:
        parse_policy(f"adaptive-schedule:{path}")
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)
