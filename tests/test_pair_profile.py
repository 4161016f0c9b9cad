"""The acceptance pair profile (treeopt-acceptance-pair/1, issue 16): round trip, derived per-depth rows with
pooling, intervals, conversion to the graft value model, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from sequoia_opt.errors import ProfileError
from sequoia_opt.profiles import (
    PAIR_ACCEPTANCE_FORMAT,
    AcceptanceProfile,
    PairAcceptanceProfile,
    load_acceptance,
    load_pair_acceptance,
    save_pair_acceptance,
)
from sequoia_opt.solver.graft import GraftAcceptance, graft_expected_tokens
from sequoia_opt.tree import DrafterTree, Tree

# A = 2 light candidates, B = 2 strong conditional candidates; outcome order: light 0, light 1, strong 0,
# strong 1, none. Depths 3 and 4 have fewer than 30 trials.
COUNTS = {1: [40, 10, 20, 5, 25], 2: [30, 5, 8, 2, 5], 3: [10, 2, 3, 0, 5], 4: [5, 1, 1, 0, 3]}


def _doc(**over):
    doc = {
        "format": PAIR_ACCEPTANCE_FORMAT,
        "id": "lookup+big",
        "drafters": ["lookup:1-3", "big-draft"],
        "cost_models": ["per-level", "one-pass"],
        "measured": {"target": "t", "temperature": 0.0, "top_p": 1.0, "prompts": "p.jsonl",
                     "date": "2026-01-01T00:00:00+00:00"},
        "light_width": 2,
        "strong_width": 2,
        "outcome_counts_by_depth": {k: list(v) for k, v in COUNTS.items()},
    }
    doc.update(over)
    return doc


@pytest.fixture
def pair() -> PairAcceptanceProfile:
    return PairAcceptanceProfile.from_dict(_doc())


def test_round_trip(pair, tmp_path):
    path = save_pair_acceptance(tmp_path / "pair.yaml", pair)
    text = path.read_text()
    assert text.startswith("format: treeopt-acceptance-pair/1\n")
    assert "  1: [40, 10, 20, 5, 25]\n" in text
    got = load_pair_acceptance(path)
    assert got.to_dict() == pair.to_dict() == _doc()
    assert got.drafters == ("lookup:1-3", "big-draft") and got.cost_models == ("per-level", "one-pass")
    assert got.trials_by_depth == {1: 100, 2: 50, 3: 20, 4: 10}
    assert not list(tmp_path.glob(".*.tmp"))
    no_id = {k: v for k, v in _doc().items() if k != "id"}
    (tmp_path / "stem.yaml").write_text(yaml.safe_dump(no_id))
    assert load_pair_acceptance(tmp_path / "stem.yaml").id == "stem"


def test_rows_pool_sparse_depths(pair):
    assert pair.outcome_labels() == ["light 0", "light 1", "strong 0", "strong 1", "none"]
    # depths 1 and 2 keep their rows; 3 and 4 (20 and 10 trials) are pooled: [15, 3, 4, 0, 8] / 30
    assert pair.depth_counts().tolist() == [[40, 10, 20, 5, 25], [30, 5, 8, 2, 5], [15, 3, 4, 0, 8]]
    assert np.allclose(pair.light_rows(), [[0.4, 0.1], [0.6, 0.1], [0.5, 0.1]])
    assert np.allclose(pair.strong_rows(), [[0.2, 0.05], [0.16, 0.04], [4 / 30, 0.0]])
    assert pair.depth_counts(min_trials=60).tolist() == [[40, 10, 20, 5, 25], [45, 8, 12, 2, 13]]
    assert pair.depth_counts(min_trials=1000).tolist() == [[85, 18, 32, 7, 38]]  # one pooled row


def test_confidence_interval_matches_the_single_profile(pair):
    ci = pair.confidence_interval()
    assert ci.shape == (3, 4, 2)
    single = AcceptanceProfile(id="x", acceptance=np.array([0.4, 0.1, 0.2, 0.05]),
                               counts=np.array([40, 10, 20, 5, 25]))
    assert np.allclose(ci[0], single.confidence_interval())
    point = np.concatenate([pair.light_rows(), pair.strong_rows()], axis=1)  # (3, 4)
    assert np.all(ci[:, :, 0] <= point) and np.all(point <= ci[:, :, 1])
    lo, hi = ci[0, 0]
    assert lo < 0.4 < hi and hi - lo == pytest.approx(0.1885, abs=1e-3)  # Wilson, n = 100, p = 0.4


def test_pair_graft_acceptance(pair):
    from sequoia_opt.jobs.graft import pair_graft_acceptance

    alone = AcceptanceProfile(id="big", acceptance=np.array([0.6, 0.2]))
    acc = pair_graft_acceptance(pair, strong_alone=alone)
    assert isinstance(acc, GraftAcceptance)
    assert acc.keys == (0, 2) and acc.names == ("lookup:1-3", "big-draft")
    assert np.allclose(acc.light, pair.light_rows()) and np.allclose(acc.strong[2], pair.strong_rows())
    assert np.allclose(acc.strong[0], [[0.6, 0.2]])
    # root: two light children and one strong graft: 1 + 0.4 + 0.1 + 0.2
    t = DrafterTree(Tree(parent=[-1, 0, 0, 0], rank=[0, 0, 1, 2]), (0, 0, 0, 1), acc.names)
    assert graft_expected_tokens(t, acc) == pytest.approx(1.7)
    assert pair_graft_acceptance(pair).keys == (2,)
    # the light drafter's own rows replace the pair's when they form a valid model with the conditional rows
    light_alone = AcceptanceProfile(id="look", acceptance=np.array([0.3, 0.1]))
    own = pair_graft_acceptance(pair, light_alone=light_alone, names=("a", "b"))
    assert np.allclose(own.light, [[0.3, 0.1]]) and own.names == ("a", "b")


@pytest.mark.parametrize(
    "over, message",
    [
        ({"format": "treeopt-acceptance/1"}, "format is 'treeopt-acceptance/1', expected 'treeopt-acceptance-pair/1'"),
        ({"format": "treeopt-acceptance-pair/2"}, "format version 'treeopt-acceptance-pair/2' is not supported"),
        ({"outcome_counts_by_depth": {1: [1, 2, 3]}}, "must list A + B + 1 = 5 counts"),
        ({"outcome_counts_by_depth": {1: [1, 2, 3, -1, 0]}}, "outcome_counts_by_depth[1][3] = -1"),
        ({"outcome_counts_by_depth": {0: [1, 2, 3, 1, 0]}}, "key 0 must be a depth >= 1"),
        ({"outcome_counts_by_depth": {1: [0, 0, 0, 0, 0]}}, "every outcome count is zero"),
        ({"outcome_counts_by_depth": {}}, "must map depth"),
        ({"light_width": 0}, "light_width = 0 must be an integer >= 1"),
        ({"strong_width": 2.0}, "strong_width = 2.0"),
        ({"drafters": ["only-one"]}, "'drafters' must name two different drafters"),
        ({"drafters": ["a", "a"]}, "'drafters' must name two different drafters"),
        ({"cost_models": ["per-level", "magic"]}, "expected one of per-level, one-pass"),
        ({"cost_models": ["per-level"]}, "one cost model per drafter"),
        ({"measured": {"top_p": 1.5}}, "top_p = 1.5 must be in (0, 1]"),
        ({"measured": [1]}, "'measured' must be a mapping"),
        ({"id": 5}, "'id' must be a non-empty string"),
    ],
)
def test_refusals(over, message):
    with pytest.raises(ProfileError) as info:
        PairAcceptanceProfile.from_dict(_doc(**over), source="pair.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("pair.yaml: ") and "\n" not in str(info.value)


def test_refusals_of_files(tmp_path):
    doc = _doc()
    del doc["strong_width"]
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="missing key 'strong_width'"):
        load_pair_acceptance(tmp_path / "missing.yaml")
    with pytest.raises(ProfileError, match="cannot read"):
        load_pair_acceptance(tmp_path / "nope.yaml")
    (tmp_path / "pair.yaml").write_text(yaml.safe_dump(_doc()))
    with pytest.raises(ProfileError, match="format is 'treeopt-acceptance-pair/1', expected 'treeopt-acceptance/1'"):
        load_acceptance(tmp_path / "pair.yaml")  # the single-drafter reader refuses a pair profile


def test_an_empty_or_non_mapping_pair_profile_is_named_as_such(tmp_path):
    """An empty file used to read "a acceptance pair profile must be a YAML mapping with a 'format' key"."""
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ProfileError, match=r"empty.yaml: the file is empty \(expected an acceptance pair profile\)"):
        load_pair_acceptance(tmp_path / "empty.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ProfileError, match="list.yaml: an acceptance pair profile must be a YAML mapping"):
        load_pair_acceptance(tmp_path / "list.yaml")
