"""Tests for sequoia_opt.exports: every format on hand-checked trees, level-uniform detection and projection,
imports and round trips."""

from __future__ import annotations

import ast
import heapq
import json

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sequoia_opt.errors import TreeoptError, TreeValidationError
from sequoia_opt.exports import (
    EXPORT_FORMATS,
    FORMAT_SUFFIXES,
    ExportError,
    choices_literal,
    export,
    export_tree,
    import_choices,
    is_level_uniform,
    level_branching,
    level_uniform_tree,
    load_any_tree,
    project_level_uniform,
)
from sequoia_opt.tree import TREE_FORMAT, Tree, TreeMetadata, tree_from_yaml, tree_to_yaml

# root -> ranks 0 and 1; rank 0 -> one child. Not level-uniform (depth-1 nodes have 1 and 0 children).
SMALL = Tree.from_choices([[0], [1], [0, 0]])
P = [0.6, 0.2, 0.1]


# ------------------------------------------------------------------------------------------- helpers


def greedy_tree(p, n: int) -> Tree:
    """Best-first (Medusa / Sequoia greedy) tree of n nodes: optimal for a non-increasing p."""
    p = list(p)
    parent, rank, prob = [-1], [0], [1.0]
    heap = [(-prob[0] * p[0], 0, 0)] if p else []  # (-path prob, parent, rank)
    while len(parent) < n and heap:
        neg, par, r = heapq.heappop(heap)
        idx = len(parent)
        parent.append(par)
        rank.append(r)
        prob.append(-neg)
        heapq.heappush(heap, (-prob[idx] * p[0], idx, 0))
        if r + 1 < len(p):
            heapq.heappush(heap, (-prob[par] * p[r + 1], par, r + 1))
    return Tree.from_edges(parent, rank)


def all_branchings(n: int, max_depth: int | None):
    """Every per-level branching (k_1..k_D) whose full tree has at most n nodes."""
    out = [()]

    def rec(prefix, width, used):
        if max_depth is not None and len(prefix) >= max_depth:
            return
        k = 1
        while used + width * k <= n:
            seq = prefix + (k,)
            out.append(seq)
            rec(seq, width * k, used + width * k)
            k += 1

    rec((), 1, 1)
    return out


def best_level_uniform_brute(p, n: int, max_depth: int | None) -> float:
    return max(level_uniform_tree(b).expected_tokens(p) for b in all_branchings(n, max_depth))


def vllm_drafted_paths(tree_literal: str) -> list[tuple[int, ...]]:
    """What vLLM's EAGLE proposer drafts for a speculative_token_tree (vllm/v1/spec_decode/eagle.py): per level
    one child count, drafts[l] // drafts[l - 1], the top-k children of every draft of the previous level."""
    choices = sorted(ast.literal_eval(tree_literal), key=lambda t: (len(t), t))
    depth = len(choices[-1])
    per_level = [0] * depth
    for c in choices:
        per_level[len(c) - 1] += 1
    children = [per_level[0]] + [per_level[i] // per_level[i - 1] for i in range(1, depth)]
    level, drafted = [()], []
    for k in children:
        level = [path + (r,) for path in level for r in range(k)]
        drafted += level
    return drafted


@st.composite
def random_trees(draw, max_nodes: int = 30) -> Tree:
    n = draw(st.integers(1, max_nodes))
    parent, rank, n_children = [-1], [0], [0]
    for _ in range(1, n):
        p = draw(st.integers(0, len(parent) - 1))
        parent.append(p)
        rank.append(n_children[p])
        n_children[p] += 1
        n_children.append(0)
    return Tree.from_edges(parent, rank)


@st.composite
def acceptance_vectors(draw, non_increasing: bool = False):
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6))
    total = draw(st.floats(0.05, 1.0))
    s = sum(raw)
    assume(s > 1e-6)
    p = [x / s * total for x in raw]
    return sorted(p, reverse=True) if non_increasing else p


# ------------------------------------------------------------------------------------------- formats


def test_formats_listed():
    assert EXPORT_FORMATS == ("yaml", "json", "medusa", "tensorrt-llm", "vllm", "sglang")
    assert set(FORMAT_SUFFIXES) == set(EXPORT_FORMATS)


