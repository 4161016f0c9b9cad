"""Tests for sequoia_opt.tree: validation, derived quantities, canonical order, YAML and choice-list round trips,
atomic saving."""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sequoia_opt import _io
from sequoia_opt.errors import TreeoptError, TreeValidationError
from sequoia_opt.tree import (
    TREE_FORMAT,
    Tree,
    TreeMetadata,
    load_tree,
    save_tree,
    tree_from_yaml,
    tree_to_yaml,
)

# The hand-worked example used throughout (canonical order = sorted by (depth, parent, rank)):
#
#   0 (root)
#   ├── 1 (rank 0)
#   │   ├── 3 (rank 0)
#   │   │   └── 5 (rank 0)
#   │   └── 4 (rank 1)
#   └── 2 (rank 1)
EXAMPLE_PARENT = [-1, 0, 0, 1, 1, 3]
EXAMPLE_RANK = [0, 0, 1, 0, 1, 0]


@pytest.fixture
def example() -> Tree:
    return Tree(parent=EXAMPLE_PARENT, rank=EXAMPLE_RANK)


# ------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "parent, rank, limits, message",
    [
        ([], [], {}, "no nodes"),
        ([0, 0], [0, 0], {}, "missing root"),
        ([1, -1], [0, 0], {}, "missing root"),
        ([-1, -1], [0, 0], {}, "second root"),
        ([-1, 2, 0], [0, 0, 0], {}, "does not precede"),
        ([-1, 1], [0, 0], {}, "does not precede"),  # a node as its own parent
        ([-1, 0, 7], [0, 0, 1], {}, "node 2: parent 7 is out of range (the tree has 3 nodes, 0..2)"),
        ([-1, 0, 0], [0, 0, 0], {}, "duplicate (parent 0, rank 0)"),
        ([-1, 0, 0], [0, 0, 2], {}, "rank gap under node 0: rank 2 without rank 1"),
        ([-1, 0], [0, 1], {}, "rank gap under node 0: rank 1 without rank 0"),
        ([-1, 0, 0, 0], [0, 0, 1, 2], {"max_branching": 2}, "rank 2 >= the allowed branching 2"),
        ([-1, 0, 1, 2], [0, 0, 0, 0], {"max_depth": 2}, "depth 3 is beyond the limit 2"),
        ([-1, -2], [0, 0], {}, "negative index"),
        ([-1, 0], [0, -1], {}, "negative index"),
        ([-1, 0, 0, 2, 1], [0, 0, 1, 0, 0], {}, "canonical"),  # child of node 2 listed before child of node 1
        ([-1, 0, 1, 0], [0, 0, 0, 1], {}, "canonical"),  # a depth-2 node before a depth-1 node
        ([-1, 0, 0], [0, 1, 0], {}, "canonical"),  # ranks out of order under one parent
        ([-1, 0], [1, 0], {}, "root must have rank 0"),
        ([-1, 0], [0], {}, "2 parents but 1 ranks"),
        ([-1, 0.5], [0, 0], {}, "parent must be an integer"),
        ([-1, "0"], [0, 0], {}, "parent must be an integer"),
        ([-1, True], [0, 0], {}, "parent must be an integer"),
        ([-1, 0], [0, 1.0], {}, "rank must be an integer"),
        (None, [0], {}, "parent must be a sequence"),
    ],
)
def test_validation_errors(parent, rank, limits, message):
    with pytest.raises(TreeValidationError) as info:
        Tree(parent=parent, rank=rank, **limits)
    assert message in str(info.value)
    assert isinstance(info.value, TreeoptError)
    assert "\n" not in str(info.value)  # one clear line


def test_limits_at_the_boundary_are_allowed():
    t = Tree(parent=[-1, 0, 0, 1], rank=[0, 0, 1, 0], max_depth=2, max_branching=2)
    assert t.size == 4


def test_numpy_integers_are_accepted_as_python_ints():
    t = Tree(parent=np.array([-1, 0, 0]), rank=np.array([0, 0, 1], dtype=np.int32))
    assert t.parent == (-1, 0, 0) and all(type(x) is int for x in t.parent + t.rank)


def test_trees_are_values():
    a = Tree(parent=EXAMPLE_PARENT, rank=EXAMPLE_RANK)
    b = Tree(parent=tuple(EXAMPLE_PARENT), rank=tuple(EXAMPLE_RANK), max_depth=10)
    assert a == b and hash(a) == hash(b)  # limits are not part of the value
    with pytest.raises(AttributeError):
        a.parent = (-1,)  # type: ignore[misc]


