"""Every loader refuses every number a file cannot hold (issue 32, fault 3b): hypothesis writes hostile numbers
(integers past int64, inf, NaN, any float, any integer) into each numeric field of a valid file of each format;
the loader either reads it or refuses it with one line naming the file (and, for a number no format takes,
the key), never a traceback. Through the CLI the same files exit 2 with one line. An implausible latency
curve loads with a warning naming its points."""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sequoia_opt.profiles.calibration import CalibrationProfile, RecordedStep, load_calibration
from sequoia_opt.cli import app
from sequoia_opt.drafting.policies import load_scheduler
from sequoia_opt.engines.llamacpp import parse_setting_file
from sequoia_opt.errors import ProfileWarning, TreeoptError
from sequoia_opt.exports import load_any_tree, load_dynamic_setting
from sequoia_opt.profiles import load_acceptance, load_latency, load_pair_acceptance
from sequoia_opt.profiles.batch import load_batch_latency
from sequoia_opt.solver.batch import load_plan
from sequoia_opt.tree import load_drafter_tree

NAN = math.nan
_TABLE = {"tokens": [1, 2, 4, 8], "target_forward_ms": [10.0, 10.5, 11.0, 13.0],
          "target_forward_spread_ms": [0.1, 0.1, 0.2, 0.3]}
_DRAFT = {"cost_model": "per-level", "tokens": [1, 2, 4], "draft_forward_ms": [1.0, 1.2, 1.5]}



def _curves(*contexts: int) -> list[dict]:
    """One curve per context, each with its own tables (no YAML aliases: one edit changes one field)."""
    return [{"context_tokens": c, "target": copy.deepcopy(_TABLE), "draft": copy.deepcopy(_DRAFT)} for c in contexts]


def _calibration() -> dict:
    def step(i):
        a = 0.05 * (i % 3)
        return RecordedStep(np.array([-1, 0, 0, 1, 1, 2, 2]), np.array([1, 0.7, 0.2, 0.6, 0.3, 0.5, 0.4]),
                            np.array([0, 0, 1, 0, 1, 0, 1]), np.array([1, 0.8 - a, 0.1, 0.5 + a, 0.3, 0.6, 0.2]),
                            np.array([1.0, 0.9, 1.1, NAN, NAN, NAN, NAN]))

    return CalibrationProfile("cal", {"target": "t", "draft": "d", "temperature": 0.0,
                                      "recording": {"steps": 2, "topk": 2}}, [step(i) for i in range(4)]).to_dict()