def test_yaml_export_is_tree_yaml():
    meta = TreeMetadata(budget=4, solver="sequoia-dp")
    assert export_tree(SMALL, "yaml", meta) == tree_to_yaml(SMALL, meta)
    assert tree_from_yaml(export_tree(SMALL, "yaml", meta)) == (SMALL, meta)


def test_json_export_hand_checked():
    meta = TreeMetadata(budget=4, max_depth=2, solver="sequoia-dp", extra={"seed": 1})
    text = export_tree(SMALL, "json", meta, acceptance=P)
    doc = json.loads(text)
    assert list(doc) == ["format", "metadata", "nodes", "derived"]
    assert doc["format"] == TREE_FORMAT
    assert doc["metadata"]["budget"] == 4 and doc["metadata"]["seed"] == 1
    assert doc["nodes"] == [
        {"parent": -1, "rank": 0},
        {"parent": 0, "rank": 0},
        {"parent": 0, "rank": 1},
        {"parent": 1, "rank": 0},
    ]
    d = doc["derived"]
    assert d["size"] == 4 and d["depth"] == 2 and d["level_widths"] == [1, 2, 1]
    assert d["choices"] == [[0], [1], [0, 0]]
    assert d["max_branching"] == 2 and d["level_uniform"] is False
    assert d["expected_tokens_per_step"] == pytest.approx(1 + 0.6 + 0.2 + 0.36)
    assert "derived" in d["note"]
    assert '\n    {"parent": 1, "rank": 0}\n' in text  # one node per line


def test_json_export_without_acceptance_has_no_expected_tokens():
    d = json.loads(export_tree(SMALL, "json"))["derived"]
    assert "expected_tokens_per_step" not in d


def test_json_export_is_strict_json_with_nan_metadata():
    text = export_tree(SMALL, "json", TreeMetadata(expected_tokens_per_step=float("nan")))
    assert json.loads(text)["metadata"]["expected_tokens_per_step"] is None
    assert "NaN" not in text


def test_json_export_rejects_unserializable_metadata():
    with pytest.raises(ExportError, match="cannot be written as JSON"):
        export_tree(SMALL, "json", TreeMetadata(extra={"x": object()}))


@pytest.mark.parametrize("fmt", ["medusa", "tensorrt-llm", "trtllm", "TensorRT_LLM"])
def test_choice_list_export_hand_checked(fmt):
    text = export_tree(SMALL, fmt)
    assert text == "[[0], [1], [0, 0]]\n"
    assert ast.literal_eval(text) == json.loads(text) == [[0], [1], [0, 0]]


def test_choice_list_export_is_in_medusa_sorted_order():
    # Medusa's generate_medusa_buffers sorts by (len, path); the export is already in that order.
    t = Tree.from_choices([[0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2]])
    listed = ast.literal_eval(export_tree(t, "medusa"))
    assert listed == sorted(listed, key=lambda x: (len(x), x))


def test_choice_list_notes():
    e = export(SMALL, "tensorrt-llm")
    assert any("2 Medusa heads" in n and "max_draft_len >= 3" in n for n in e.notes)
    wide = Tree.from_choices([[r] for r in range(12)])
    assert any("rank 11 >= 10" in n for n in export(wide, "medusa").notes)
    assert e.lost_tokens is None and not e.projected
    # Medusa's list names what reads it (Medusa's own code; TensorRT-LLM only before 1.4), as the others name
    # their releases; a latency mismatch names Medusa's decoder, not an "engine 'medusa'"
    m = export(SMALL, "medusa")
    assert any(n.startswith("for Medusa's own code (FasterDecoding/Medusa") and "up to the 1.3 release candidates"
               in n for n in m.notes)
    from sequoia_opt.engines import engine_mismatch
    from sequoia_opt.profiles import LatencyCurve

    w = engine_mismatch(LatencyCurve.synthetic({1: 10.0, 2: 11.0}, {1: 1.0}), "medusa", what="--format medusa")
    assert "--format medusa solves for Medusa's own decoder (FasterDecoding/Medusa" in w and "engine 'medusa'" not in w


def test_vllm_export_level_uniform_hand_checked():
    t = level_uniform_tree([2, 1])  # root, 2 children, one child each
    e = export(t, "vllm", acceptance=P)
    doc = json.loads(e.text)
    assert doc == {"num_speculative_tokens": 4, "speculative_token_tree": "[(0,), (1,), (0, 0), (1, 0)]"}
    assert e.tree == t and e.lost_tokens == 0.0 and not e.projected
    # vLLM parses the string with ast.literal_eval and sorts it by (len, path): already sorted.
    parsed = ast.literal_eval(doc["speculative_token_tree"])
    assert parsed == sorted(parsed, key=lambda x: (len(x), x))
    assert vllm_drafted_paths(doc["speculative_token_tree"]) == parsed
    assert any("TREE_ATTN" in n for n in e.notes)