def test_chain():
    assert Tree.chain(1).size == 1
    t = Tree.chain(4)
    assert t.parent == (-1, 0, 1, 2) and t.rank == (0, 0, 0, 0)
    with pytest.raises(TreeValidationError, match="at least 1 node"):
        Tree.chain(0)
    assert Tree.chain(np.int64(3)).size == 3
    # 2.5 raised a TypeError from range(); True made a 1-node chain without a word
    for bad in (2.5, True, "3"):
        with pytest.raises(TreeValidationError, match="a chain's length is a whole number of nodes"):
            Tree.chain(bad)


# ------------------------------------------------------------------------------------------- derived quantities


def test_derived_topology_hand_worked(example):
    t = example
    assert t.size == len(t) == 6
    assert t.depth.tolist() == [0, 1, 1, 2, 2, 3]
    assert t.positions.tolist() == [0, 1, 1, 2, 2, 3]
    assert t.tree_depth == 3
    assert t.children == ((1, 2), (3, 4), (), (5,), (), ())
    assert t.level_widths == (1, 2, 2, 1)
    assert t.level_slices == (slice(0, 1), slice(1, 3), slice(3, 5), slice(5, 6))
    assert t.max_branching_used == 2
    assert t.paths == ((0,), (0, 1), (0, 2), (0, 1, 3), (0, 1, 4), (0, 1, 3, 5))
    assert t.choices() == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    assert "6 nodes, depth 3" in t.summary()


def test_ancestor_mask_hand_worked(example):
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 1],
        ],
        dtype=bool,
    )
    m = example.ancestor_mask
    assert m.shape == (6, 6) and m.dtype == bool
    np.testing.assert_array_equal(m, expected)


def test_root_only_tree():
    t = Tree(parent=[-1], rank=[0])
    assert t.tree_depth == 0 and t.level_widths == (1,) and t.children == ((),)
    assert t.choices() == [] and t.max_branching_used == 0
    assert t.expected_tokens([0.9]) == 1.0
    np.testing.assert_array_equal(t.ancestor_mask, [[True]])


def test_expected_tokens_hand_worked(example):
    p = [0.5, 0.3]
    # root 1; node1 .5; node2 .3; node3 .5*.5; node4 .5*.3; node5 .5*.5*.5
    probs = example.path_probabilities(p)
    np.testing.assert_allclose(probs, [1, 0.5, 0.3, 0.25, 0.15, 0.125])
    assert example.expected_tokens(p) == pytest.approx(2.325)


def test_expected_tokens_rank_beyond_vector_is_zero(example):
    # Only p_1 given: the rank-1 nodes (2, 4) are never accepted.
    np.testing.assert_allclose(example.path_probabilities([0.5]), [1, 0.5, 0, 0.25, 0, 0.125])
    assert example.expected_tokens([]) == 1.0


def test_expected_tokens_chain_closed_form():
    alpha, gamma = 0.7, 5
    # A chain of gamma speculated tokens: G = (1 - alpha^(gamma+1)) / (1 - alpha).
    assert Tree.chain(gamma + 1).expected_tokens([alpha]) == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha))


def test_expected_tokens_accepts_numpy_and_zero_entries(example):
    assert np.isfinite(example.expected_tokens(np.array([0.0, 0.0])))
    assert example.expected_tokens(np.array([0.0, 0.0])) == 1.0


# ------------------------------------------------------------------------------------------- from_edges


def test_from_edges_canonicalizes():
    # Same tree as `example`, nodes listed in a scrambled order (input index -> node):
    # 0 root, 1 -> node5, 2 -> node2, 3 -> node3, 4 -> node1, 5 -> node4
    parent = [-1, 3, 0, 4, 0, 4]
    rank = [0, 0, 1, 0, 0, 1]
    t = Tree.from_edges(parent, rank)
    assert t == Tree(parent=EXAMPLE_PARENT, rank=EXAMPLE_RANK)


def test_from_edges_keeps_canonical_input_unchanged(example):
    assert Tree.from_edges(list(example.parent), list(example.rank)) == example


def test_from_edges_passes_limits():
    with pytest.raises(TreeValidationError, match="beyond the limit 1"):
        Tree.from_edges([-1, 0, 1], [0, 0, 0], max_depth=1)


