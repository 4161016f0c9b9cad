"""Acceptance / latency profile schemas: round-trips, interpolation, refusals and clear errors."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from sequoia_opt.errors import ProfileError, SolverError
from sequoia_opt.profiles import (
    AcceptanceProfile,
    LatencyCurve,
    load_acceptance,
    load_latency,
    save_acceptance,
    save_latency,
    validate_acceptance,
    warn_on_mismatch,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "profiles" / "example"

LAT = {
    "format": "treeopt-latency/1",
    "device": {"name": "dev", "dtype": "float16"},
    "model": {"target": "T", "draft": "D"},
    "step_overhead_ms": 0.5,
    "curves": [
        {
            "context_tokens": 100,
            "target": {"tokens": [1, 10, 100], "target_forward_ms": [10.0, 10.0, 100.0]},
            "draft": {"tokens": [1, 10], "draft_forward_ms": [1.0, 2.0]},
        },
        {
            "context_tokens": 300,
            "target": {"tokens": [1, 10, 100], "target_forward_ms": [20.0, 20.0, 200.0]},
            "draft": {"tokens": [1, 10], "draft_forward_ms": [2.0, 4.0]},
        },
    ],
}


def test_example_profiles_load_and_are_labelled():
    a = load_acceptance(EXAMPLES / "acceptance.yaml")
    lat = load_latency(EXAMPLES / "latency.yaml")
    assert a.example and lat.example
    assert a.width == 8 and 0 < a.acceptance.sum() <= 1
    assert lat.target_ms(1) == pytest.approx(22.0)
    assert lat.target_ms(64) == pytest.approx(22.0) and lat.target_ms(128) == pytest.approx(22.0 + 0.12 * 64)


def test_latency_interpolation_and_refusal():
    c = LatencyCurve.from_dict(LAT)
    assert c.target_ms(55) == pytest.approx(55.0)  # halfway 10 -> 100 tokens
    assert c.target_ms(55, context=300) == pytest.approx(110.0)
    assert c.target_ms(55, context=200) == pytest.approx(82.5)  # halfway between contexts
    with pytest.raises(ProfileError, match="context 50 tokens is below the smallest measured context 100"):
        c.target_ms(10, context=50)  # was read at 100 tokens of context while callers reported 50
    assert type(c.target_ms(55, context=200)) is float  # plain floats: YAML writes them (np.float64 not)
    assert c.draft_ms(5.5) == pytest.approx(1.5)
    with pytest.raises(ProfileError, match="largest measured count 100"):
        c.target_ms(101)
    with pytest.raises(ProfileError, match="draft forward"):
        c.draft_ms(11)
    with pytest.raises(ProfileError, match="context 400"):
        c.target_ms(5, context=400)
    assert c.max_target_tokens() == 100 and c.max_draft_tokens() == 10


def test_latency_round_trip(tmp_path):
    c = LatencyCurve.from_dict(LAT, default_id="lat")
    path = save_latency(tmp_path / "lat.yaml", c)
    back = load_latency(path)
    assert back.id == "lat"
    assert back.to_dict() == c.to_dict()
    assert back.target_ms(37, context=250) == c.target_ms(37, context=250)
    assert not list(tmp_path.glob(".*.tmp"))


def test_latency_date_survives_a_save_and_a_load(tmp_path):
    """The date a latency profile was measured (``date``, which ``build_latency_profile`` writes and the format reads)
    is kept through a save and a load, in YAML and JSON; a hand-written unquoted date (a YAML timestamp) reads as
    its ISO text."""
    c = LatencyCurve.from_dict({**LAT, "date": "2026-11-29T19:00:00+00:00"}, default_id="lat")
    assert c.date == "2026-11-29T19:00:00+00:00"
    for name in ("lat.yaml", "lat.json"):
        back = load_latency(save_latency(tmp_path / name, c))
        assert back.date == "2026-11-29T19:00:00+00:00" and back.to_dict() == c.to_dict()
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump({**LAT, "date": "x"}).replace("date: x",
                                                                                      "date: 2026-11-29 19:00:00"))
    assert load_latency(tmp_path / "hand.yaml").date == "2026-11-29T19:00:00"
    assert "date" not in LatencyCurve.from_dict(LAT).to_dict()  # an older file without one is written without one


def test_acceptance_round_trip_and_wilson_interval(tmp_path):
    prof = AcceptanceProfile(
        id="pair", acceptance=np.array([0.5, 0.25]), counts=np.array([50, 25, 25]), measured={"mode": "greedy"}
    )
    back = load_acceptance(save_acceptance(tmp_path / "a.yaml", prof))
    assert back.id == "pair" and back.num_samples == 100
    np.testing.assert_array_equal(back.acceptance, [0.5, 0.25])
    ci = back.confidence_interval()
    assert ci.shape == (2, 2)
    # Wilson 95 % for 50/100: 0.4038 .. 0.5962
    assert ci[0] == pytest.approx([0.40383, 0.59617], abs=1e-4)
    assert ci[1, 0] < 0.25 < ci[1, 1]
    with pytest.raises(ProfileError, match="no counts"):
        AcceptanceProfile(id="x", acceptance=np.array([0.5])).confidence_interval()


def test_all_rejected_is_the_share_of_trials_not_one_minus_a_float_sum():
    """profile acceptance printed 'all rejected 1.11e-16' for a profile in which every trial accepted: 1 minus a
    float sum of the p_k. The share comes from the counts (exactly 0 there), and without counts is floored at 0."""
    p = np.array([0.7, 0.2, 0.1])  # sums to 0.9999999999999999 in floats
    assert 1 - p.sum() > 0
    assert AcceptanceProfile(id="a", acceptance=p, counts=np.array([7, 2, 1, 0])).all_rejected == 0.0
    assert AcceptanceProfile(id="a", acceptance=np.array([0.5, 0.25]),
                             counts=np.array([50, 25, 25])).all_rejected == 0.25
    over = np.array([0.7, 0.2, 0.1 + 1e-15])  # no counts, a float sum past 1: not a negative share
    assert 1 - over.sum() < 0 and AcceptanceProfile(id="a", acceptance=over).all_rejected == 0.0
    assert AcceptanceProfile(id="a", acceptance=np.array([0.5, 0.2])).all_rejected == pytest.approx(0.3)


def test_id_defaults_to_file_stem(tmp_path):
    p = tmp_path / "my-pair.yaml"
    p.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "acceptance": [0.4]}))
    assert load_acceptance(p).id == "my-pair"


@pytest.mark.parametrize(
    "vec, match",
    [([], "empty"), ([0.1, float("nan")], "p_2"), ([-0.1], "negative"), ([0.6, 0.6], "sums to 1.2"), ("0.5", "list")],
)
def test_validate_acceptance(vec, match):
    with pytest.raises(SolverError, match=match):
        validate_acceptance(vec)
    with pytest.raises(ProfileError, match=match):
        validate_acceptance(vec, error=ProfileError)


def test_validate_acceptance_allows_rounding():
    assert validate_acceptance([0.5, 0.5 + 1e-9]).shape == (2,)


def _mutate(fn):
    d = copy.deepcopy(LAT)
    fn(d)
    return d


@pytest.mark.parametrize(
    "doc, match",
    [
        (_mutate(lambda d: d.update(format="treeopt-latency/2")), "version"),
        (_mutate(lambda d: d.update(format="something")), "expected 'treeopt-latency/1'"),
        (_mutate(lambda d: d.pop("step_overhead_ms")), "step_overhead_ms"),
        (_mutate(lambda d: d.update(step_overhead_ms=-1)), "non-negative"),
        (_mutate(lambda d: d["curves"][0]["target"].update(target_forward_ms=[1.0, float("nan"), 2.0])), "finite"),
        (_mutate(lambda d: d["curves"][0]["target"].update(target_forward_ms=[1.0, -2.0, 2.0])), "non-negative"),
        (_mutate(lambda d: d["curves"][0].update(target={"tokens": [1, 10, 100], "target_forward_s": [1, 2, 3]})), "unsupported unit"),
        (_mutate(lambda d: d["curves"][0]["target"].update(tokens=[1, 1, 100])), "strictly increasing"),
        (_mutate(lambda d: d["curves"][0]["target"].update(tokens=[1, 10])), "as long as tokens"),
        (_mutate(lambda d: d["curves"][1].update(context_tokens=50)), "context_tokens must be strictly increasing"),
        (_mutate(lambda d: d["curves"][0].pop("draft")), "draft"),
        (_mutate(lambda d: d.update(curves=[])), "non-empty"),
        (_mutate(lambda d: d["curves"][0]["target"].update(target_forward_ms=[0.0, 0.0, 0.0])), "must be positive"),
        (_mutate(lambda d: d.update(example="no")), "'example' must be true or false"),
    ],
)
def test_bad_latency_profiles(doc, match):
    with pytest.raises(ProfileError, match=match):
        LatencyCurve.from_dict(doc)


@pytest.mark.parametrize(
    "doc, match",
    [
        ({"format": "treeopt-acceptance/9", "acceptance": [0.5]}, "version"),
        ({"format": "treeopt-acceptance/1"}, "missing key 'acceptance'"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "counts": [1, 2, 3]}, "K \\+ 1 = 2"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "counts": [9, 1]}, "disagrees with counts"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"mode": "beam"}}, "mode"),
        # the sizes a profile states are checked against its data
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5, 0.2, 0.1], "measured": {"width": 8}},
         "measured.width is 8 but 'acceptance' has 3 entries"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "counts": [5, 5], "measured": {"num_samples": 11}},
         "measured.num_samples is 11 but 'counts' sum to 10"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5, 0.2], "acceptance_by_depth": {1: [0.5]}},
         "acceptance_by_depth\\[1\\] has 1 entries but 'acceptance' has 2"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"width": "8"}},
         "measured.width = '8' must be a non-negative integer"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"mode": "greedy", "temperature": 0.7}},
         "measured.mode is 'greedy' but measured.temperature is 0.7"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"mode": "sampling", "temperature": 0}},
         "measured.mode is 'sampling' but measured.temperature is 0"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"top_p": 5}}, "top_p = 5 must be in"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "measured": {"tokens_per_step": -3}},
         "tokens_per_step = -3"),
        ({"format": "treeopt-acceptance/1", "acceptance": [0.5], "example": "false"},
         "'example' must be true or false, got 'false'"),
    ],
)
def test_bad_acceptance_profiles(doc, match):
    with pytest.raises(ProfileError, match=match):
        AcceptanceProfile.from_dict(doc)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        load_latency(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_acceptance(bad)
    cut = tmp_path / "cut.json"  # a JSON profile cut short is named as JSON (YAML reads it)
    cut.write_text('{"format": "treeopt-acceptance/1", "acceptance": [0.5')
    with pytest.raises(ProfileError, match="cut.json: not valid JSON"):
        load_acceptance(cut)
    for text, what in (("", "the file is empty"), ("# only a comment\n\n", "the file holds only comments")):
        bad.write_text(text)
        with pytest.raises(ProfileError, match=f"bad.yaml: {what} \\(expected an acceptance profile\\)"):
            load_acceptance(bad)


def test_warn_on_mismatch():
    c = LatencyCurve.from_dict(LAT)
    a = AcceptanceProfile(id="a", acceptance=np.array([0.5]), measured={"target": "T", "draft": "other"})
    assert warn_on_mismatch(latency=c, device="dev", dtype="float16", target="T", draft="D") == []
    w = warn_on_mismatch(acceptance=a, latency=c, device="H100", dtype="bfloat16")
    assert any("'dev'" in x and "'H100'" in x for x in w)
    assert any("bfloat16" in x for x in w)
    assert any("draft 'other' differs" in x for x in w)


def test_warn_on_mismatch_names_another_temperature_or_nucleus():
    """run --compare / --adapt took an -a profile measured at temperature 2.5, top-p 0.5 (or greedy) for a run at
    0.7 / 0.9 and re-predicted every tree from it without a word (tree files warned; the profiles did not)."""
    def acc(**m):
        return AcceptanceProfile(id="a", acceptance=np.array([0.5]), measured=m)

    sampled = acc(temperature=2.5, top_p=0.5)
    assert warn_on_mismatch(acceptance=sampled, temperature=0.7, top_p=0.9) == [
        "profile 'a' was measured with temperature 2.5, but this run uses 0.7: its acceptance (and what is predicted "
        "or solved from it) is another setting's",
        "profile 'a' was measured with top_p 0.5, but this run uses 0.9: its acceptance (and what is predicted or "
        "solved from it) is another setting's"]
    greedy = acc(temperature=0.0, top_p=0.5)  # a greedy profile's top_p is not read
    assert [w.split(":")[0] for w in warn_on_mismatch(acceptance=greedy, temperature=0.7, top_p=0.9)] == [
        "profile 'a' was measured with temperature 0, but this run uses 0.7"]
    assert warn_on_mismatch(acceptance=greedy, temperature=0.0, top_p=1.0) == []
    assert warn_on_mismatch(acceptance=acc(temperature=0.7, top_p=0.9), temperature=0.7, top_p=0.9) == []
    assert warn_on_mismatch(acceptance=acc(), temperature=0.7, top_p=0.9) == []  # a profile that does not say
    assert warn_on_mismatch(acceptance=sampled) == []  # a caller that does not say


def test_measured_differs_is_the_rule_the_warnings_follow():
    from sequoia_opt.profiles import measured_differs

    assert measured_differs("draft", " SmolLM ", "smollm") is False  # no case, no surrounding blanks
    assert measured_differs("draft", "a", "b") is True
    assert measured_differs("target", None, "b") is False and measured_differs("target", "a", None) is False
    assert measured_differs("device", "cpu", "AMD EPYC 7B13", "cpu") is False  # same_device's rule
    assert measured_differs("device", "cuda:0", "AMD EPYC 7B13", "cpu") is True


@pytest.mark.parametrize("recorded, name, kind, same", [
    ("cpu", "AMD EPYC 7B13", "cpu", True),          # a type recorded by an older acceptance profile
    ("cuda:0", "AMD EPYC 7B13", "cpu", False),
    ("cuda", "NVIDIA H200", "cuda", True),
    ("AMD EPYC 7B13", " amd epyc 7b13 ", "cpu", True),
    ("AMD EPYC 7B13", "NVIDIA H200", "cuda", False),
    ("cpu", "cuda:1", None, False),
    ("NVIDIA H200", "cuda", None, True),             # only a type known on this side: not told apart
])
def test_one_device_named_two_ways_is_one_device(recorded, name, kind, same):
    from sequoia_opt.profiles import same_device

    assert same_device(recorded, name, kind) is same
    a = AcceptanceProfile(id="a", acceptance=np.array([0.5]), measured={"device": recorded})
    w = warn_on_mismatch(acceptance=a, device=name, device_type=kind)
    assert w == ([] if same else [f"profile 'a' was measured with device {recorded!r}, but this run uses {name!r}"])


def test_stated_sizes_that_agree_load():
    prof = AcceptanceProfile.from_dict({"format": "treeopt-acceptance/1", "acceptance": [0.5, 0.25],
                                        "counts": [2, 1, 1], "measured": {"width": 2, "num_samples": 4},
                                        "acceptance_by_depth": {1: [0.5, 0.25]}})
    assert prof.width == 2 and prof.num_samples == 4 and prof.by_depth[1].tolist() == [0.5, 0.25]


# ---------------------------------------------------------------------------------------------- draft cost model


def test_latency_cost_model_defaults_to_per_level_and_round_trips(tmp_path):
    old = LatencyCurve.from_dict(LAT)  # written before the key existed
    assert old.cost_model == "per-level"
    assert all(c["draft"]["cost_model"] == "per-level" for c in old.to_dict()["curves"])  # saving writes it
    doc = copy.deepcopy(LAT)
    for cur in doc["curves"]:
        cur["draft"]["cost_model"] = "one-pass"
    c = LatencyCurve.from_dict(doc, default_id="heads")
    assert c.cost_model == "one-pass" and c.draft_ms(5.5) == pytest.approx(1.5)
    back = load_latency(save_latency(tmp_path / "heads.yaml", c))
    assert back.cost_model == "one-pass" and back.to_dict() == c.to_dict()
    assert yaml.safe_load((tmp_path / "heads.yaml").read_text())["curves"][1]["draft"]["cost_model"] == "one-pass"
    assert LatencyCurve.synthetic({1: 1.0}, {1: 1.0}, cost_model="one-pass").cost_model == "one-pass"


@pytest.mark.parametrize("first, second, match", [
    ("two-pass", None, r"curves\[0\]\.draft\.cost_model is 'two-pass'; expected one of per-level, one-pass"),
    ("one-pass", "per-level", r"curves\[1\]\.draft\.cost_model is 'per-level' but curves\[0\]'s is 'one-pass'"),
    (None, "one-pass", r"curves\[1\]\.draft\.cost_model is 'one-pass' but curves\[0\]'s is 'per-level'"),
])
def test_latency_cost_model_unknown_or_mixed_is_refused(first, second, match):
    doc = copy.deepcopy(LAT)
    for cur, value in zip(doc["curves"], (first, second)):
        if value is not None:
            cur["draft"]["cost_model"] = value
    with pytest.raises(ProfileError, match=match):
        LatencyCurve.from_dict(doc)


def test_latency_cost_model_unknown_is_refused_at_construction():
    with pytest.raises(ProfileError, match="draft.cost_model is 'x'"):
        LatencyCurve.synthetic({1: 1.0}, {1: 1.0}, cost_model="x")
    with pytest.raises(ProfileError, match="latency profile 'lat': draft cost_model is 'x'"):
        dataclasses.replace(LatencyCurve.from_dict(LAT, default_id="lat"), cost_model="x")