def test_vllm_export_projects_non_uniform_tree_hand_checked():
    e = export(SMALL, "vllm", acceptance=P)
    # Level-uniform trees of <= 4 nodes and depth <= 2: [1], [2], [3], [1, 1], [1, 2].
    # G([1, 2]) = 1 + .6 + .6 * .8 = 2.08 is the best; G(SMALL) = 2.16, so 0.08 tokens/step are lost.
    assert json.loads(e.text)["speculative_token_tree"] == "[(0,), (0, 0), (0, 1)]"
    assert e.tree == level_uniform_tree([1, 2])
    assert e.lost_tokens == pytest.approx(0.08)
    assert e.projected
    assert e.notes[0].startswith("projected: lost 0.0800 tokens/step")


def test_vllm_export_without_acceptance_reports_unknown_loss():
    e = export(SMALL, "vllm")
    assert e.lost_tokens is None and e.projected
    assert "unknown" in e.notes[0]
    assert is_level_uniform(e.tree) and e.tree.size <= SMALL.size


def test_vllm_export_reports_a_gain_for_a_poor_tree():
    # A non-uniform tree that spends two of its four speculated nodes on a rank that is never accepted:
    # the best level-uniform tree of <= 5 nodes and depth <= 2 (the chain [1, 1]) beats it.
    t = Tree.from_choices([[0], [1], [2], [2, 0]])
    e = export(t, "vllm", acceptance=[0.9, 0.05, 0.0])
    assert e.lost_tokens < 0
    assert "gained" in e.notes[0]


def test_sglang_export_hand_checked():
    e = export(SMALL, "sglang")
    doc = json.loads(e.text)
    assert doc["speculative_num_steps"] == 2
    assert doc["speculative_eagle_topk"] == 2
    assert doc["speculative_num_draft_tokens"] == 4  # tokens verified per step, root included
    assert doc["cli_flags"] == (
        "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4"
    )
    assert "closest setting" in doc["note"] and "closest setting" in e.notes[0]


def test_sglang_chain_matches_sglang_topk1_rule():
    # SGLang adjusts num_draft_tokens to num_steps + 1 when topk = 1; a chain maps to exactly that.
    doc = json.loads(export_tree(Tree.chain(6), "sglang"))
    assert (doc["speculative_num_steps"], doc["speculative_eagle_topk"]) == (5, 1)
    assert doc["speculative_num_draft_tokens"] == doc["speculative_num_steps"] + 1


def test_sglang_caps_draft_tokens_at_beam_capacity():
    t = level_uniform_tree([3, 3, 3])  # 40 nodes; SGLang's beam offers 1 + 3 + 2 * 9 = 22 candidates
    e = export(t, "sglang")
    assert json.loads(e.text)["speculative_num_draft_tokens"] == 22
    assert any("capped at 22" in n for n in e.notes)


def test_unknown_format():
    with pytest.raises(ExportError) as info:
        export_tree(SMALL, "onnx")
    assert isinstance(info.value, TreeoptError)
    assert "unknown export format 'onnx'" in str(info.value) and "vllm" in str(info.value)


@pytest.mark.parametrize("fmt", ["medusa", "tensorrt-llm", "vllm", "sglang"])
def test_root_only_tree_cannot_go_to_an_engine(fmt):
    with pytest.raises(ExportError, match="only the root"):
        export_tree(Tree.chain(1), fmt)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_root_only_tree_exports_as_treeopt(tmp_path, fmt):
    tree, _ = load_any_tree(write(tmp_path, f"t.{fmt}", export_tree(Tree.chain(1), fmt)))
    assert tree == Tree.chain(1) and tree.size == 1


@pytest.mark.parametrize(
    "acceptance, message",
    [
        ([], "non-empty"),
        ([0.5, float("nan")], "NaN"),
        ([0.5, -0.1], "negative"),
        ([0.7, 0.6], "sums to"),
        ([[0.5]], "non-empty list"),
        (["x"], "list of numbers"),
    ],
)
def test_bad_acceptance(acceptance, message):
    with pytest.raises(ExportError, match=message):
        export_tree(SMALL, "vllm", acceptance=acceptance)


