"""The depth-dependent DP (solver/depth.py): exact against brute force on small trees, equal to the positional
DP with one row, consistent with its own reconstruction, usable by choose(); and the `auto` acceptance model
of `treeopt solve`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sequoia_opt.cli import app
from sequoia_opt.errors import SolverError
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, save_acceptance, save_latency
from sequoia_opt.solver import choose, expected_tokens_by_depth, solve_dp, solve_dp_by_depth
from sequoia_opt.solver.depth import resolve_acceptance_model, solve_profile
from sequoia_opt.tree import Tree, load_tree

sys.path.insert(0, str(Path(__file__).parent))


def _all_trees(n: int, D: int, B: int) -> list[Tree]:
    """Every tree of at most n nodes, depth <= D, branching <= B whose children take a prefix of ranks."""
    seen, out = set(), []

    def grow(nodes: tuple) -> None:
        key = tuple(sorted(nodes))
        if key in seen:
            return
        seen.add(key)
        out.append(Tree.from_choices([list(c) for c in nodes if c]) if len(nodes) > 1 else Tree.chain(1))
        if len(nodes) >= n:
            return
        for v in nodes:
            kids = sum(1 for c in nodes if len(c) == len(v) + 1 and c[:-1] == v)
            if len(v) < D and kids < B:
                grow(nodes + (v + (kids,),))

    grow(((),))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_depth_dp_is_exact_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    P = rng.dirichlet(np.ones(4), size=3)[:, :3] * rng.uniform(0.5, 1.0)
    trees = _all_trees(6, 3, 2)
    sol = solve_dp_by_depth(P, 6, 3, 2)
    for m in range(1, 7):
        for d in range(0, 4):
            best = max(expected_tokens_by_depth(t, P) for t in trees if t.size <= m and t.tree_depth <= d)
            assert sol.table[m, d] == pytest.approx(best, rel=1e-12)
            t = sol.tree(m, d)
            assert t.size <= m and t.tree_depth <= d
            assert expected_tokens_by_depth(t, P) == pytest.approx(best, rel=1e-9)


def test_one_row_is_the_positional_dp():
    p = [0.45, 0.2, 0.08, 0.03]
    a, b = solve_dp(p, 40, 7, 4), solve_dp_by_depth([p], 40, 7, 4)
    np.testing.assert_allclose(b.table, a.table, rtol=1e-12)
    for m, d in ((8, 3), (40, 7), (17, 5)):
        assert b.tree(m, d).choices() == a.tree(m, d).choices()
        assert expected_tokens_by_depth(b.tree(m, d), [p]) == pytest.approx(b.tree(m, d).expected_tokens(p))


def test_runs_of_acceptance_make_deeper_chains():
    # lookup-like: the first token rarely matches, the following ones mostly do
    P = [[0.2, 0.05], [0.7, 0.05], [0.9, 0.02]]
    depth_sol, pos_sol = solve_dp_by_depth(P, 8, 8, 2), solve_dp(np.mean(P, axis=0), 8, 8, 2)
    assert depth_sol.tree(8, 8).tree_depth > pos_sol.tree(8, 8).tree_depth
    chain = Tree.chain(7)
    want = 1 + 0.2 + sum(0.2 * 0.7 * 0.9 ** k for k in range(5))  # depths 0, 1, 2..6
    assert expected_tokens_by_depth(chain, P) == pytest.approx(want)
    widths = depth_sol.level_widths_many([8, 4, 8], [8, 8, 2])
    for row, (m, d) in zip(widths, ((8, 8), (4, 8), (8, 2))):
        assert list(row[row > 0]) == list(depth_sol.tree(m, d).level_widths)


def test_choose_takes_a_depth_solution():
    P = [[0.2, 0.05], [0.7, 0.05], [0.9, 0.02]]
    curve = LatencyCurve.synthetic({n: 10.0 + 0.5 * n for n in range(1, 33)}, {w: 0.1 for w in range(1, 33)})
    sol = solve_dp_by_depth(P, 32, 8, 2)
    ch = choose(np.mean(P, axis=0), curve, 32, 8, 2, solution=sol)
    assert ch.expected_tokens == pytest.approx(expected_tokens_by_depth(ch.tree, P))
    assert ch.expected_tokens == pytest.approx(sol.table[ch.budget, ch.depth])


@pytest.mark.parametrize("bad, msg", [([], "at least one"), ([[0.5], [0.2, 0.1]], "one length"),
                                      ([[0.9, 0.3]], "sum")])
def test_bad_depth_vectors_are_refused(bad, msg):
    with pytest.raises(SolverError, match=msg):
        solve_dp_by_depth(bad, 4, 2)


def _profile(consistent, by_depth=None) -> AcceptanceProfile:
    measured = {"mode": "greedy", "temperature": 0.0, "draft": "lookup:1-3", "target": "t"}
    if consistent is not None:
        measured["positional_consistent"] = consistent
    by_depth = by_depth if by_depth is not None else {1: [0.2, 0.05], 2: [0.7, 0.05], 4: [0.9, 0.02]}
    return AcceptanceProfile(id="p", acceptance=np.array([0.5, 0.04]), measured=measured,
                             by_depth={k: np.array(v) for k, v in by_depth.items()})


def test_acceptance_model_auto_and_depth_rows():
    prof = _profile(False)
    # depth 3 had too few trials: it repeats depth 2's vector
    np.testing.assert_allclose(prof.depth_rows(), [[0.2, 0.05], [0.7, 0.05], [0.7, 0.05], [0.9, 0.02]])
    assert resolve_acceptance_model(prof) == "by-depth"
    assert resolve_acceptance_model(_profile(True)) == "positional"
    assert resolve_acceptance_model(_profile(None)) == "positional"
    assert resolve_acceptance_model(prof, "positional") == "positional"
    assert resolve_acceptance_model(_profile(False, {1: [0.2, 0.05]})) == "positional"  # one depth: no test
    with pytest.raises(SolverError, match="no per-depth vectors"):
        resolve_acceptance_model(_profile(None, {}), "by-depth")
    with pytest.raises(SolverError, match="unknown acceptance model"):
        resolve_acceptance_model(prof, "deep")
    sol, used = solve_profile(prof, 16, 6, 2)
    assert used == "by-depth" and sol.table[16, 6] == pytest.approx(
        expected_tokens_by_depth(sol.tree(16, 6), prof.depth_rows()))


def test_solve_cli_uses_the_per_depth_vectors_when_the_positional_check_failed(tmp_path):
    acc, lat, out = tmp_path / "acc.yaml", tmp_path / "lat.yaml", tmp_path / "tree.yaml"
    save_acceptance(acc, _profile(False))
    save_latency(lat, LatencyCurve.synthetic({n: 10.0 + 0.5 * n for n in range(1, 33)}, {w: 0.1 for w in range(1, 33)}))
    r = CliRunner().invoke(app, ["solve", "-a", str(acc), "-l", str(lat), "--budget", "32", "--max-depth", "8",
                                 "-b", "2", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    tree, meta = load_tree(out)
    assert doc["acceptance_model"] == "by-depth" and meta.extra["acceptance_model"] == "by-depth"
    assert meta.expected_tokens_per_step == pytest.approx(expected_tokens_by_depth(tree, _profile(False).depth_rows()))
    # each node's rate once its parent is accepted, as treeopt run checks it: the product along a path is G's term
    rates = meta.extra["node_rates"]
    assert len(rates) == tree.size - 1
    reach = [1.0] + [0.0] * (tree.size - 1)
    for v in range(1, tree.size):
        reach[v] = reach[int(tree.parent[v])] * rates[v - 1]
    assert sum(reach) == pytest.approx(meta.expected_tokens_per_step, rel=1e-5)
    r = CliRunner().invoke(app, ["solve", "-a", str(acc), "-l", str(lat), "--budget", "32", "--max-depth", "8",
                                 "-b", "2", "--acceptance-model", "positional", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["acceptance_model"] == "positional"
    r = CliRunner().invoke(app, ["solve", "-a", str(acc), "--acceptance-model", "deep", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown --acceptance-model 'deep'" in r.output
    assert not (tmp_path / "x").exists()