@pytest.mark.parametrize(
    "parent, rank, message",
    [
        ([0, -1], [0, 0], "node 0 must be the root"),
        ([-1, 2, 1], [0, 0, 0], "not reachable"),  # a cycle 1 <-> 2
        ([-1, 1], [0, 0], "not reachable"),  # a self-loop
        ([-1, 0, -1], [0, 0, 0], "not a node index"),  # a second root
        ([-1, 5], [0, 0], "not a node index"),
        ([-1, 0, 0], [0, 0, 0], "duplicate"),
        ([-1, 0], [0, 0, 0], "as many ranks"),
        ([], [], "needs a root"),
    ],
)
def test_from_edges_errors(parent, rank, message):
    with pytest.raises(TreeValidationError, match=message):
        Tree.from_edges(parent, rank)


# ------------------------------------------------------------------------------------------- random trees


@st.composite
def random_trees(draw, max_nodes: int = 40) -> Tree:
    """Any valid tree: each new node picks a parent among the earlier ones and takes the next free rank;
    the nodes are then shuffled and canonicalized by from_edges."""
    n = draw(st.integers(1, max_nodes))
    parent, rank, n_children = [-1], [0], [0]
    for _ in range(1, n):
        p = draw(st.integers(0, len(parent) - 1))
        parent.append(p)
        rank.append(n_children[p])
        n_children[p] += 1
        n_children.append(0)
    perm = [0] + draw(st.permutations(list(range(1, n))))  # perm[new] = old
    where = {old: new for new, old in enumerate(perm)}
    shuffled_parent = [-1] + [where[parent[old]] for old in perm[1:]]
    shuffled_rank = [rank[old] for old in perm]
    return Tree.from_edges(shuffled_parent, shuffled_rank)


@settings(max_examples=80, deadline=None)
@given(random_trees())
def test_random_tree_invariants(t):
    n = t.size
    assert sum(t.level_widths) == n
    assert all(t.depth[t.parent[i]] + 1 == t.depth[i] for i in range(1, n))
    # canonical: sorted by (depth, parent, rank)
    keys = [(int(t.depth[i]), t.parent[i], t.rank[i]) for i in range(1, n)]
    assert keys == sorted(keys)
    # mask row i marks exactly the path to i
    m = t.ancestor_mask
    for i in range(n):
        assert set(np.flatnonzero(m[i])) == set(t.paths[i])
    assert np.array_equal(m, np.tril(m))
    # children ranks are 0..k-1 in order
    for v, ch in enumerate(t.children):
        assert [t.rank[c] for c in ch] == list(range(len(ch)))
        assert all(t.parent[c] == v for c in ch)


@settings(max_examples=80, deadline=None)
@given(random_trees(), st.lists(st.floats(0, 1), min_size=1, max_size=6))
def test_expected_tokens_matches_paths(t, raw):
    total = sum(raw)
    p = [x / total * 0.95 for x in raw] if total > 0 else raw
    via_paths = sum(np.prod([p[t.rank[u]] if t.rank[u] < len(p) else 0.0 for u in path[1:]]) for path in t.paths)
    assert t.expected_tokens(p) == pytest.approx(via_paths)
    assert 1.0 <= t.expected_tokens(p) <= t.size


# ------------------------------------------------------------------------------------------- YAML


FULL_META = TreeMetadata(
    budget=8,
    max_depth=4,
    expected_tokens_per_step=2.718281828459045,
    predicted_speedup=1.1 + 2.2,  # not exactly representable in a short decimal
    acceptance_profile="acc-llama-68m-7b",
    latency_profile="lat-h100",
    solver="sequoia-dp",
    date="2024-05-01T12:00:00+00:00",
    extra={"note": "hand-made", "seed": 3, "values": [0.5, 0.25]},
)


def test_yaml_layout(example):
    text = tree_to_yaml(example, FULL_META)
    doc = yaml.safe_load(text)
    assert doc["format"] == TREE_FORMAT == "treeopt-tree/1"
    assert list(doc) == ["format", "metadata", "nodes"]
    assert doc["nodes"][0] == {"parent": -1, "rank": 0}
    assert "  - {parent: 1, rank: 0}\n" in text  # one flow-style line per node
    assert doc["metadata"]["note"] == "hand-made"  # extra keys live beside the known ones


def test_yaml_round_trip_exact_with_metadata(example):
    text = tree_to_yaml(example, FULL_META)
    tree, meta = tree_from_yaml(text)
    assert tree == example
    assert meta == FULL_META  # floats, strings that look like dates, and extra keys survive
    assert tree_to_yaml(tree, meta) == text