def test_exports_are_deterministic():
    for fmt in EXPORT_FORMATS:
        same = Tree.from_choices([[0, 0], [1], [0]])
        assert export_tree(SMALL, fmt, acceptance=P) == export_tree(same, fmt, acceptance=P)
        assert export_tree(SMALL, fmt).endswith("\n")


def test_choices_literal_styles():
    assert choices_literal(SMALL) == "[[0], [1], [0, 0]]"
    assert choices_literal(SMALL, tuples=True) == "[(0,), (1,), (0, 0)]"
    assert choices_literal(Tree.chain(1)) == "[]"


# ------------------------------------------------------------------------------------------- level-uniform


@pytest.mark.parametrize(
    "tree, branching",
    [
        (Tree.chain(1), ()),
        (Tree.chain(4), (1, 1, 1)),
        (Tree.from_choices([[0], [1], [2]]), (3,)),
        (Tree.from_choices([[0], [1], [0, 0], [1, 0]]), (2, 1)),
        (Tree.from_choices([[0], [0, 0], [0, 1]]), (1, 2)),
        (SMALL, None),
        (Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0]]), None),
        (Tree.from_choices([[0], [1], [0, 0], [1, 0], [0, 0, 0]]), None),  # uneven at depth 2
    ],
)
def test_level_branching(tree, branching):
    assert level_branching(tree) == branching
    assert is_level_uniform(tree) == (branching is not None)


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_level_uniform_detection_matches_what_vllm_drafts(t):
    assume(t.size > 1)
    literal = choices_literal(t, tuples=True)
    drafted = vllm_drafted_paths(literal)
    assert is_level_uniform(t) == (drafted == [tuple(c) for c in t.choices()])


def test_level_uniform_tree_hand_checked():
    t = level_uniform_tree([2, 3])
    assert t.size == 1 + 2 + 6 and t.level_widths == (1, 2, 6)
    assert t.children[1] == (3, 4, 5) and t.children[2] == (6, 7, 8)
    assert level_uniform_tree([]) == Tree.chain(1)
    with pytest.raises(ExportError, match=">= 1"):
        level_uniform_tree([2, 0])


@pytest.mark.parametrize("tree", [Tree.chain(5), level_uniform_tree([3, 2]), level_uniform_tree([1, 4, 1])])
@pytest.mark.parametrize("acceptance", [None, [0.95], [0.3, 0.3, 0.3]])
def test_level_uniform_tree_projects_to_itself(tree, acceptance):
    projected, lost = project_level_uniform(tree, acceptance)
    assert projected == tree and lost == 0.0


def test_projection_without_acceptance_width_matching_rule():
    # Level widths 1, 4, 6, 3, 2, 1 (17 nodes): widths become 4, 4, 4, 4 (17 nodes), the next level would not fit.
    choices = [[r] for r in range(4)]
    choices += [[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [3, 0]]
    choices += [[0, 0, 0], [0, 0, 1], [1, 0, 0]]
    choices += [[0, 0, 0, 0], [0, 0, 0, 1]]
    choices += [[0, 0, 0, 0, 0]]
    t = Tree.from_choices(choices)
    assert t.level_widths == (1, 4, 6, 3, 2, 1)
    projected, lost = project_level_uniform(t)
    assert lost is None
    assert level_branching(projected) == (4, 1, 1, 1)
    assert projected.size == 17 <= t.size


def test_projection_respects_max_depth():
    p = [0.9, 0.05]
    deep, _ = project_level_uniform(SMALL, p)
    assert deep == Tree.chain(4)  # unlimited depth: the chain wins for p_1 = 0.9
    shallow, lost = project_level_uniform(SMALL, p, max_depth=1)
    # Depth 1 and p_3 = 0 (the vector has two entries): two children, not three.
    assert shallow == level_uniform_tree([2]) and shallow.tree_depth == 1
    assert lost == pytest.approx(SMALL.expected_tokens(p) - (1 + 0.95))


def test_projection_all_zero_acceptance_gives_root():
    projected, lost = project_level_uniform(SMALL, [0.0, 0.0])
    assert projected == Tree.chain(1) and lost == pytest.approx(0.0)
    with pytest.raises(ExportError, match="all zero"):
        export_tree(SMALL, "vllm", acceptance=[0.0])


def test_projection_ignores_ranks_never_accepted():
    # p_2 = p_3 = 0: extra children would add nothing, so the projection never spends nodes on them.
    t = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0]])
    projected, _ = project_level_uniform(t, [0.8, 0.0, 0.0])
    assert projected == Tree.chain(6)


