"""The value model checked node by node where a tree runs (issue 31, value models in context): each node's rate of
acceptance once its parent was, counted from a run's steps, against the rate the solver valued it at."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from sequoia_opt.decoding.stats import NodeAcceptance, StepStats
from sequoia_opt.jobs.run import TreeEntry, node_acceptance_rows, node_misses, run_trees
from sequoia_opt.profiles import AcceptanceProfile
from sequoia_opt.solver.depth import ValueModel
from sequoia_opt.tree import Tree, TreeMetadata

sys.path.insert(0, str(Path(__file__).parent))

TREE = Tree.from_choices([[0], [1], [0, 0], [1, 0]])  # nodes 1 = [0], 2 = [1], 3 = [0, 0], 4 = [1, 0]


def _step(ranks, size=TREE.size) -> StepStats:
    return StepStats(tokens=(1,) * (len(ranks) + 1), accepted_len=len(ranks) + 1, accepted_nodes=len(ranks),
                     accepted_ranks=tuple(ranks), visits=(), draft_ms=0.0, verify_ms=0.0, bookkeeping_ms=0.0,
                     tree_size=size, tree_depth=2)


def test_counts_follow_the_accepted_path_and_skip_clipped_steps():
    na = NodeAcceptance(TREE).add([_step([]), _step([0]), _step([0, 0]), _step([1]), _step([1, 0]), _step([1, 0]),
                                   _step([0], size=3)])  # the last one verified a clipped tree: not counted
    assert na.skipped == 1
    assert na.reached.tolist() == [6, 6, 6, 2, 3] and na.accepted.tolist() == [6, 2, 3, 1, 2]
    rows = na.rows()
    assert [r["node"] for r in rows] == [[0], [1], [0, 0], [1, 0]]
    assert [r["rate"] for r in rows] == pytest.approx([2 / 6, 3 / 6, 1 / 2, 2 / 3])
    assert NodeAcceptance(TREE).rows()[3]["rate"] is None  # never reached


def test_the_value_models_node_rates_are_its_conditional_acceptances():
    acc = AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.2]), counts=None, measured={},
                            by_depth={1: np.array([0.6, 0.2]), 2: np.array([0.3, 0.1])})
    assert ValueModel.of_profile(acc, "positional").node_rates(TREE) == pytest.approx([0.6, 0.2, 0.6, 0.6])
    assert ValueModel.of_profile(acc, "by-depth").node_rates(TREE) == pytest.approx([0.6, 0.2, 0.3, 0.3])


def test_misses_are_the_nodes_whose_prediction_leaves_their_interval():
    rows = [{"node": [0], "reached": 400, "accepted": 200, "rate": 0.5, "predicted": 0.52},   # inside
            {"node": [1, 0], "reached": 120, "accepted": 37, "rate": 37 / 120, "predicted": 0.51},  # far below
            {"node": [2, 0], "reached": 10, "accepted": 0, "rate": 0.0, "predicted": 0.5},     # too few trials
            {"node": [0, 0], "reached": 300, "accepted": 240, "rate": 0.8, "predicted": 0.55}]  # far above
    assert node_misses(rows) == ["[0, 0] 0.80 of 300 (predicted 0.55)", "[1, 0] 0.31 of 120 (predicted 0.51)"]
    assert node_misses(rows, most=1) == ["[0, 0] 0.80 of 300 (predicted 0.55)"]
    assert node_misses([{**r, "predicted": None} for r in rows]) == []


def test_a_runs_node_counts_add_up_to_its_accepted_tokens():
    """On tiny models: every step reaches each root child once, the accepted nodes over all nodes are the steps'
    accepted drafts, and the tree file's rates come back as ``predicted``."""
    from test_decoding import _model, _perturbed

    target = _model(0)
    draft = _perturbed(target, 0.3, seed=1)
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    meta = TreeMetadata(extra={"node_rates": [0.5] * (tree.size - 1)})
    prompts = [[(7 * i + j) % 200 + 3 for j in range(12)] for i in range(4)]
    report = run_trees(target, draft, [TreeEntry("t", tree, meta)], prompts, max_new_tokens=24, warmup=False)
    s = next(x for x in report.summaries if x.tree == "t")
    assert s.mismatches == 0
    rows = s.node_acceptance
    assert [r["node"] for r in rows] == tree.choices() and all(r["predicted"] == 0.5 for r in rows)
    # every step that drafted reached each root child once: all but a prompt's last step when one token was left
    # (the root alone); a step cut to fewer levels at an answer's end counts the nodes it held
    reached = [r["reached"] for r in rows if r["depth"] == 1]
    assert reached == [reached[0]] * 3 and s.steps - len(prompts) <= reached[0] <= s.steps
    accepted_drafts = round((s.tokens_per_step_untruncated - 1) * s.steps)  # accepted nodes + 1 per step
    assert sum(r["accepted"] for r in rows) == accepted_drafts > 0
    by_node = {tuple(r["node"]): r for r in rows}
    assert by_node[(0, 0)]["reached"] == by_node[(0,)]["accepted"]  # a child is tried whenever its parent is accepted
    assert 0 < by_node[(1,)]["accepted"] < by_node[(1,)]["reached"]  # rank 1 is accepted sometimes, not always
    assert node_acceptance_rows(tree, [], meta)[0]["reached"] == 0