def test_a_solved_header_over_edited_nodes_predicts_nothing(tmp_path):
    """A tryout removed a node of a solved 4-node tree under its header: the run predicted the 4-node tree's
    1.78 tokens/step for the 3-node edit, above what the edit can emit. Figures of another tree (node_rates or
    depth_step_ms of another length) are dropped with one warning; the provenance stays."""
    from sequoia_opt.errors import ProfileWarning

    solved = Tree.from_choices([[0], [1], [0, 0]])
    meta = TreeMetadata(expected_tokens_per_step=1.83, predicted_speedup=1.4, acceptance_profile="acc",
                        extra={"node_rates": [0.485, 0.11, 0.485], "depth_step_ms": [10.0, 12.0, 13.0],
                               "end_overshoot_tokens": 0.3, "max_branching": 2})
    assert tree_from_yaml(tree_to_yaml(solved, meta))[1] == meta  # its own tree: every figure kept
    edited = tree_to_yaml(Tree.from_choices([[0], [0, 0]]), meta)
    with pytest.warns(ProfileWarning, match=r"edited: its metadata predicts a 4-node tree but the file holds 3 "
                                            r"nodes \(depth 2\), edited after it was solved: no prediction"):
        _, got = tree_from_yaml(edited, source="edited")
    assert got.expected_tokens_per_step is None and got.predicted_speedup is None
    assert got.acceptance_profile == "acc" and got.extra == {"max_branching": 2}
    # an edit that also cut the depth: the header's G (2.6, past the 2 a depth-1 tree emits) and overshoot are
    # another tree's, dropped before they are checked against this one (they were refused as impossible)
    deep = TreeMetadata(expected_tokens_per_step=2.6, extra={"node_rates": [0.9, 0.8, 0.7],
                                                             "end_overshoot_tokens": 1.5})
    with pytest.warns(ProfileWarning, match="predicts a 4-node tree but the file holds 2 nodes"):
        _, got = tree_from_yaml(tree_to_yaml(Tree.from_choices([[0]]), deep))
    assert got.expected_tokens_per_step is None and got.extra == {}
    cut = tree_to_yaml(Tree.from_choices([[0], [1]]), TreeMetadata(expected_tokens_per_step=1.5,
                                                                   extra={"depth_step_ms": [10.0, 12.0, 13.0]}))
    with pytest.warns(ProfileWarning, match="predicts a tree of depth 2 but the file holds 3 nodes \\(depth 1\\)"):
        assert tree_from_yaml(cut)[1].expected_tokens_per_step is None


def test_yaml_nan_metadata_becomes_null(example):
    text = tree_to_yaml(example, TreeMetadata(expected_tokens_per_step=float("nan")))
    _, meta = tree_from_yaml(text)
    assert meta.expected_tokens_per_step is None


@settings(max_examples=60, deadline=None)
@given(
    random_trees(),
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0)),
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_yaml_round_trip_random(t, frac, solver):
    g = None if frac is None else 1.0 + frac * t.tree_depth  # G in [1, depth + 1]: the root, at most a whole path
    meta = TreeMetadata(budget=t.size, max_depth=t.tree_depth, expected_tokens_per_step=g, solver=solver)
    text = tree_to_yaml(t, meta)
    t2, meta2 = tree_from_yaml(text)
    assert t2 == t and t2.parent == t.parent and t2.rank == t.rank
    assert meta2 == meta
    assert tree_to_yaml(t2, meta2) == text


NODES_OK = "nodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("format: treeopt-tree/3\n" + NODES_OK, "unknown format 'treeopt-tree/3'"),
        (NODES_OK, "unknown format None"),
        ("format: treeopt-tree/1\nnodes: []\n", "non-empty list"),
        ("format: treeopt-tree/1\n", "non-empty list"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: -1}\n", "node 0 must be a mapping"),
        ("format: treeopt-tree/1\nnodes:\n  - [-1, 0]\n", "node 0 must be a mapping"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0.0, rank: 0}\n", "integers"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: -1, rank: 0}\n  - {parent: '0', rank: 0}\n", "integers"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: true}\n", "integers"),
        ("format: treeopt-tree/1\nmetadata: [1]\n" + NODES_OK, "'metadata' must be a mapping"),
        ("format: treeopt-tree/1\nmetadata: {max_depth: deep}\n" + NODES_OK, "max_depth must be"),
        ("format: treeopt-tree/1\nmetadata: {max_depth: 0}\n" + NODES_OK, "beyond the limit 0"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: 0, rank: 0}\n", "missing root"),
        ("- just a list\n", "expected a mapping"),
        ("format: [unclosed\n", "not valid YAML"),
    ],
)
def test_yaml_errors(text, message):
    with pytest.raises(TreeValidationError) as info:
        tree_from_yaml(text, source="t.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("t.yaml: ")
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------- choice lists


def test_from_choices_hand_worked(example):
    assert Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]]) == example
    # order does not matter, tuples work
    assert Tree.from_choices([(0, 0, 0), (0, 1), (1,), (0,), (0, 0)]) == example