@settings(max_examples=60, deadline=None)
@given(random_trees(max_nodes=16), acceptance_vectors(), st.one_of(st.none(), st.integers(1, 5)))
def test_projection_is_the_best_level_uniform_tree(t, p, max_depth):
    assume(not is_level_uniform(t))
    projected, lost = project_level_uniform(t, p, max_depth=max_depth)
    assert is_level_uniform(projected)
    assert projected.size <= t.size
    if max_depth is not None:
        assert projected.tree_depth <= max_depth
    assert projected.expected_tokens(p) == pytest.approx(best_level_uniform_brute(p, t.size, max_depth), abs=1e-12)
    assert lost == pytest.approx(t.expected_tokens(p) - projected.expected_tokens(p))


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 40), acceptance_vectors(non_increasing=True))
def test_projection_of_an_optimal_tree_loses_nothing_negative(n, p):
    t = greedy_tree(p, n)  # optimal among all trees of <= n nodes for a non-increasing p
    for max_depth in (None, t.tree_depth):
        projected, lost = project_level_uniform(t, p, max_depth=max_depth)
        assert lost >= -1e-12
        assert is_level_uniform(projected) and projected.size <= t.size
        if is_level_uniform(t):
            assert projected == t and lost == 0.0
    e = export(t, "vllm", acceptance=p)
    assert e.lost_tokens >= -1e-12 and e.tree.size <= t.size and e.tree.tree_depth <= t.tree_depth
    assert vllm_drafted_paths(json.loads(e.text)["speculative_token_tree"]) == [tuple(c) for c in e.tree.choices()]


@settings(max_examples=60, deadline=None)
@given(random_trees(max_nodes=25))
def test_projection_without_acceptance_is_level_uniform_and_no_bigger(t):
    projected, lost = project_level_uniform(t)
    assert is_level_uniform(projected)
    assert projected.size <= t.size and projected.tree_depth <= t.tree_depth
    assert lost == (0.0 if is_level_uniform(t) else None)


def test_projection_of_a_large_tree_is_level_uniform_and_no_bigger():
    # a 1024-node tree (its speed is a benchmark's business, not a test's)
    p = [0.5, 0.2, 0.1, 0.05, 0.03, 0.02]
    t = greedy_tree(p, 1024)
    projected, lost = project_level_uniform(t, p, max_depth=t.tree_depth)
    assert not is_level_uniform(t)
    assert is_level_uniform(projected)
    assert projected.size <= 1024 and projected.tree_depth <= t.tree_depth
    assert lost > 0  # the greedy tree is not level-uniform: projecting it loses expected tokens


# ------------------------------------------------------------------------------------------- imports


@pytest.mark.parametrize(
    "value",
    [
        "[[0], [0, 0], [1]]",
        "  [[0], [0, 0], [1]]\n",
        "[(0,), (0, 0), (1,)]",
        '[[0],[1],[0,0]]',
        [[0], [0, 0], [1]],
        ((0,), (1,), (0, 0)),
        b"[[0], [0, 0], [1]]",
        "# Medusa choices\nmc = [[0], [0, 0], [1]]  # trailing comment\n",
        "mc: list = [[0], [0, 0], [1]]\n",
    ],
)
def test_import_choices_forms(value):
    assert import_choices(value) == SMALL


def test_import_choices_numpy_ranks():
    import numpy as np

    assert import_choices([np.array([0]), np.array([0, 0]), (np.int64(1),)]) == SMALL


def test_import_choices_by_name():
    text = "vicuna_7b = [[0], [1]]\nsmall = [[0], [0, 0], [1]]\n"
    assert import_choices(text, name="small") == SMALL
    with pytest.raises(TreeValidationError, match="several choice lists"):
        import_choices(text)
    with pytest.raises(TreeValidationError, match="no choice list named 'big'"):
        import_choices(text, name="big")


def test_import_choices_limits():
    with pytest.raises(TreeValidationError, match="allowed branching 1"):
        import_choices("[[0], [1]]", max_branching=1)