#: One valid document per format, its loader, and the file name it is written under.
SAMPLES = {
    "acceptance": (load_acceptance, "acc.yaml", {
        "format": "treeopt-acceptance/1", "id": "a",
        "measured": {"mode": "greedy", "temperature": 0.0, "top_p": 1.0, "width": 3, "num_samples": 20,
                     "num_prompts": 2, "steps": 8, "max_new_tokens": 16, "tokens_per_step": 1.5},
        "acceptance": [0.5, 0.2, 0.1], "counts": [10, 4, 2, 4],
        "acceptance_by_depth": {1: [0.5, 0.2, 0.1], 2: [0.6, 0.1, 0.1]}}),
    "latency": (load_latency, "lat.yaml", {
        "format": "treeopt-latency/1", "id": "l", "device": {"name": "cpu", "threads": 1},
        "step_overhead_ms": 0.5, "curves": _curves(16, 64)}),
    "pair": (load_pair_acceptance, "pair.yaml", {
        "format": "treeopt-acceptance-pair/1", "id": "p", "drafters": ["light", "strong"],
        "cost_models": ["one-pass", "per-level"],
        "measured": {"mode": "greedy", "temperature": 0.0, "top_p": 1.0, "depth": 2, "num_samples": 30},
        "light_width": 1, "strong_width": 2, "outcome_counts_by_depth": {1: [7, 4, 2, 2], 2: [5, 3, 1, 6]}}),
    "batch": (load_batch_latency, "batch.yaml", {
        "format": "treeopt-latency-batch/1", "id": "b", "device": {"name": "cpu"},
        "batches": [{"batch": 1, "step_overhead_ms": 0.5, "curves": _curves(16)},
                    {"batch": 4, "step_overhead_ms": 0.7, "curves": _curves(16)}]}),
    "calibration": (load_calibration, "cal.yaml", _calibration()),
    "tree": (load_any_tree, "tree.yaml", {
        "format": "treeopt-tree/1",
        "metadata": {"budget": 4, "max_depth": 2, "expected_tokens_per_step": 1.8, "predicted_speedup": 1.3},
        "nodes": [{"parent": -1, "rank": 0}, {"parent": 0, "rank": 0}, {"parent": 0, "rank": 1},
                  {"parent": 1, "rank": 0}]}),
    "graft tree": (load_drafter_tree, "graft.yaml", {
        "format": "treeopt-tree/2", "metadata": {"budget": 3, "max_depth": 1}, "drafters": ["light", "strong"],
        "nodes": [{"parent": -1, "rank": 0}, {"parent": 0, "rank": 0, "drafter": 0},
                  {"parent": 0, "rank": 1, "drafter": 1}]}),
    "scheduler": (load_scheduler, "sched.yaml", {
        "format": "treeopt-scheduler/1", "kind": "logistic", "pair": {"target": "t"},
        "features": ["light_conf_root", "light_conf_spine_mean", "light_conf_spine_min", "recent_accepted"],
        "weights": [-2.6, 5.4, -0.4, -0.2], "bias": -7.2, "threshold": 0.5, "card": {"samples": 352}}),
    "dynamic": (load_dynamic_setting, "dyn.yaml", {
        "format": "treeopt-dynamic/1", "setting": {"policy": "eagle", "steps": 2, "topk": 3, "budget": 4},
        "predicted": {"tokens_per_step": 1.7, "speedup": 1.4, "tokens_per_s": 18.8, "cost_ms": 90.3}}),
    "plan": (load_plan, "plan.json", {
        "format": "treeopt-batch-trees/1", "context_tokens": 128,
        "entries": [{"batch": 1, "batch_range": [1, 3], "nodes": 3, "depth": 1, "level_widths": [1, 2],
                     "expected_tokens_per_step": 1.7, "speedup": 1.3, "step_cost_ms": 50.0, "budget_limit": 8,
                     "choices": [[0], [1]]},
                    {"batch": 4, "batch_range": [4, 4], "nodes": 1, "depth": 0, "level_widths": [1],
                     "expected_tokens_per_step": 1.0, "speedup": 1.0, "step_cost_ms": 40.0, "budget_limit": 8,
                     "choices": []}]}),
}


