"""DrafterTree (several drafters grow one tree, issue 16) and tree YAML format treeopt-tree/2: validation,
derived per-drafter fields on a hand-built example, round trips, reading /1, refusals."""

from __future__ import annotations

import pytest
import yaml

from sequoia_opt.errors import MultiDrafterTreeError, TreeValidationError
from sequoia_opt.exports import load_any_tree
from sequoia_opt.tree import (
    TREE_FORMAT_V2,
    DrafterTree,
    Tree,
    TreeMetadata,
    drafter_tree_from_yaml,
    drafter_tree_to_yaml,
    load_drafter_tree,
    load_tree,
    save_drafter_tree,
    save_tree,
    tree_from_yaml,
    tree_to_yaml,
)

# Hand-built example (light = drafter 0, strong = drafter 1), canonical order:
#
#   0 root
#   ├── 1 light  rank 0
#   │   ├── 4 light  rank 0
#   │   └── 5 strong rank 1 (drafter rank 0)
#   ├── 2 light  rank 1
#   └── 3 strong rank 2 (drafter rank 0)
#       └── 6 strong rank 0
#           └── 7 light rank 0
PARENT = [-1, 0, 0, 0, 1, 1, 3, 6]
RANK = [0, 0, 1, 2, 0, 1, 0, 0]
DRAFTER = [0, 0, 0, 1, 0, 1, 1, 0]
NAMES = ("lookup", "big-draft")


@pytest.fixture
def example() -> DrafterTree:
    return DrafterTree(Tree(parent=PARENT, rank=RANK), DRAFTER, NAMES)


META = TreeMetadata(budget=8, max_depth=3, expected_tokens_per_step=2.125, predicted_speedup=1.5,
                    acceptance_profile="pair-1", latency_profile="lat", solver="graft-dp+hardware",
                    date="2026-01-02T03:04:05+00:00", extra={"graft_depths": [0, 1], "note": "hand-made"})


def test_derived_fields(example):
    assert example.num_drafters == 2
    assert example.drafter_rank == (0, 0, 1, 0, 0, 0, 0, 0)
    assert example.drafter_counts == (4, 3)  # light 1, 2, 4, 7; strong 3, 5, 6; the root is no one's
    assert example.expands == ((0, 1, 6), (0, 1, 3))
    assert example.processed(0) == (0, 1, 3, 6)  # node 6 needs its ancestor 3 in the light's cache
    assert example.processed(1) == (0, 1, 3)
    assert example.processed_level_widths(0) == (1, 2, 1, 0)
    assert example.processed_level_widths(1) == (1, 2, 0, 0)
    light, index = example.light_only()
    assert light.tree == Tree(parent=[-1, 0, 0, 1], rank=[0, 0, 1, 0])
    assert light.drafter == (0, 0, 0, 0) and light.names == NAMES
    assert index == (0, 1, 2, -1, 3, -1, -1, -1)
    assert example.size == len(example) == 8 and example.tree_depth == 3
    assert example.level_widths == (1, 3, 3, 1)
    assert "lookup 4, big-draft 3" in example.summary()
    with pytest.raises(TreeValidationError, match=r"drafter index 2 is out of range \[0, 2\)"):
        example.processed(2)


def test_single_drafter_is_the_plain_tree():
    t = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    d = DrafterTree.single(t, "draft")
    assert d.drafter_rank == t.rank
    assert d.drafter_counts == (t.size - 1,)
    non_leaves = tuple(v for v in range(t.size) if t.children[v])
    assert d.expands == (non_leaves,)
    assert d.processed(0) == non_leaves == (0, 1, 3)
    assert d.processed_level_widths(0) == (1, 1, 1, 0)
    light, index = d.light_only()
    assert light == d and index == tuple(range(t.size))
    assert d == DrafterTree(t, [0] * t.size, ["draft"])  # lists are normalised to tuples


def test_from_edges_sorts_and_carries_labels(example):
    # the example's nodes in another order: 7, 6 and 3 first
    perm = [0, 7, 6, 3, 1, 2, 4, 5]
    inv = {old: new for new, old in enumerate(perm)}
    parent = [-1] + [inv[PARENT[v]] for v in perm[1:]]
    got = DrafterTree.from_edges(parent, [RANK[v] for v in perm], [DRAFTER[v] for v in perm], NAMES)
    assert got == example


@pytest.mark.parametrize(
    "drafter, names, message",
    [
        ([0, 0, 0, 2, 0, 1, 1, 0], NAMES, "node 3: drafter index 2 is out of range [0, 2)"),
        ([0, 0, 0, 1, 0, 1, 1], NAMES, "7 drafter labels for a tree of 8 nodes"),
        ([0, 1, 0, 1, 0, 1, 1, 0], NAMES, "node 2: drafter 0 (lookup) comes after its sibling 1 of drafter 1"),
        ([1, 0, 0, 1, 0, 1, 1, 0], NAMES, "the root's drafter must be 0"),
        (DRAFTER, (), "at least one drafter name"),
        (DRAFTER, ("a", "a"), "distinct"),
        (DRAFTER, ("a", ""), "drafter 1: name must be a non-empty string"),
        (DRAFTER, "ab", "not one string"),
        ([0, 0, 0, 1.0, 0, 1, 1, 0], NAMES, "drafter must be an integer"),
    ],
)
def test_validation(drafter, names, message):
    with pytest.raises(TreeValidationError) as info:
        DrafterTree(Tree(parent=PARENT, rank=RANK), drafter, names)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------ YAML