def test_import_choices_never_executes(tmp_path):
    marker = tmp_path / "pwned"
    text = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    with pytest.raises(TreeValidationError):
        import_choices(text)
    assert not marker.exists()


@pytest.mark.parametrize(
    "value, message",
    [
        ("", "empty"),
        ("[[0], [0, 0]", "not a Python/JSON literal"),
        ("[[0], [1 + 1]]", "not a literal"),
        ("[[0], [x]]", "not a literal"),
        ("import os", "only a literal"),
        ("{'a': 1}", "must be a list"),
        ("42", "must be a list"),
        ("[[0], [True]]", "integer ranks"),
        ("[[0], [0.0]]", "integer ranks"),
        ("[[0], 1]", "integer ranks"),
        ("[[0], [0, 0], [0, 0]]", "listed twice"),
        ("[[0, 0]]", "no parent"),
        ("[[1]]", "rank gap"),
        ("[[0], [-1]]", "negative rank"),
        ("[[0], []]", "empty choice"),
        ("[" * 500 + "]" * 500, ""),
    ],
)
def test_import_choices_errors(value, message):
    with pytest.raises(TreeValidationError) as info:
        import_choices(value)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_import_empty_list_is_root_only():
    assert import_choices("[]") == Tree.chain(1)


# ------------------------------------------------------------------------------------------- load_any_tree


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_any_yaml(tmp_path):
    meta = TreeMetadata(budget=4, solver="sequoia-dp", date="2024-05-01T12:00:00+00:00")
    tree, got = load_any_tree(write(tmp_path, "t.yaml", export_tree(SMALL, "yaml", meta)))
    assert tree == SMALL and got == meta


def test_load_any_yaml_flow_mapping(tmp_path):
    text = "{format: treeopt-tree/1, nodes: [{parent: -1, rank: 0}, {parent: 0, rank: 0}]}\n"
    assert load_any_tree(write(tmp_path, "t.yaml", text))[0] == Tree.chain(2)


def test_load_any_json_ignores_derived(tmp_path):
    meta = TreeMetadata(budget=4, expected_tokens_per_step=2.16, extra={"k": [1, 2]})
    doc = json.loads(export_tree(SMALL, "json", meta, acceptance=P))
    doc["derived"]["choices"] = [[0]]  # derived fields are never truth
    tree, got = load_any_tree(write(tmp_path, "t.json", json.dumps(doc)))
    assert tree == SMALL and got == meta


@pytest.mark.parametrize("fmt", ["medusa", "tensorrt-llm"])
def test_load_any_choice_list(tmp_path, fmt):
    tree, meta = load_any_tree(write(tmp_path, "t.txt", export_tree(SMALL, fmt)))
    assert tree == SMALL
    assert meta.solver == "import:medusa" and meta.budget == 4 and meta.max_depth == 2


def test_load_any_python_assignment(tmp_path):
    tree, _ = load_any_tree(write(tmp_path, "choices.py", "# from medusa_choices.py\nmc = [[0], [0, 0], [1]]\n"))
    assert tree == SMALL


def test_load_any_vllm_config(tmp_path):
    t = level_uniform_tree([2, 2])
    tree, meta = load_any_tree(write(tmp_path, "spec.json", export_tree(t, "vllm")))
    assert tree == t and meta.solver == "import:vllm"
    as_yaml = "num_speculative_tokens: 3\nspeculative_token_tree: '[(0,), (1,), (0, 0)]'\n"
    assert load_any_tree(write(tmp_path, "spec.yaml", as_yaml))[0] == SMALL


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("e.txt", "", "empty"),
        ("e.txt", "\n   \n", "empty"),
        ("b.json", "{not json", "not valid JSON"),
        ("b.json", '{"nodes": []}', "no 'format' key"),
        ("b.json", '{"format": "treeopt-tree/7", "nodes": [{"parent": -1, "rank": 0}]}', "unknown format"),
        ("b.json", '{"format": "treeopt-tree/1", "nodes": [{"parent": 0, "rank": 0}]}', "missing root"),
        ("b.json", '{"num_speculative_tokens": 5, "speculative_token_tree": "[(0,)]"}', "num_speculative_tokens is 5"),
        ("b.yaml", "format: treeopt-tree/1\nnodes: []\n", "non-empty list"),
        ("b.txt", "hello world", "not a treeopt-tree/1 YAML, a JSON export or a choice list"),
        # a broken YAML document is named as one (it was reported as a choice list that failed to parse)
        ("b.yaml", "format: treeopt-tree/1\nnodes: [\n", "not valid YAML (line 3, column 1: "),  # the parser's words vary
        ("b.yaml", "# a tree\nformat: treeopt-tree/1\nnodes:\n  - {parent: -1, rank: 0\n", "not valid YAML (line 5"),
        ("b.txt", "[[0], [0, 0], [0, 0]]", "listed twice"),
    ],
)
def test_load_any_errors(tmp_path, name, text, message):
    path = write(tmp_path, name, text)
    with pytest.raises(TreeValidationError) as info:
        load_any_tree(path)
    assert message in str(info.value)
    assert str(info.value).startswith(str(path))
    assert "\n" not in str(info.value)