def _numeric_paths(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _numeric_paths(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _numeric_paths(v, path + (i,))
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path


def _key(doc, path) -> str:
    """The key path as loaders name it: ``curves[0].target.tokens[3]`` (a mapping's key after a dot, a list's
    index in brackets: ``acceptance_by_depth.1[0]``)."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(doc, list) else (f".{k}" if out else str(k))
        doc = doc[k]
    return out


def _write(path: Path, doc) -> None:
    if path.suffix == ".json":
        path.write_text(json.dumps(doc))  # NaN and Infinity as Python's json writes them
    else:
        path.write_text(yaml.safe_dump(doc))


def _set(doc, path, value):
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


#: Per format, what the loaded sample must hold: a few fields read back against the document above.
READ_BACK = {
    "acceptance": lambda x: (x.acceptance.tolist(), x.counts.tolist(), x.by_depth[2].tolist())
    == ([0.5, 0.2, 0.1], [10, 4, 2, 4], [0.6, 0.1, 0.1]),
    "latency": lambda x: (list(x.contexts), x.target_ms(4, 16), x.target_ms(8, 64), x.draft_ms(2, 16), x.step_overhead_ms)
    == ([16, 64], 11.0, 13.0, 1.2, 0.5),
    "pair": lambda x: (x.drafters, x.light_width, x.strong_width, x.counts_by_depth[2].tolist())
    == (("light", "strong"), 1, 2, [5, 3, 1, 6]),
    "batch": lambda x: (x.batches, x.curve(4).step_overhead_ms, x.curve(1).target_ms(2, 16)) == ([1, 4], 0.7, 10.5),
    "calibration": lambda x: (len(x.steps), x.temperature) == (4, 0.0),
    "tree": lambda x: (x[0].parent, x[0].rank, x[1].budget) == ((-1, 0, 0, 1), (0, 0, 1, 0), 4),
    "graft tree": lambda x: (x[0].tree.parent, x[0].drafter, x[0].names) == ((-1, 0, 0), (0, 0, 1), ("light", "strong")),
    "scheduler": lambda x: (x.weights, x.bias, x.threshold) == ([-2.6, 5.4, -0.4, -0.2], -7.2, 0.5),
    "dynamic": lambda x: ((x[0].policy, x[0].steps, x[0].topk, x[0].budget), x[1]["predicted"]["speedup"])
    == (("eagle", 2, 3, 4), 1.4),
    "plan": lambda x: [(lo, hi, t.size) for lo, hi, t in x] == [(1, 3, 3), (4, 4, 1)],
}


def test_every_format_has_a_read_back_check():
    assert set(READ_BACK) == set(SAMPLES)


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_every_sample_loads(tmp_path, fmt):
    loader, name, doc = SAMPLES[fmt]
    _write(tmp_path / name, doc)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProfileWarning)
        loaded = loader(tmp_path / name)
    assert READ_BACK[fmt](loaded), f"{fmt}: the loaded file does not hold what was written"


HOSTILE = st.one_of(
    st.integers(min_value=2**63, max_value=10**40), st.integers(min_value=-10**40, max_value=-2**63 - 1),
    st.sampled_from([math.inf, -math.inf, NAN, 1e30, 2**53 + 1, 2**31, -1, 0, 1e-320]),
    st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-10**40, max_value=10**40))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(list(SAMPLES)), pick=st.integers(min_value=0), value=HOSTILE)
def test_a_hostile_number_in_any_field_is_read_or_refused_in_one_line(tmp_path, fmt, pick, value):
    loader, name, doc = SAMPLES[fmt]
    paths = list(_numeric_paths(doc))
    path = paths[pick % len(paths)]
    bad = copy.deepcopy(doc)
    _set(bad, path, value)
    f = tmp_path / name
    _write(f, bad)
    unholdable = (isinstance(value, float) and not math.isfinite(value)) or (
        isinstance(value, int) and not -2**63 <= value < 2**63)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileWarning)
            loader(f)
    except TreeoptError as err:
        msg = str(err)
        assert "\n" not in msg and str(f) in msg, msg
        if unholdable and not (f.suffix == ".json" and isinstance(value, float)):
            assert _key(doc, path) in msg, (path, msg)
        return
    assert not unholdable, f"{fmt}: {_key(doc, path)} = {value!r} was accepted"


@pytest.mark.parametrize("text, message", [
    ("--spec-draft-n-max inf", "--spec-draft-n-max inf is out of range (must be an integer in 0..2147483647)"),
    ("--spec-draft-n-max nan", "--spec-draft-n-max nan is out of range"),
    ("--spec-draft-n-max 1e30", "--spec-draft-n-max 1e30 is out of range"),
    ("--spec-draft-n-max 2.5", "--spec-draft-n-max 2.5 is out of range"),
    ("--spec-draft-n-max 4 --spec-draft-p-min inf", "--spec-draft-p-min inf is out of range (must be a number in"),
])
def test_llamacpp_setting_files_refuse_numbers_out_of_range(tmp_path, text, message):
    f = tmp_path / "flags.txt"
    f.write_text(text + "\n")
    with pytest.raises(TreeoptError, match="^" + str(f).replace(".", r"\.") + ": " + message.replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        parse_setting_file(f)


runner = CliRunner()


@pytest.mark.parametrize("fmt, edit, args, key", [
    ("acceptance", ("counts", 0), ["solve", "-a", "{f}"],
     "counts[0] = 1000000000000000000000000000000 does not fit a 64-bit integer"),
    ("acceptance", ("measured", "num_samples"), ["solve", "-a", "{f}", "--budget", "4"], "measured.num_samples"),
    ("latency", ("curves", 1, "context_tokens"), ["solve", "-a", "{acc}", "-l", "{f}"], "curves[1].context_tokens"),
    ("pair", ("outcome_counts_by_depth", 1, 0), ["solve", "--pair-acceptance", "{f}", "-a", "{acc}", "-a", "{acc}", "-l", "{lat}",
                                               "-l", "{lat}"],
     "outcome_counts_by_depth.1[0]"),
    ("batch", ("batches", 1, "curves", 0, "context_tokens"), ["solve", "--batch", "1,4", "-a", "{acc}", "-l", "{f}"],
     "batches[1].curves[0].context_tokens"),
    ("calibration", ("steps", 0, "parent", 1), ["solve", "--dynamic", "{f}", "-l", "{lat}"], "steps[0].parent[1]"),
    ("dynamic", ("setting", "steps"), ["run", "--dynamic", "{f}", "--target", "{tmp}/none"], "setting.steps"),
    ("tree", ("nodes", 1, "parent"), ["run", "--tree", "{f}", "--target", "{tmp}/none"], "nodes[1].parent"),
])
def test_the_cli_refuses_a_number_a_file_cannot_hold_in_one_line_exit_2(tmp_path, fmt, edit, args, key):
    """1e30 where an integer belongs (an int64 overflow: a traceback before)."""
    _, name, doc = SAMPLES[fmt]
    bad = copy.deepcopy(doc)
    _set(bad, edit, 10**30)
    f = tmp_path / name
    _write(f, bad)
    _write(tmp_path / "good-acc.yaml", SAMPLES["acceptance"][2])
    _write(tmp_path / "good-lat.yaml", SAMPLES["latency"][2])
    subst = {"{f}": str(f), "{acc}": str(tmp_path / "good-acc.yaml"), "{lat}": str(tmp_path / "good-lat.yaml")}
    argv = [subst.get(a, a.replace("{tmp}", str(tmp_path))) for a in args]
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(f) in lines[0], r.stderr
    assert key in lines[0], lines[0]
    assert "Traceback" not in r.output


@pytest.mark.parametrize("fmt, edit, value, message", [
    ("acceptance", ("counts", 0), 2**60, "counts[0] = 1152921504606846976 is out of range (at most 9007199254740992)"),
    ("latency", ("curves", 0, "context_tokens"), 2**40, "curves[0].context_tokens = 1099511627776 is out of range"),
    ("latency", ("curves", 0, "target", "target_forward_ms", 1), 1e300,
     "curves[0].target.target_forward_ms[1] = 1e+300 is out of range (at most 1e+09)"),
    ("pair", ("light_width",), 2**40, "light_width = 1099511627776 is out of range"),
    ("batch", ("batches", 0, "batch"), 2**40, "batches[0].batch = 1099511627776 is out of range"),
    ("calibration", ("measured", "recording", "steps"), 2.0, "measured.recording.steps = 2.0 must be an integer"),
    ("dynamic", ("setting", "topk"), 3.5, "topk must be an integer >= 1, got 3.5"),
    ("dynamic", ("setting", "budget"), 2**40, "budget = 1099511627776 is out of range"),
    ("tree", ("metadata", "budget"), 2**40, "metadata budget must be an integer in 0..2147483647 or null"),
    ("tree", ("metadata", "expected_tokens_per_step"), -1.0, "expected_tokens_per_step must be a number >= 1"),
    ("plan", ("entries", 0, "nodes"), 4, "entries[0].nodes is 4 but its choices give 3"),
    ("plan", ("entries", 0, "batch_range", 1), 2.5, "entries[0].batch_range = 2.5 must be an integer >= 1"),
])
def test_a_number_past_its_fields_range_is_refused_by_name(tmp_path, fmt, edit, value, message):
    """Within int64 and finite, yet out of the field's range (a count past 2**53, a context of 2**40 tokens,
    a float where an integer belongs): refused, naming the field."""
    loader, name, doc = SAMPLES[fmt]
    bad = copy.deepcopy(doc)
    _set(bad, edit, value)
    f = tmp_path / name
    _write(f, bad)
    with pytest.raises(TreeoptError) as err:
        loader(f)
    assert str(f) in str(err.value) and message in str(err.value), str(err.value)


def test_an_implausible_latency_curve_loads_with_a_warning_naming_its_points(tmp_path):
    """T(9..16) a third of T(1) (as the issue's profile): accepted silently before."""
    doc = copy.deepcopy(SAMPLES["latency"][2])
    doc["curves"] = [{"context_tokens": 16, "draft": copy.deepcopy(_DRAFT), "target": {
        "tokens": [1, 2, 4, 8, 9, 12, 16], "target_forward_ms": [30.0, 31.0, 33.0, 36.0, 10.0, 10.5, 11.0]}}]
    f = tmp_path / "lat.yaml"
    _write(f, doc)
    with pytest.warns(ProfileWarning) as rec:
        curve = load_latency(f)
    assert curve.target_ms(12) == 10.5  # loaded, as measured
    assert [str(w.message) for w in rec] == [
        f"{f}: T(9..16) = 10..11 ms is below 0.5 x T(1) (T(1) = 30 ms): an implausible target curve "
        "(noise or other load while profiling?); re-measure before trusting what is solved from it"]
    _write(tmp_path / "acc.yaml", SAMPLES["acceptance"][2])
    r = runner.invoke(app, ["solve", "-a", str(tmp_path / "acc.yaml"), "-l", str(f), "--budget", "16"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("warning: ") == 1 and "T(9..16) = 10..11 ms" in r.stderr


def test_saving_an_implausible_curve_warns_once_not_again_by_its_file_name(tmp_path):
    """profile latency said a noisy curve's implausible point twice (once by the profile's name, once by the file it
    was written to: save_latency validated by re-reading with the check on); its readers still say it."""
    from sequoia_opt.profiles import LatencyCurve, save_latency

    curve = LatencyCurve.synthetic({1: 10.0, 2: 1.0, 3: 10.5, 4: 11.0}, {1: 1.0, 2: 1.1})
    f = tmp_path / "lat.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_latency(f, curve)
    with pytest.warns(ProfileWarning) as rec:
        load_latency(f)
    assert [str(w.message).split(" (T(1)")[0] for w in rec] == [f"{f}: T(2) = 1 ms is below 0.5 x T(1)"]


def test_yaml_aliases_are_walked_once_and_a_self_reference_is_refused(tmp_path):
    """An alias inside its own anchor (``a: &a [*a]``) hung every loader for good (the number check walked the
    loop); nine levels of nested aliases (10^9 leaves expanded) ran for minutes. Now the loop is one line, exit 2,
    and the nested aliases are walked once each (a file that is otherwise an acceptance profile solves)."""
    from sequoia_opt._io import check_numbers

    loop = tmp_path / "loop.yaml"
    loop.write_text("format: treeopt-acceptance/1\nacceptance: [0.5]\na: &a [1, *a]\n")
    r = runner.invoke(app, ["solve", "-a", str(loop), "-n", "8"])
    assert r.exit_code == 2 and f"{loop}: a[1] refers to itself (a YAML alias inside its own anchor)" in r.output
    lines = ["format: treeopt-acceptance/1", "acceptance: [0.5, 0.2]", "a: &a [" + ", ".join(["1"] * 10) + "]"]
    lines += [f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdefgh", "bcdefghi")]
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text("\n".join(lines) + "\n")
    with pytest.warns(ProfileWarning) as caught:  # the anchors' keys are no acceptance profile's: each is named
        assert list(load_acceptance(laughs).acceptance) == [0.5, 0.2]
    assert [str(w.message).split(": ", 1)[1] for w in caught] == [f"unknown key {c!r}: ignored" for c in "abcdefghi"]
    shared = [1.0, math.inf]  # a list held by two keys is still checked (at the first key walked)
    with pytest.raises(TreeoptError, match=r"doc: (x|y)\[1\] is inf"):
        check_numbers({"x": shared, "y": shared}, "doc", TreeoptError)


def test_a_key_given_twice_is_refused_by_line(tmp_path):
    """PyYAML keeps a repeated key's last value: a hand-edited profile's first 'acceptance' was dropped in
    silence. The loaders now refuse it, naming the key and its line; YAML merges ('<<') still read."""
    from sequoia_opt._io import safe_load_yaml

    acc = tmp_path / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nacceptance: [0.5]\nacceptance: [0.9]\n")
    with pytest.raises(TreeoptError, match=r"acc.yaml: not valid YAML \(key 'acceptance' is given twice \(line 3\)\)"):
        load_acceptance(acc)
    tree = tmp_path / "tree.yaml"
    tree.write_text("format: treeopt-tree/1\nnodes:\n- {parent: -1, rank: 0, parent: 0}\n")
    with pytest.raises(TreeoptError, match=r"key 'parent' is given twice \(line 3\)"):
        load_any_tree(tree)
    assert safe_load_yaml("b: &b {x: 1}\nd: {<<: *b, y: 2}\n") == {"b": {"x": 1}, "d": {"x": 1, "y": 2}}
    acc.write_text("acceptance: [0.5]\n")  # said: format is None, expected 'treeopt-acceptance/1'
    with pytest.raises(TreeoptError, match=r"acc.yaml: no 'format' key \(expected format: treeopt-acceptance/1\)"):
        load_acceptance(acc)