def test_yaml_v2_layout_and_round_trip(example, tmp_path):
    text = drafter_tree_to_yaml(example, META)
    doc = yaml.safe_load(text)
    assert list(doc) == ["format", "metadata", "drafters", "nodes"]
    assert doc["format"] == TREE_FORMAT_V2 == "treeopt-tree/2"
    assert "drafters: [lookup, big-draft]\n" in text
    assert "  - {parent: 0, rank: 2, drafter: 1}\n" in text
    assert "  - {parent: 0, rank: 1}\n" in text  # drafter 0 is left out
    got, meta = drafter_tree_from_yaml(text)
    assert got == example and meta == META
    assert drafter_tree_to_yaml(got, meta) == text
    path = save_drafter_tree(tmp_path / "graft.yaml", example, META)
    assert load_drafter_tree(path) == (example, META)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write leaves no temp file


def test_reads_v1_as_one_drafter(tmp_path):
    t = Tree.from_choices([[0], [1], [0, 0]])
    path = save_tree(tmp_path / "t.yaml", t, TreeMetadata(budget=4, extra={"profiled_draft": "SmolLM2-135M"}))
    d, meta = load_drafter_tree(path)
    assert d == DrafterTree(t, (0, 0, 0, 0), ("SmolLM2-135M",))
    assert meta.budget == 4
    d2, _ = drafter_tree_from_yaml(tree_to_yaml(t))
    assert d2.names == ("draft",)  # no drafter named in the metadata
    d3, _ = drafter_tree_from_yaml(tree_to_yaml(t, TreeMetadata(extra={"drafter": "lookup:1-3"})))
    assert d3.names == ("lookup:1-3",)


def test_load_tree_reads_single_drafter_v2_and_refuses_multi(example, tmp_path):
    t = Tree.from_choices([[0], [1], [0, 0]])
    path = save_drafter_tree(tmp_path / "one.yaml", DrafterTree.single(t, "draft"), META)
    assert load_tree(path) == (t, META)
    multi = save_drafter_tree(tmp_path / "two.yaml", example, META)
    with pytest.raises(MultiDrafterTreeError) as info:  # a TreeValidationError the multi-drafter path reads
        load_tree(multi)
    with pytest.raises(MultiDrafterTreeError):
        load_any_tree(multi)  # what run --tree and plot read through
    msg = str(info.value)
    assert "multi-drafter tree (2 drafters: lookup, big-draft)" in msg and "load_drafter_tree" in msg
    assert "\n" not in msg


HEAD2 = "format: treeopt-tree/2\ndrafters: [light, strong]\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (HEAD2 + "nodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafter: 2}\n",
         "node 1: drafter index 2 is out of range [0, 2)"),
        (HEAD2 + "nodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafter: 1}\n"
                 "  - {parent: 0, rank: 1}\n", "node 2: drafter 0 (light) comes after its sibling 1 of drafter 1"),
        (HEAD2 + "nodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafter: one}\n",
         "node 1: drafter must be an integer"),
        ("format: treeopt-tree/2\nnodes:\n  - {parent: -1, rank: 0}\n", "needs 'drafters'"),
        ("format: treeopt-tree/2\ndrafters: []\nnodes:\n  - {parent: -1, rank: 0}\n", "needs 'drafters'"),
        ("format: treeopt-tree/1\nnodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafter: 1}\n",
         "node 1 has a 'drafter'"),
        ("format: treeopt-tree/1\ndrafters: [a]\nnodes:\n  - {parent: -1, rank: 0}\n", "'drafters' is a"),
        ("format: treeopt-tree/3\nnodes:\n  - {parent: -1, rank: 0}\n", "unknown format 'treeopt-tree/3'"),
    ],
)
def test_yaml_v2_errors(text, message):
    with pytest.raises(TreeValidationError) as info:
        drafter_tree_from_yaml(text, source="g.yaml")
    assert message in str(info.value)
    assert str(info.value).startswith("g.yaml: ")
    assert "\n" not in str(info.value)


def test_wrong_length_from_edges():
    with pytest.raises(TreeValidationError, match="one of each per node"):
        DrafterTree.from_edges([-1, 0], [0, 0], [0], NAMES)


def test_single_drafter_v2_bad_label_refused_by_load_tree():
    text = "format: treeopt-tree/2\ndrafters: [d]\nnodes:\n  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafter: 1}\n"
    with pytest.raises(TreeValidationError, match="drafter index 1 is out of range"):
        tree_from_yaml(text)


@pytest.mark.parametrize("names", [("lookup:1-3", "self:6"), ("a, b", "'q'"), ("[x]", "y: z"), ("1", "true")])
def test_yaml_v2_names_that_need_quoting(names):
    d = DrafterTree(Tree.from_choices([[0], [1]]), (0, 0, 1), names)
    assert drafter_tree_from_yaml(drafter_tree_to_yaml(d))[0] == d