def test_load_any_missing_and_binary(tmp_path):
    with pytest.raises(TreeValidationError, match="cannot read tree file"):
        load_any_tree(tmp_path / "nope.yaml")
    path = tmp_path / "bin.dat"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TreeValidationError, match="not a UTF-8 text file"):
        load_any_tree(path)


@settings(max_examples=60, deadline=None)
@given(random_trees())
def test_round_trips_random(tmp_path_factory, t):
    tmp = tmp_path_factory.mktemp("rt")
    meta = TreeMetadata(budget=t.size, max_depth=t.tree_depth, solver="test")
    for fmt in ("yaml", "json"):
        tree, got = load_any_tree(write(tmp, f"t.{fmt}", export_tree(t, fmt, meta)))
        assert tree == t and got == meta
    if t.size > 1:
        for fmt in ("medusa", "tensorrt-llm"):
            assert import_choices(export_tree(t, fmt)) == t
            assert load_any_tree(write(tmp, "c.txt", export_tree(t, fmt)))[0] == t
        e = export(t, "vllm")
        assert load_any_tree(write(tmp, "v.json", e.text))[0] == e.tree
        if is_level_uniform(t):
            assert e.tree == t


def test_yaml_text_of_choice_list_is_not_mistaken(tmp_path):
    # A YAML flow list is also a valid choice list; it must be read as one, not as a YAML document.
    assert load_any_tree(write(tmp_path, "c.yaml", "[[0], [1], [0, 0]]\n"))[0] == SMALL
    assert yaml.safe_load("[[0], [1], [0, 0]]") == [[0], [1], [0, 0]]


def test_brute_force_helper_sanity():
    # all_branchings enumerates exactly the level-uniform trees of <= n nodes
    assert sorted(all_branchings(4, None)) == sorted([(), (1,), (2,), (3,), (1, 1), (1, 2), (1, 1, 1)])
    assert max(len(b) for b in all_branchings(7, 2)) == 2


def test_vllm_export_says_which_releases_accept_it():
    e = export(Tree.from_choices([[0], [1], [0, 0], [1, 0]]), "vllm")
    assert e.warnings == ("only vLLM 0.10.1 to 0.20.2 accept speculative_token_tree: vLLM removed tree drafting "
                          "and its TREE_ATTN backend in May 2026 (vllm-project/vllm#42121), so 0.21.0 and later "
                          "reject this setting",)
    import sequoia_opt.exports as ex
    assert "0.10.1 to 0.20.2" in ex.__doc__ and "#42121" in ex.__doc__


def test_tensorrt_llm_limits_are_its_own():
    wide = Tree.from_choices([[i] for i in range(17)])  # ranks 0..16
    trt = export(wide, "tensorrt-llm")
    release = trt.warnings[0]  # which releases take a choice list at all (issue 29)
    assert release.startswith("only TensorRT-LLM up to the 1.3 release candidates take a choice list")
    assert trt.warnings[1:] == ("rank 16 > 15 (1 nodes): TensorRT-LLM keys a node by its ranks packed 4 bits per "
                                "level, so every rank must be <= 15; re-solve with --max-branching 16",)
    assert not any("Medusa's reference code" in n for n in trt.notes)
    assert export(Tree.from_choices([[i] for i in range(16)]), "tensorrt-llm").warnings == (release,)
    deep = export(Tree.chain(18), "trtllm")  # 18 nodes, depth 17
    assert deep.warnings[1:] == ("depth 17 > 16: TensorRT-LLM's 64-bit rank-path key holds at most 16 levels; "
                                 "re-solve with --max-depth 16",)
    assert export(wide, "medusa").warnings == ()