def test_medusa_choice_list_round_trip_hand_worked():
    # The start of Medusa's mc_sim_7b_63 (medusa/model/medusa_choices.py), prefix-closed.
    choices = [[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4]]
    t = Tree.from_choices(choices)
    assert t.size == len(choices) + 1
    assert sorted(t.choices(), key=lambda c: (len(c), c)) == t.choices()
    assert sorted(map(tuple, t.choices())) == sorted(map(tuple, choices))
    assert Tree.from_choices(t.choices()) == t


@settings(max_examples=80, deadline=None)
@given(random_trees(), st.randoms(use_true_random=False))
def test_choice_list_round_trip_random(t, rnd):
    choices = t.choices()
    assert Tree.from_choices(choices) == t
    shuffled = list(choices)
    rnd.shuffle(shuffled)
    assert Tree.from_choices(shuffled) == t


@pytest.mark.parametrize(
    "choices, message",
    [
        ([[0], [0, 0], [0, 0]], "listed twice"),
        ([[0, 0]], "no parent [0]"),
        ([[0], []], "empty choice"),
        ([[0], [-1]], "negative rank"),
        ([[0], ["a"]], "not a list of integer ranks"),
        ([[0], 5], "not a list of integer ranks"),
        ([[1]], "rank gap"),
        ([[0], [2], [1], [3]], None),  # fine: 0..3
    ],
)
def test_from_choices_errors(choices, message):
    if message is None:
        assert Tree.from_choices(choices).size == 5
        return
    with pytest.raises(TreeValidationError) as info:
        Tree.from_choices(choices)
    assert message in str(info.value)


def test_from_choices_limits():
    with pytest.raises(TreeValidationError, match="allowed branching 2"):
        Tree.from_choices([[0], [1], [2]], max_branching=2)
    with pytest.raises(TreeValidationError, match="beyond the limit 1"):
        Tree.from_choices([[0], [0, 0]], max_depth=1)


# ------------------------------------------------------------------------------------------- files


def test_save_and_load(tmp_path, example):
    path = save_tree(tmp_path / "sub" / "tree.yaml", example, FULL_META)
    assert path.exists()
    tree, meta = load_tree(path)
    assert tree == example and meta == FULL_META
    assert [p.name for p in path.parent.iterdir()] == ["tree.yaml"]


def test_load_missing_file(tmp_path):
    with pytest.raises(TreeValidationError, match="cannot read tree file"):
        load_tree(tmp_path / "nope.yaml")


def test_load_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("format: treeopt-tree/9\n" + NODES_OK)
    with pytest.raises(TreeValidationError, match=r"bad\.yaml: unknown format"):
        load_tree(path)


def test_save_tree_writes_nothing_when_serialization_fails(tmp_path, example):
    path = tmp_path / "tree.yaml"
    meta = TreeMetadata(extra={"unserializable": object()})
    with pytest.raises(yaml.YAMLError):
        save_tree(path, example, meta)
    assert list(tmp_path.iterdir()) == []


def test_save_tree_keeps_old_file_and_leaves_no_temp_when_write_fails(tmp_path, example, monkeypatch):
    path = tmp_path / "tree.yaml"
    save_tree(path, Tree.chain(3))
    before = path.read_text()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(_io.os, "replace", broken_replace)
    from sequoia_opt.errors import OutputError

    with pytest.raises(OutputError, match="cannot write .*tree.yaml: disk full"):
        save_tree(path, example)
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["tree.yaml"]


def test_save_tree_overwrites_atomically(tmp_path, example):
    path = tmp_path / "tree.yaml"
    save_tree(path, Tree.chain(3))
    save_tree(path, example)
    assert load_tree(path)[0] == example
    assert sorted(os.listdir(tmp_path)) == ["tree.yaml"]


def test_yaml_is_deterministic():
    # The same tree, however it was built, gives the same text.
    t = Tree.from_choices([[0], [1], [0, 0]])
    assert tree_to_yaml(t) == tree_to_yaml(Tree.from_choices([[1], [0, 0], [0]]))


def test_a_tree_cut_to_a_depth_is_its_breadth_first_prefix():
    t = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    assert t.cut(t.tree_depth) is t
    one = t.cut(1)
    assert (one.parent, one.rank, one.tree_depth) == (t.parent[:3], t.rank[:3], 1)
    assert t.cut(2).choices() == [[0], [1], [0, 0], [0, 1], [1, 0]]
    with pytest.raises(ValueError, match="cannot clip a tree of depth 3 to depth 4"):
        t.cut(4)
