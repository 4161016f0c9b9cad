"""Calibration profiles (treeopt-calibration/1): the reliability table on hand-made recorded steps, the file
round trip and its refusals, the predictor of dynamic settings over recorded trees, the recorder on tiny
models, and the dynamic-setting exports."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from test_decoding import PROMPTS, _model, _perturbed

from sequoia_opt.profiles.calibration import (CALIBRATION_FORMAT, MIN_BIN_COUNT, CalibrationProfile, RecordedStep,
                                     load_calibration, save_calibration)
from sequoia_opt.drafting import ModelDrafter
from sequoia_opt.dynamic import DynamicSetting
from sequoia_opt.errors import ProfileError
from sequoia_opt.exports import DYNAMIC_FORMAT, ExportError, export_dynamic, load_dynamic_setting
from sequoia_opt.profiles import LatencyCurve
from sequoia_opt.profiling.calibration import build_calibration_profile, measure_calibration
from sequoia_opt.solver.dynamic import choose_dynamic, predict_setting, setting_grid

NAN = math.nan
EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)


def step(parent, prob, rank, accept, entropy=None) -> RecordedStep:
    n = len(parent)
    ent = [NAN] * n if entropy is None else entropy
    return RecordedStep(np.asarray(parent, dtype=np.int64), np.asarray(prob, dtype=np.float64),
                        np.asarray(rank, dtype=np.int64), np.asarray(accept, dtype=np.float64),
                        np.asarray(ent, dtype=np.float64))


# Two small trees. A: root -> 1 (q .8, a 1), 2 (q .1, a 0); 1 -> 3 (q .6, a 1), 4 (q .3, a 0).
# B: root -> 1 (q .9, a .5), 2 (q .05, a .25); 2 -> 3 (q .4, a .75).
def step_a() -> RecordedStep:
    return step([-1, 0, 0, 1, 1], [1, 0.8, 0.1, 0.6, 0.3], [0, 0, 1, 0, 1], [1, 1, 0, 1, 0], [1.2, 0.7, NAN, NAN, NAN])


def step_b() -> RecordedStep:
    return step([-1, 0, 0, 2], [1, 0.9, 0.05, 0.4], [0, 0, 1, 0], [1, 0.5, 0.25, 0.75], [0.9, NAN, 0.4, NAN])


def _profile(steps, edges=EDGES, **measured) -> CalibrationProfile:
    return CalibrationProfile("hand", {"target": "t", "draft": "d", **measured}, steps, edges)


# ---------------------------------------------------------------------------------------------- the tables
def test_the_reliability_table_adds_up_by_hand():
    prof = _profile([step_a(), step_b()])
    bins = prof.bins()
    # candidates (q, accept, weight = the parent's reach): A (.8, 1, 1) (.1, 0, 1) (.6, 1, 1) (.3, 0, 1);
    # B (.9, .5, 1) (.05, .25, 1) (.4, .75, .25): B's node 3 hangs under a parent reached with probability .25
    assert [(b["low"], b["high"], b["count"]) for b in bins] == [(0.0, 0.25, 2), (0.25, 0.5, 2), (0.5, 0.75, 1),
                                                                  (0.75, 1.0, 2)]
    assert [b["reached"] for b in bins] == pytest.approx([2, 1.25, 1, 2])
    assert [b["accepted"] for b in bins] == pytest.approx([0.25, 0.1875, 1.0, 1.5])
    assert [b["mean_draft_prob"] for b in bins] == pytest.approx([0.075, 0.4 / 1.25, 0.6, 0.85])
    assert [b["acceptance"] for b in bins] == pytest.approx([0.125, 0.15, 1.0, 0.75])
    for b in bins:
        assert 0 <= b["ci_low"] <= b["acceptance"] <= b["ci_high"] <= 1
    # Wilson at 1 of 1 accepted: the lower end is n / (n + z^2)
    assert bins[2]["ci_low"] == pytest.approx(1 / (1 + 1.959964 ** 2), abs=1e-6) and bins[2]["ci_high"] == 1.0

    ranks = prof.by_rank()
    assert [(r["rank"], r["count"]) for r in ranks] == [(0, 4), (1, 3)]
    assert [r["reached"] for r in ranks] == pytest.approx([3.25, 3])
    assert [r["accepted"] for r in ranks] == pytest.approx([2.6875, 0.25])
    assert [r["mean_draft_prob"] for r in ranks] == pytest.approx([2.4 / 3.25, 0.15], abs=1e-6)
    assert [r["acceptance"] for r in ranks] == pytest.approx([2.6875 / 3.25, 0.25 / 3], abs=1e-6)
    depths = prof.by_depth()
    assert [(r["depth"], r["count"]) for r in depths] == [(1, 4), (2, 3)]
    assert [r["reached"] for r in depths] == pytest.approx([4, 2.25])
    assert [r["accepted"] for r in depths] == pytest.approx([1.75, 1.1875])
    assert [r["mean_draft_prob"] for r in depths] == pytest.approx([0.4625, 1.0 / 2.25], abs=1e-6)

    non_root = sum(s.n - 1 for s in prof.steps)
    assert non_root == 7
    assert sum(b["count"] for b in bins) == sum(r["count"] for r in ranks) == sum(r["count"] for r in depths) == 7
    assert prof.to_dict()["candidates"] == 7
    assert sum(b["reached"] for b in bins) == sum(r["reached"] for r in ranks) == sum(r["reached"] for r in depths)
    # ECE = sum (reached / total) |acceptance - mean q| = (2 * .05 + 1.25 * .17 + 1 * .4 + 2 * .1) / 6.25
    assert prof.ece() == pytest.approx(0.9125 / 6.25, abs=1e-6)
    # the recording's shape, when measured does not say it: deepest level and most children
    assert prof.recording == {"steps": 2, "topk": 2}


def test_acceptance_of_interpolates_bins_with_enough_candidates_only():
    # every bin holds fewer than MIN_BIN_COUNT candidates: the curve is the (0, 0) anchor alone
    few = _profile([step_a(), step_b()])
    assert MIN_BIN_COUNT > 2
    assert few.acceptance_of(np.array([0.1, 0.5, 0.9])).tolist() == [0.0, 0.0, 0.0]
    # five copies: bins of 10, 10, 5, 10 candidates, reached 10, 6.25, 5, 10: the 6.25 and the 5 are left out
    prof = _profile([step_a(), step_b()] * 5)
    assert [b["count"] for b in prof.bins()] == [10, 10, 5, 10]
    assert [b["reached"] for b in prof.bins()] == pytest.approx([10, 6.25, 5, 10])
    assert MIN_BIN_COUNT == 10
    # points (0, 0), (.075, .125), (.85, .75)
    assert float(prof.acceptance_of(0.0375)) == pytest.approx(0.0625)
    assert float(prof.acceptance_of(0.2)) == pytest.approx(0.125 + 0.125 / 0.775 * 0.625)
    assert float(prof.acceptance_of(0.6)) == pytest.approx(0.125 + 0.525 / 0.775 * 0.625)  # not the left-out 1.0
    assert float(prof.acceptance_of(0.99)) == pytest.approx(0.75)  # held flat past the last point
    assert prof.ece() == pytest.approx(0.9125 / 6.25, abs=1e-6)  # copies change no fraction


def test_default_edges_place_boundary_probabilities_in_the_upper_bin():
    prof = CalibrationProfile("edges", {}, [step([-1, 0, 0, 0, 0], [1, 0.02, 0.2, 0.95, 1.0], [0, 0, 1, 2, 3],
                                                 [1, 0, 0, 0, 1])])
    counts = {(b["low"], b["high"]): b["count"] for b in prof.bins()}
    assert counts[(0.02, 0.05)] == 1 and counts[(0.2, 0.3)] == 1 and counts[(0.95, 1.0)] == 2
    assert counts[(0.0, 0.02)] == 0 and sum(counts.values()) == 4


def test_by_rank_keeps_a_rank_that_has_a_gap_before_it():
    # a node's candidates of rank 0 and 2 (rank 1 absent): the rows must say rank 2, not rank 1
    prof = _profile([step([-1, 0, 0], [1, 0.6, 0.1], [0, 0, 2], [1, 1, 0])])
    assert [(r["rank"], r["count"], r["mean_draft_prob"]) for r in prof.by_rank()] == [(0, 1, 0.6), (2, 1, 0.1)]


def test_by_rank_of_a_rank_near_the_file_limit_is_two_rows_at_once():
    # a file may hold any rank up to 2**31 - 1 (MAX_TOKENS): the table has a row per rank present, not per rank
    # below the largest (the fuzz test found a loader that looped 2**31 times over empty ranks)
    prof = _profile([step([-1, 0, 0], [1, 0.6, 0.1], [0, 0, 2**31 - 1], [1, 1, 0])])
    assert [(r["rank"], r["count"]) for r in prof.by_rank()] == [(0, 1), (2**31 - 1, 1)]


# ---------------------------------------------------------------------------------------------- the file
def test_save_load_round_trip_keeps_tables_and_steps(tmp_path):
    # a probability a hair under a bin edge rounds to the edge once stored: the tables must not change
    s = step([-1, 0, 0, 1], [1, 0.24999996, 0.7, 0.5], [0, 0, 1, 0], [1, 0.3, 0.6, 0.2], [1.5, 0.25, NAN, NAN])
    prof = _profile([s, step_a(), step_b()], temperature=1.0, recording={"steps": 2, "topk": 2})
    path = save_calibration(tmp_path / "cal.yaml", prof)
    back = load_calibration(path)
    assert back.id == "hand" and back.measured == prof.measured and back.edges == EDGES
    assert back.bins() == prof.bins() and back.by_rank() == prof.by_rank() and back.by_depth() == prof.by_depth()
    assert back.ece() == prof.ece()
    assert back.bins()[1]["count"] == 3  # 0.25 (was 0.24999996), 0.3, 0.4
    for a, b in zip(prof.steps, back.steps):
        assert a.parent.tolist() == b.parent.tolist() and a.rank.tolist() == b.rank.tolist()
        assert a.prob.tolist() == b.prob.tolist() and a.accept.tolist() == b.accept.tolist()
        assert np.array_equal(np.isnan(a.entropy), np.isnan(b.entropy))
        assert np.nan_to_num(a.entropy).tolist() == np.nan_to_num(b.entropy).tolist()
    doc = yaml.safe_load(path.read_text())
    assert doc["format"] == CALIBRATION_FORMAT and doc["candidates"] == 10
    assert doc["steps"][0]["entropy"] == [1.5, 0.25, None, None]


def _saved(tmp_path):
    path = save_calibration(tmp_path / "cal.yaml", _profile([step_a(), step_b()]))
    return path, yaml.safe_load(path.read_text())


def _write(path, doc):
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_file_whose_tables_disagree_with_its_steps_is_refused(tmp_path):
    path, doc = _saved(tmp_path)
    doc["bins"][0]["count"] = 5
    with pytest.raises(ProfileError, match=r"counts \[5, 2, 1, 2\] do not match the recorded steps' \[2, 2, 1, 2\]"):
        load_calibration(_write(path, doc))
    path, doc = _saved(tmp_path)
    doc["steps"] = doc["steps"][:1]  # a cut file: tables of two steps, one step left
    with pytest.raises(ProfileError, match="do not match"):
        load_calibration(_write(path, doc))
    for table in ("by_rank", "by_depth"):
        path, doc = _saved(tmp_path)
        doc[table][1]["count"] += 1
        with pytest.raises(ProfileError, match=table):
            load_calibration(_write(path, doc))


@pytest.mark.parametrize("fmt, message", [("treeopt-calibration/2", "version 'treeopt-calibration/2' is not supported"),
                                          ("treeopt-latency/1", "expected 'treeopt-calibration/1'")])
def test_another_format_or_version_is_refused(tmp_path, fmt, message):
    path, doc = _saved(tmp_path)
    doc["format"] = fmt
    with pytest.raises(ProfileError, match=message):
        load_calibration(_write(path, doc))


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.update(parent=[-1, 0, 3, 0]), "every parent before its children"),
    (lambda s: s.update(parent=[0, 0, 0, 2]), "root first"),
    (lambda s: s.update(prob=[1, 1.5, 0.05, 0.4]), r"probabilities in \[0, 1\]"),
    (lambda s: s.update(accept=[1, -0.1, 0.25, 0.75]), r"probabilities in \[0, 1\]"),
    (lambda s: s.update(rank=[0, 0]), "4 parents but 2 rank values"),
    (lambda s: s.pop("accept"), "needs parent, prob, rank, accept and entropy"),
], ids=["parent-after-child", "no-root", "prob-above-1", "negative-accept", "short-rank", "no-accept"])
def test_a_bad_step_is_refused(tmp_path, edit, message):
    path, doc = _saved(tmp_path)
    edit(doc["steps"][1])
    doc.pop("bins")  # the step itself must be refused, not the tables it changes
    with pytest.raises(ProfileError, match=message):
        load_calibration(_write(path, doc))


def test_a_profile_must_name_its_pair(tmp_path):
    path = save_calibration(tmp_path / "cal.yaml", _profile([step_a()]))
    doc = yaml.safe_load(path.read_text())
    for measured in (None, {}, {"target": "t"}):
        doc["measured"] = measured
        with pytest.raises(ProfileError, match="naming the target and the draft"):
            load_calibration(_write(path, doc))


def test_an_empty_dynamic_setting_file_says_so(tmp_path):
    empty = tmp_path / "dyn.yaml"
    empty.write_text("")
    with pytest.raises(ExportError, match="the file is empty"):
        load_dynamic_setting(empty)


def test_a_recording_that_contradicts_its_trees_is_refused(tmp_path):
    path = save_calibration(tmp_path / "cal.yaml", _profile([step_a(), step_b()], recording={"steps": 2, "topk": 2}))
    doc = yaml.safe_load(path.read_text())
    for bad, msg in (({"steps": 9, "topk": 9}, "says 9 levels of top-9, but the recorded trees are 2 levels deep"),
                     ({"steps": 2, "topk": 1}, "with up to 2 children per node"),
                     ({"steps": "two", "topk": 2}, "measured.recording.steps = 'two' must be an integer >= 1"),
                     ({"steps": 2}, "integer steps and topk")):
        doc["measured"]["recording"] = bad
        with pytest.raises(ProfileError, match=msg):
            load_calibration(_write(path, doc))


def test_a_profile_needs_steps_and_rising_edges():
    with pytest.raises(ProfileError, match="no recorded steps"):
        CalibrationProfile("x", {}, [])
    with pytest.raises(ProfileError, match="rise from 0 to 1"):
        CalibrationProfile("x", {}, [step_a()], (0.0, 0.5, 0.5, 1.0))


# ---------------------------------------------------------------------------------------------- predictor
# R: a recording of steps 2, topk 2 (both depth-1 nodes expanded):
# root -> 1 (q .7, a .8), 2 (q .2, a .1); 1 -> 3 (q .6, a .5), 4 (q .3, a .3); 2 -> 5 (q .5, a .6), 6 (q .4, a .2)
def step_r(entropy_at_leaves=False) -> RecordedStep:
    leaf = 0.5 if entropy_at_leaves else NAN
    return step([-1, 0, 0, 1, 1, 2, 2], [1, 0.7, 0.2, 0.6, 0.3, 0.5, 0.4], [0, 0, 1, 0, 1, 0, 1],
                [1, 0.8, 0.1, 0.5, 0.3, 0.6, 0.2], [1.0, 0.9, 1.1, leaf, leaf, leaf, leaf])


CURVE = LatencyCurve.synthetic({1: 10.0, 2: 11.0, 4: 13.0, 8: 17.0}, {1: 1.0, 2: 1.5, 4: 2.5}, step_overhead_ms=0.5)


@pytest.fixture(scope="module")
def replayed():
    # ten copies of R; reach-weighted bins: [0, .25) reached 10 (q .2, a .1); [.25, .5) reached 10 * (.8 + .1) = 9,
    # left out; [.5, .75) reached 19 (q .7, .6, .5; a .8, .5, .6; weights 1, .8, .1): mean q 1.23 / 1.9, acceptance
    # 1.26 / 1.9; curve points (0, 0), (.2, .1), (1.23 / 1.9, 1.26 / 1.9), flat after
    return _profile([step_r()] * 10, recording={"steps": 2, "topk": 2})


def test_predict_eagle_by_hand(replayed):
    a = replayed.acceptance_of
    x, y = 1.23 / 1.9, 1.26 / 1.9

    def line(q):
        return 0.1 + (q - 0.2) / (x - 0.2) * (y - 0.1)

    assert float(a(0.7)) == pytest.approx(y, abs=1e-6) and float(a(0.3)) == pytest.approx(line(0.3), abs=1e-6)
    # eagle s2 k2 n4: grows all 7 nodes (forwards of 1 and 2 nodes), keeps the 3 best paths: .7, .42, .21
    p = predict_setting(replayed, DynamicSetting("eagle", 2, 2, 4), CURVE)
    g = 1 + y + y * line(0.6) + y * line(0.3)
    assert p.tokens_per_step == pytest.approx(g, abs=1e-5)
    assert p.replay == pytest.approx(1 + 0.8 + 0.8 * 0.5 + 0.8 * 0.3)
    assert (p.tree_size, p.forwards, p.coverage) == (4, 2, 1.0)
    assert p.draft_ms == pytest.approx(1.0 + 1.5) and p.target_ms == pytest.approx(13.0)
    assert p.cost_ms == pytest.approx(2.5 + 13.0 + 0.5)
    assert p.tokens_per_s == pytest.approx(1000 * g / 16, rel=1e-5)
    assert p.speedup == pytest.approx(g * 10.5 / 16, rel=1e-5)  # plain: T(1) + overhead per token
    # eagle s1 k2 n3: the root's two children, one forward; T(3) interpolates to 12
    p = predict_setting(replayed, DynamicSetting("eagle", 1, 2, 3), CURVE)
    assert p.tokens_per_step == pytest.approx(1 + y + 0.1, abs=1e-5)
    assert p.replay == pytest.approx(1.9)
    assert (p.tree_size, p.forwards, p.draft_ms, p.target_ms) == (3, 1, 1.0, pytest.approx(12.0))


def test_coverage_counts_steps_where_the_rule_expanded_an_unrecorded_node():
    # steps 3: the third forward expands depth-2 nodes 3 and 4, which R never ran over
    setting = DynamicSetting("eagle", 3, 2, 6)
    assert predict_setting(_profile([step_r()]), setting, CURVE).coverage == 0.0
    # the same tree where the drafter did run over its leaves (and proposed nothing): covered
    assert predict_setting(_profile([step_r(), step_r(True)]), setting, CURVE).coverage == 0.5
    assert predict_setting(_profile([step_r()]), DynamicSetting("eagle", 2, 2, 6), CURVE).coverage == 1.0


def test_choose_dynamic_leaves_out_what_the_curve_did_not_measure(replayed):
    settings = [DynamicSetting("eagle", 1, 2, 3), DynamicSetting("eagle", 2, 2, 4), DynamicSetting("eagle", 2, 2, 12)]
    ch = choose_dynamic(replayed, CURVE, settings)
    assert sorted(r.label for r in ch.rows) == ["eagle:s1-k2-n3", "eagle:s2-k2-n4"]
    assert [r.tokens_per_s for r in ch.rows] == sorted((r.tokens_per_s for r in ch.rows), reverse=True)
    assert ch.notes == ["budgets [12] are past the latency profile's largest measured token count (8): left out "
                        "(T(n) is never extrapolated)"]
    # draft measured at width 1 only: the setting with a width-2 forward is left out, with a note
    narrow = LatencyCurve.synthetic({1: 10.0, 8: 17.0}, {1: 1.0})
    ch = choose_dynamic(replayed, narrow, settings[:2])
    assert [r.label for r in ch.rows] == ["eagle:s1-k2-n3"]
    assert ch.notes == ["1 setting(s) need draft forwards outside the measured 1..1 tokens: left out"]
    with pytest.raises(ProfileError, match="no dynamic setting could be scored"):
        choose_dynamic(replayed, narrow, [settings[1]])
    with pytest.raises(ProfileError, match="target up to 8 tokens"):
        choose_dynamic(replayed, CURVE, [settings[2]])


def test_setting_grid_stays_within_the_recording(replayed):
    grid = setting_grid(replayed, policies=("eagle",), budgets=(3, 4, 5, 6, 8), topks=(1, 2, 3))
    # topk 3 is past the recording's 2; eagle s2 k2 grows 7 nodes, s2 k1 3, s1 k2 3, s1 k1 2
    assert {(s.steps, s.topk, s.budget) for s in grid} == {(1, 2, 3), (2, 1, 3), (2, 2, 3), (2, 2, 4), (2, 2, 5),
                                                           (2, 2, 6)}
    assert all(s.steps <= 1 for s in setting_grid(replayed, max_steps=1))
    assert max(s.budget for s in setting_grid(replayed, max_budget=4)) == 4
    assert {s.policy for s in setting_grid(replayed)} == {"eagle", "entropy", "best-first"}
    # a deeper recording allows deeper settings
    deep = _profile([step_r()], recording={"steps": 4, "topk": 2})
    assert max(s.steps for s in setting_grid(deep)) == 4


# ---------------------------------------------------------------------------------------------- recorder
@pytest.fixture(scope="module")
def pair():
    target = _model(0)
    return target, _perturbed(target, 0.15, 2)


def _first_step_truth(target, draft, prompt, k, temperature):
    """The first step's root children as the models say: draft top-k (probabilities, tokens) and the
    target's distribution at the prompt's end."""
    with torch.inference_mode():
        q = draft(torch.tensor([prompt]))[0, -1].float().softmax(-1)
        p = target(torch.tensor([prompt]))[0, -1].float().softmax(-1)
    vals, toks = q.topk(k)
    h = float(-(q * q.clamp_min(1e-30).log()).sum())
    return vals.tolist(), toks.tolist(), p, h


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_measure_calibration_records_what_the_models_say(pair, temperature):
    target, draft = pair
    s, k = 2, 3
    all_steps = []
    for prompt in PROMPTS[1:3]:
        rec = measure_calibration(target, lambda: ModelDrafter(draft), [prompt], steps=s, topk=k, max_new_tokens=8,
                                  temperature=temperature, seed=3)
        assert rec, prompt
        all_steps += rec
        first = rec[0]
        vals, toks, p, h = _first_step_truth(target, draft, prompt, k, temperature)
        kids = first.children[0]
        assert [int(first.rank[c]) for c in kids] == list(range(k))
        assert [float(first.prob[c]) for c in kids] == pytest.approx(vals, abs=2e-6)
        assert float(first.entropy[0]) == pytest.approx(h, abs=2e-4)
        if temperature == 0:
            want = [float(t == int(p.argmax())) for t in toks]
        else:
            want = [float(p[t]) for t in toks]
        assert [float(first.accept[c]) for c in kids] == pytest.approx(want, abs=2e-6)
    for st in all_steps:
        assert st.n == 1 + k + (s - 1) * k * k  # the vocabulary (256) never limits k = 3
        assert int(st.depth.max()) == s and st.accept[0] == 1.0
        assert all(math.isnan(st.entropy[i]) == (st.depth[i] == s) for i in range(st.n))  # leaves not run over
        for kids in st.children:
            acc = st.accept[kids]
            if temperature == 0:
                assert set(acc.tolist()) <= {0.0, 1.0}
                assert acc.sum() <= 1  # the target's argmax is one token
            else:
                assert acc.sum() <= 1 + 1e-6  # the target's p of distinct tokens
    if temperature == 0:
        assert any(st.accept[1:].sum() > 0 for st in all_steps)  # the draft agrees sometimes
    prof = build_calibration_profile(all_steps, profile_id="tiny", target_name="t", draft_name="d",
                                     temperature=temperature, top_p=1.0, recording_steps=s, recording_topk=k)
    assert prof.recording == {"steps": s, "topk": k} and prof.temperature == temperature
    assert sum(b["count"] for b in prof.bins()) == len(all_steps) * (k + (s - 1) * k * k)


# ---------------------------------------------------------------------------------------------- exports
def test_export_dynamic_for_engines():
    s = DynamicSetting("eagle", 4, 3, 10)
    doc = json.loads(export_dynamic(s, "sglang").text)
    assert doc["speculative_num_steps"] == 4 and doc["speculative_eagle_topk"] == 3
    assert doc["speculative_num_draft_tokens"] == 10  # counts the root, as the budget does
    # SGLang's EAGLE loads the head from --speculative-draft-model-path: the flags name a stand-in, and warn
    assert doc["cli_flags"] == ("--speculative-algorithm EAGLE --speculative-draft-model-path <your EAGLE head> "
                                "--speculative-num-steps 4 --speculative-eagle-topk 3 --speculative-num-draft-tokens 10")
    assert doc["speculative_draft_model_path"] == "<your EAGLE head>"
    assert any("--speculative-draft-model-path" in w for w in export_dynamic(s, "sglang").warnings)
    cfg = yaml.safe_load(export_dynamic(s, "tensorrt-llm").text)["speculative_config"]
    assert cfg["decoding_type"] == "Eagle3" and cfg["use_dynamic_tree"] is True
    assert (cfg["max_draft_len"], cfg["dynamic_tree_max_topK"], cfg["max_total_draft_tokens"]) == (4, 3, 9)
    # the exact config: no eagle3_one_model (the dynamic tree is the one-model worker's; the 1.3.0rc27 / 1.4 strict
    # Eagle3DecodingConfig has no such field), the checkpoint under its current name speculative_model
    assert cfg == {"decoding_type": "Eagle3", "max_draft_len": 4, "speculative_model": "<your EAGLE-3 draft checkpoint>",
                   "use_dynamic_tree": True, "dynamic_tree_max_topK": 3, "max_total_draft_tokens": 9}
    # topk 1 is a chain: SGLang overrides the draft-token count, and the export says so
    notes = export_dynamic(DynamicSetting("eagle", 3, 1, 6), "sglang").notes
    assert any("num_steps + 1 = 4" in n for n in notes)


def test_dynamic_file_round_trip_and_refusals(tmp_path):
    s = DynamicSetting("best-first", 3, 4, 12)
    for fmt in ("yaml", "json"):
        e = export_dynamic(s, fmt, predicted={"tokens_per_step": 2.5}, provenance={"calibration_profile": "c"})
        path = tmp_path / f"d.{fmt}"
        path.write_text(e.text)
        got, doc = load_dynamic_setting(path)
        assert got == s and doc["format"] == DYNAMIC_FORMAT
        assert doc["predicted"] == {"tokens_per_step": 2.5} and doc["provenance"] == {"calibration_profile": "c"}
    for policy in ("entropy", "best-first"):
        for engine in ("sglang", "tensorrt-llm"):
            with pytest.raises(ExportError, match="EAGLE-2 re-ranking only"):
                export_dynamic(DynamicSetting(policy, 2, 2, 4), engine)
    for fmt in ("vllm", "medusa", "bogus"):
        with pytest.raises(ExportError, match="a dynamic setting exports as"):
            export_dynamic(s, fmt)
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: treeopt-tree/1\nnodes: []\n")
    with pytest.raises(ExportError, match="expected 'treeopt-dynamic/1'"):
        load_dynamic_setting(bad)
    bad.write_text(f"format: {DYNAMIC_FORMAT}\nsetting: {{policy: eagle, steps: 0, topk: 2, budget: 4}}\n")
    with pytest.raises(ExportError, match="steps must be an integer >= 1"):
        load_dynamic_setting(bad)
