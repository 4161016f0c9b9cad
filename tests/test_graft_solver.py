"""The graft solver (solver/graft.py, issue 16): the value model on a hand-built tree, the per-drafter cost,
the DP exact against brute force, equal to the single-drafter DPs, the hardware-aware choice against brute
force, baselines, and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from sequoia_opt.errors import ProfileError, SolverError
from sequoia_opt.profiles import LatencyCurve
from sequoia_opt.solver import choose, solve_dp, solve_dp_by_depth
from sequoia_opt.solver.graft import (
    GraftAcceptance,
    graft_baselines,
    graft_depth_family,
    graft_expected_tokens,
    graft_step_cost,
    merge_trees,
    optimal_graft_tree,
    pair_curve,
    solve_graft,
    solve_graft_dp,
)
from sequoia_opt.solver.reference import brute_force_graft
from sequoia_opt.tree import DrafterTree, Tree

# The hand-built tree of tests/test_tree_v2.py (light = 0, strong = 1):
#   0 root
#   ├── 1 light r0          ├── 4 light r0 (under 1)    └── 5 strong, 1 light sibling (under 1)
#   ├── 2 light r1
#   └── 3 strong, 2 light siblings ── 6 strong, alone ── 7 light r0
HAND = DrafterTree(Tree(parent=[-1, 0, 0, 0, 1, 1, 3, 6], rank=[0, 0, 1, 2, 0, 1, 0, 0]),
                   (0, 0, 0, 1, 0, 1, 1, 0), ("light", "strong"))
HAND_ACC = GraftAcceptance(light=[[0.5, 0.2], [0.6, 0.1]],
                           strong={0: [[0.4, 0.1]], 1: [[0.2, 0.1]], 2: [[0.15, 0.05]]})
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8]


def _curves(target, light, strong, overhead=0.0, strong_model="per-level", tokens=TOKENS):
    """(target curve, [light curve, strong curve]) from ms functions of the token count."""
    t = {n: target(n) for n in tokens}
    lc = LatencyCurve.synthetic(t, {n: light(n) for n in tokens}, step_overhead_ms=overhead, id="light")
    sc = LatencyCurve.synthetic(t, {n: strong(n) for n in tokens}, id="strong", cost_model=strong_model)
    return lc, [lc, sc]


# ------------------------------------------------------------------------------------------------ value model
def test_expected_tokens_hand_computed():
    # 1 + 0.5 + 0.2 + 0.15 (strong given 2 light) + 0.5*0.6 (depth 2: light row 1) + 0.5*0.2 (strong given 1)
    #   + 0.15*0.4 (strong alone) + 0.15*0.4*0.6 (depth 3 uses the last light row) = 2.346
    assert graft_expected_tokens(HAND, HAND_ACC) == pytest.approx(2.346, abs=1e-12)


def test_step_cost_hand_computed():
    # T(n) = 9 + n, overhead 0.5; light c(w) = 0.5 + 0.5 w; strong c(w) = 2 + w
    tc, dcs = _curves(lambda n: 9.0 + n, lambda w: 0.5 + 0.5 * w, lambda w: 2.0 + w, overhead=0.5)
    c = graft_step_cost(HAND, tc, dcs, acceptance=HAND_ACC)
    # light processes levels (1, 2, 1): 1.0 + 1.5 + 1.0; strong (1, 2): 3 + 4; target T(8) = 17
    assert c.draft_ms == pytest.approx(10.5)
    assert c.target_ms == pytest.approx(17.0) and c.overhead_ms == 0.5
    assert c.cost_ms == pytest.approx(28.0)
    assert c.tokens_per_s == pytest.approx(1000 * 2.346 / 28.0)
    assert c.speedup == pytest.approx(1000 * 2.346 / 28.0 * 10.5 / 1000)  # plain: T(1) + overhead = 10.5 ms
    # a one-pass strong drafter: one forward over its 3 nodes, c(3) = 5
    tc, dcs = _curves(lambda n: 9.0 + n, lambda w: 0.5 + 0.5 * w, lambda w: 2.0 + w, 0.5, "one-pass")
    assert graft_step_cost(HAND, tc, dcs, expected_tokens=2.346).cost_ms == pytest.approx(3.5 + 5 + 17 + 0.5)
    # without G only the cost is known
    assert np.isnan(graft_step_cost(HAND, tc, dcs).tokens_per_s)


def test_single_drafter_cost_matches_hardware_when_no_inner_leaf():
    from sequoia_opt.solver import score_tree

    tc, dcs = _curves(lambda n: 9.0 + n, lambda w: 0.5 + 0.5 * w, lambda w: 2.0 + w, overhead=0.5)
    t = Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0]])  # every level but the last has children only
    g = t.expected_tokens([0.5, 0.2])
    a = graft_step_cost(DrafterTree.single(t, "light"), tc, dcs[:1], expected_tokens=g)
    b = score_tree(t, [0.5, 0.2], pair_curve(tc, dcs[0]))
    assert a == b


def test_never_extrapolates():
    tc, dcs = _curves(lambda n: 9.0 + n, lambda w: 1.0, lambda w: 1.0)
    wide = DrafterTree.single(Tree(parent=[-1] + [0] * 8, rank=[0] + list(range(8))), "light")
    with pytest.raises(ProfileError, match="extrapolate"):  # 9 nodes: T(9) is not measured
        graft_step_cost(wide, tc, dcs[:1], expected_tokens=1.0)


# ------------------------------------------------------------------------------------------------ the DP
def _random_acc(rng, K0, K1, R, keys):
    light = rng.dirichlet(np.ones(K0 + 1), size=R)[:, :K0] * rng.uniform(0.2, 0.9)
    strong = {}
    for a in keys:
        rows = [rng.dirichlet(np.ones(K1 + 1) * 0.7)[:K1] * (1 - light[r, :a].sum()) * rng.uniform(0.7, 1.0)
                for r in range(R)]
        strong[a] = np.array(rows)
    return GraftAcceptance(light, strong)


CASES = [  # (seed, K0, K1, R, keys, B)
    (0, 3, 3, 2, (0, 1, 2), 3),
    (1, 2, 3, 1, (0, 2), 3),
    (2, 3, 2, 3, (1,), 3),
    (3, 1, 3, 2, (0, 1), 4),
    (4, 3, 3, 1, (0, 1, 2, 3), 2),
    (5, 2, 2, 2, (2,), 4),
]


def _light_under_strong(t: DrafterTree) -> bool:
    """Some light node's parent is a strong node (what the graft policy refuses), by the parents alone."""
    return any(t.drafter[v] == 0 and t.drafter[t.parent[v]] == 1 for v in range(1, t.size))


@pytest.mark.parametrize("lus", [False, True])
@pytest.mark.parametrize("seed, K0, K1, R, keys, B", CASES)
def test_dp_equals_brute_force(seed, K0, K1, R, keys, B, lus):
    """Exact for every budget <= 7 and depth <= 4, with light nodes under strong ones (lus) and without (the
    graft policy's rule: a strong node's children are the strong's own ranks)."""
    acc = _random_acc(np.random.default_rng(seed), K0, K1, R, keys)
    sol = solve_graft_dp(acc, 7, 4, max_branching=B, light_under_strong=lus)
    grafted = 0
    for D in range(1, 5):
        bf = brute_force_graft(acc, None, None, 7, D, B, light_under_strong=lus)
        best = 0.0
        for m in range(1, 8):
            if not lus and m in bf.best_g_by_size:
                assert not bf.best_g_by_size[m][1].light_under_strong
            best = max(best, bf.best_g_by_size.get(m, (0.0,))[0])  # no tree of exactly m nodes: 0
            assert sol.table[m, D] == pytest.approx(best, rel=1e-12, abs=1e-12)  # exact
            t = sol.tree(m, D)
            assert t.size <= m and t.tree_depth <= D and t.tree.max_branching_used <= B
            assert graft_expected_tokens(t, acc) == pytest.approx(best, rel=1e-9)
            assert lus or not (t.light_under_strong or _light_under_strong(t))
            grafted += t.drafter_counts[1] > 0
    assert grafted > 0  # the optimum does use the strong drafter in these cases


def test_brute_force_spaces():
    """Without light nodes under strong ones the brute force enumerates a strict subset, and the maximum G
    is at most the unrestricted one's (strictly below it in some case: the rule costs something)."""
    lower = 0
    for seed, K0, K1, R, keys, B in CASES[:3]:
        acc = _random_acc(np.random.default_rng(seed), K0, K1, R, keys)
        free = brute_force_graft(acc, None, None, 6, 3, B, light_under_strong=True)
        rule = brute_force_graft(acc, None, None, 6, 3, B)
        assert rule.count < free.count
        for m, (g, t) in rule.best_g_by_size.items():
            assert not t.light_under_strong and g <= free.best_g_by_size[m][0] + 1e-12
            lower += g < free.best_g_by_size[m][0] - 1e-9
    assert lower > 0


@pytest.mark.parametrize("lus", [False, True])
def test_dp_cases_cover_mixed_trees(lus):
    """At least one optimal tree of the cases above holds both drafters' nodes, a strong graft next to light
    siblings included (the DP's hardest option); with lus, some hold a light node under a strong one."""
    mixed = under = 0
    for seed, K0, K1, R, keys, B in CASES:
        acc = _random_acc(np.random.default_rng(seed), K0, K1, R, keys)
        sol = solve_graft_dp(acc, 7, 4, max_branching=B, light_under_strong=lus)
        for m in range(2, 8):
            t = sol.tree(m, 4)
            mixed += any(t.drafter[c] == 1 and any(t.drafter[s] == 0 for s in t.children[t.parent[c]])
                         for c in range(1, t.size))
            under += t.light_under_strong
    assert mixed >= 3
    assert (under > 0) if lus else under == 0


def test_graft_depths_restrict_where_the_strong_grafts():
    acc = _random_acc(np.random.default_rng(0), 3, 3, 2, (0, 1, 2))
    for lus in (False, True):
        none = solve_graft_dp(acc, 12, 4, graft_depths=(), light_under_strong=lus)
        root = solve_graft_dp(acc, 12, 4, graft_depths={0}, light_under_strong=lus)
        full = solve_graft_dp(acc, 12, 4, light_under_strong=lus)
        assert np.all(none.table <= root.table + 1e-12) and np.all(root.table <= full.table + 1e-12)
        assert full.table[12, 4] > none.table[12, 4]
        assert none.tree(12, 4).drafter_counts[1] == 0
        t = root.tree(12, 4)
        if lus:  # graft_depths limits every strong child
            assert all(t.depth[v] == 1 for v in range(1, t.size) if t.drafter[v] == 1)
        else:  # it limits grafts under light parents; the strong's recovered path goes on below
            grafts = [v for v in range(1, t.size) if t.drafter[v] == 1 and t.drafter[t.parent[v]] == 0]
            assert grafts and all(t.depth[v] == 1 for v in grafts)
    # the graft policy's rule can only cost G
    free = solve_graft_dp(acc, 12, 4, light_under_strong=True)
    rule = solve_graft_dp(acc, 12, 4)
    assert np.all(rule.table <= free.table + 1e-12)


def test_strong_leaves_without_the_strong_own_vector():
    """No a = 0 vector: under the graft policy's rule a strong node has no children (its own vector is
    unknown); with light nodes under strong ones allowed it may have light children or grafts."""
    acc = _random_acc(np.random.default_rng(2), 3, 2, 3, (1,))
    rule = solve_graft_dp(acc, 16, 5, max_branching=3)
    free = solve_graft_dp(acc, 16, 5, max_branching=3, light_under_strong=True)
    inner = 0
    for m in range(2, 17):
        t = rule.tree(m, 5)
        assert all(not t.children[v] for v in range(1, t.size) if t.drafter[v] == 1)
        f = free.tree(m, 5)
        inner += any(f.children[v] for v in range(1, f.size) if f.drafter[v] == 1)
    assert rule.tree(16, 5).drafter_counts[1] > 0 and inner > 0
    for m, (g, t) in brute_force_graft(acc, None, None, 7, 4, 3).best_g_by_size.items():
        assert all(not t.children[v] for v in range(1, t.size) if t.drafter[v] == 1)


def test_strong_path_depths():
    acc = _random_acc(np.random.default_rng(0), 3, 3, 2, (0, 1, 2))
    full = solve_graft_dp(acc, 14, 4)
    leaves = solve_graft_dp(acc, 14, 4, strong_path_depths=())
    assert np.all(leaves.table <= full.table + 1e-12) and full.table[14, 4] > leaves.table[14, 4]
    t = leaves.tree(14, 4)
    assert t.drafter_counts[1] > 0 and all(not t.children[v] for v in range(1, t.size) if t.drafter[v] == 1)
    assert graft_expected_tokens(t, acc) == pytest.approx(leaves.table[14, 4], rel=1e-9)
    t = optimal_graft_tree(acc, 14, 4, strong_path_depths={0, 1})  # strong children at parent depths 0, 1 only
    assert all(t.depth[v] <= 2 for v in range(1, t.size) if t.drafter[v] == 1 and t.drafter[t.parent[v]] == 1)
    with pytest.raises(SolverError, match="strong_path_depths"):
        solve_graft_dp(acc, 5, 3, light_under_strong=True, strong_path_depths=())
    with pytest.raises(SolverError, match="strong path depth -1"):
        solve_graft_dp(acc, 5, 3, strong_path_depths=[-1])
    with pytest.raises(SolverError, match="light_under_strong must be True or False"):
        solve_graft_dp(acc, 5, 3, light_under_strong=1)


def test_drafter_tree_light_under_strong():
    assert HAND.light_under_strong  # node 7, light, under strong node 6
    assert not merge_trees(Tree.from_choices([[0], [1]]), Tree.from_choices([[0], [0, 0]])).light_under_strong
    assert not DrafterTree.single(Tree.from_choices([[0], [0, 0]])).light_under_strong
    # a strong node under a light one is fine; a light one under a strong one is not
    assert not DrafterTree(Tree(parent=[-1, 0, 1], rank=[0, 0, 0]), (0, 0, 1), ("l", "s")).light_under_strong
    assert DrafterTree(Tree(parent=[-1, 0, 1], rank=[0, 0, 0]), (0, 1, 0), ("l", "s")).light_under_strong


@pytest.mark.parametrize("lus", [False, True])
def test_single_drafter_equals_existing_dps(lus):
    kw = {"light_under_strong": lus}
    rng = np.random.default_rng(7)
    P = rng.dirichlet(np.ones(5), size=3)[:, :4] * 0.9
    light_only = solve_graft_dp(GraftAcceptance(P, {}), 20, 5, max_branching=3, **kw)
    assert np.allclose(light_only.table, solve_dp_by_depth(P, 20, 5, 3).table, rtol=1e-12, atol=0)
    no_graft = solve_graft_dp(GraftAcceptance(P, {0: P}), 20, 5, max_branching=3, graft_depths=(), **kw)
    assert np.allclose(no_graft.table, light_only.table, rtol=1e-12, atol=0)
    p = [0.55, 0.2, 0.1]
    one_row = solve_graft_dp(GraftAcceptance([p], {}), 30, 6, max_branching=4, **kw)
    assert np.allclose(one_row.table, solve_dp(p, 30, 6, 4).table, rtol=1e-12, atol=0)
    # the strong drafter alone: a light that never hits
    strong_only = solve_graft_dp(GraftAcceptance([[0.0, 0.0]], {0: [p]}), 30, 6, max_branching=4, **kw)
    assert np.allclose(strong_only.table, solve_dp(p, 30, 6, 4).table, rtol=1e-12, atol=0)
    t = optimal_graft_tree(GraftAcceptance([[0.0, 0.0]], {0: [p]}), 30, 6, max_branching=4, **kw)
    assert t.drafter_counts[0] == 0 and t.size == 30
    assert t.tree.expected_tokens(p) == pytest.approx(solve_dp(p, 30, 6, 4).table[30, 6], rel=1e-12)
    # below a strong root child the recovered path is not limited by graft_depths (only by the depth limit)
    t = optimal_graft_tree(GraftAcceptance([[0.0, 0.0]], {0: [p]}), 30, 6, max_branching=4, graft_depths={0})
    assert t.size == 30 and t.tree_depth == 6 and t.drafter_counts[0] == 0


# ------------------------------------------------------------------------------------------------ choice
def _random_curves(rng):
    base, slope = rng.uniform(5, 20), rng.uniform(0, 3.0) * rng.choice([0.1, 1, 3])
    jump = rng.uniform(0, 0.5)
    cl0, cl1, cs0, cs1 = rng.uniform(0, 1), rng.uniform(0, 0.3), rng.uniform(0.2, 6), rng.uniform(0, 1.5)
    model = "one-pass" if rng.uniform() < 0.3 else "per-level"
    return _curves(lambda n: base + slope * (n - 1) + jump * (n > 1), lambda w: cl0 + cl1 * (w - 1),
                   lambda w: cs0 + cs1 * (w - 1), overhead=rng.uniform(0, 1), strong_model=model)


# Seeds 0..999 (solver/graft.py docstring). The graft policy's rule (the default): 927 and 54 are the two
# worst (0.9839, 0.9858); 555 was the worst (0.9754) before solve_graft also tried strong leaves
# (strong_path_depths = {}). Light nodes under strong ones allowed: 927 and 378 are the two worst (0.9839,
# 0.9864; 378's best tree has a light node under a strong one).
@pytest.mark.parametrize("seed, lus", [(s, False) for s in list(range(12)) + [54, 555, 927]]
                         + [(378, True), (927, True)])
def test_solve_graft_against_brute_force(seed, lus):
    rng = np.random.default_rng(seed)
    K0, K1, R = (int(x) for x in (rng.integers(1, 4), rng.integers(1, 4), rng.integers(1, 3)))
    keys = sorted({0} | {int(x) for x in rng.integers(0, K0 + 1, size=2)})
    acc = _random_acc(rng, K0, K1, R, keys)
    tc, dcs = _random_curves(rng)
    budget, D, B = int(rng.integers(4, 8)), int(rng.integers(2, 5)), int(rng.integers(2, 5))
    ch = solve_graft(acc, tc, dcs, budget=budget, max_depth=D, max_branching=B, light_under_strong=lus)
    bf = brute_force_graft(acc, tc, dcs, budget, D, B, light_under_strong=lus)
    ratio = ch.tokens_per_s / bf.best_cost.tokens_per_s
    assert 0.98 <= ratio <= 1 + 1e-12  # worst measured 0.9839 (seed 927), both settings
    again = graft_step_cost(ch.dtree, tc, dcs, acceptance=acc)  # the choice's numbers are its tree's
    assert again.tokens_per_s == pytest.approx(ch.tokens_per_s, rel=1e-9)
    assert ch.candidates[0]["tokens_per_s"] == pytest.approx(ch.tokens_per_s, rel=1e-9)
    if lus:
        assert ch.strong_path_depths is None
        return
    # what the graft policy runs: no light node under a strong one, in the choice or any candidate
    assert not ch.dtree.light_under_strong and not _light_under_strong(ch.dtree)
    assert not bf.best.light_under_strong
    sd = ch.strong_path_depths
    assert sd is not None and ch.candidates[0]["strong_path_depths"] == list(sd)
    same = optimal_graft_tree(acc, ch.budget, ch.depth, max_branching=B, graft_depths=ch.graft_depths,
                              strong_path_depths=sd) if ch.plan != "strong only" else ch.dtree
    assert same == ch.dtree  # the recorded limits reproduce the tree
    for row in solve_graft(acc, tc, dcs, budget=budget, max_depth=D, max_branching=B, top=1000).candidates:
        assert row["strong_path_depths"] is not None


def test_solve_graft_never_puts_light_under_strong():
    """On the random cases of the measurement protocol, the default's every candidate tree (not only the
    best) keeps the graft policy's rule; with light_under_strong some chosen tree breaks it."""
    broken = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        K0, K1, R = (int(x) for x in (rng.integers(1, 4), rng.integers(1, 4), rng.integers(1, 3)))
        keys = sorted({0} | {int(x) for x in rng.integers(0, K0 + 1, size=2)})
        acc = _random_acc(rng, K0, K1, R, keys)
        tc, dcs = _random_curves(rng)
        budget, D, B = int(rng.integers(4, 8)), int(rng.integers(2, 5)), int(rng.integers(2, 5))
        ch = solve_graft(acc, tc, dcs, budget=budget, max_depth=D, max_branching=B)
        assert not ch.dtree.light_under_strong
        for m in range(1, budget + 1):
            for gd in graft_depth_family(D):
                for sd in (None, ()):
                    t = optimal_graft_tree(acc, m, D, max_branching=B, graft_depths=gd, strong_path_depths=sd)
                    assert not t.light_under_strong
        broken += solve_graft(acc, tc, dcs, budget=budget, max_depth=D, max_branching=B,
                              light_under_strong=True).dtree.light_under_strong
    assert broken > 0


PAYS = GraftAcceptance(light=[[0.3, 0.1]], strong={0: [[0.75, 0.1]], 2: [[0.45, 0.1]]})


def test_grafting_pays_when_the_strong_is_cheap_and_good():
    tc, dcs = _curves(lambda n: 10.0 + 0.05 * (n - 1), lambda w: 0.05, lambda w: 0.5)
    ch = solve_graft(PAYS, tc, dcs, budget=8, max_depth=4, max_branching=4)
    assert ch.dtree.drafter_counts[1] > 0 and ch.plan in ("graft", "strong only")
    light_best = max(r["tokens_per_s"] for r in
                     solve_graft(PAYS, tc, dcs, budget=8, max_depth=4, max_branching=4,
                                 graft_depths_family=[()], strong_only=False, top=100).candidates)
    assert ch.tokens_per_s > 1.3 * light_best
    rows = {r["name"]: r for r in graft_baselines(PAYS, tc, dcs, budget=8, max_depth=4, max_branching=4)}
    assert ch.tokens_per_s >= max(r["tokens_per_s"] for r in rows.values() if r["tokens_per_s"]) - 1e-9


def test_grafting_does_not_pay_when_the_strong_is_slow():
    tc, dcs = _curves(lambda n: 10.0 + 0.05 * (n - 1), lambda w: 0.05, lambda w: 1000.0)
    ch = solve_graft(PAYS, tc, dcs, budget=8, max_depth=4, max_branching=4)
    assert ch.plan == "light only" and ch.dtree.drafter_counts[1] == 0 and ch.drafter_ms[1] == 0.0
    assert ch.dtree.drafter_counts[0] > 0  # still speculates with the light drafter
    assert ch.speedup > 1.0


def test_family():
    assert graft_depth_family(3) == [frozenset(), frozenset({0}), frozenset({0, 1}), frozenset({0, 1, 2}),
                                     frozenset({1}), frozenset({2}), frozenset({1, 2})]


# ------------------------------------------------------------------------------------------------ baselines
def test_merge_trees_hand_example():
    light = Tree.from_choices([[0], [1]])
    strong = Tree.from_choices([[0], [0, 0]])
    m = merge_trees(light, strong, ("light", "strong"))
    assert m.tree == Tree.from_choices([[0], [1], [2], [2, 0]])
    assert m.drafter == (0, 0, 0, 1, 1)
    # 1 + 0.3 + 0.1 + 0.45 (strong given 2 light) + 0.45 * 0.75 (strong alone below it)
    assert graft_expected_tokens(m, PAYS) == pytest.approx(1 + 0.3 + 0.1 + 0.45 + 0.45 * 0.75)


def test_baselines_rows():
    tc, dcs = _curves(lambda n: 10.0 + 0.05 * (n - 1), lambda w: 0.05, lambda w: 0.5, overhead=0.2,
                      tokens=range(1, 17))
    rows = graft_baselines(PAYS, tc, dcs, budget=8, max_depth=4, max_branching=4)
    assert [r["name"] for r in rows] == ["light alone", "strong alone", "specinfer merge"]
    light, strong, merge = rows
    ch = choose([0.3, 0.1], pair_curve(tc, dcs[0]), 8, 4, 4)
    assert light["expected_tokens"] == pytest.approx(ch.expected_tokens)
    assert light["choices"] == ch.tree.choices() and light["nodes_per_drafter"][1] == 0
    assert strong["nodes_per_drafter"][0] == 0
    # the merge costs each drafter's own tree plus the target over the union
    lt, st = Tree.from_choices(light["choices"]), Tree.from_choices(strong["choices"])
    assert len(lt.children[0]) == 2  # the light's root branching has a strong vector: the merge is scored
    u = merge_trees(lt, st, PAYS.names)
    assert merge["size"] == u.size == lt.size + st.size - 1
    assert merge["expected_tokens"] == pytest.approx(graft_expected_tokens(u, PAYS))
    # the strong alone is the DP's own tree on its positional vector (drafted from a root of its own)
    assert strong["expected_tokens"] == pytest.approx(choose([0.75, 0.1], pair_curve(tc, dcs[1]), 8, 4, 4).expected_tokens)
    # here the conditional model's estimate of the union (graft_expected_tokens, checked by hand above) is below
    # the strong's own tree, which the union contains: the row says so and keeps the strong's as a floor
    assert merge["expected_tokens"] < strong["expected_tokens"]
    assert merge["expected_tokens_at_least"] == strong["expected_tokens"]
    assert "below" in merge["note"]
    assert merge["cost_ms"] == pytest.approx(light["cost_ms"] + strong["cost_ms"] - 0.2
                                             - tc.target_ms(lt.size) - tc.target_ms(st.size)
                                             + tc.target_ms(u.size))
    for r in rows:
        if r["tokens_per_s"] is not None:
            assert r["tokens_per_s"] == pytest.approx(1000 * r["expected_tokens"] / r["cost_ms"])


# ------------------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize(
    "light, strong, message",
    [
        ([[0.5, -0.1]], {}, "negative"),
        ([[0.7, 0.4]], {}, "sums to 1.1 > 1"),
        ([[0.5, 0.2]], {3: [[0.1]]}, "strong key 3 must be an integer in 0..2"),
        ([[0.5, 0.2]], {-1: [[0.1]]}, "strong key -1"),
        ([[0.5, 0.2]], {True: [[0.1]]}, "strong key True"),
        ([[0.5, 0.2]], {1: [[0.4, 0.2]]}, "the light's first 1 entries (0.5) plus the strong vector given 1 light "
                                          "children (0.6) sum to 1.1 > 1"),
        ([[0.5, 0.2], [0.5]], {}, "per-depth vectors of one length"),
        ([[0.5, float("nan")]], {}, "finite"),
        ("0.5", {}, "must be a vector"),
    ],
)
def test_bad_acceptance(light, strong, message):
    with pytest.raises(SolverError) as info:
        GraftAcceptance(light, strong)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bad_trees_and_limits():
    acc = GraftAcceptance([[0.5, 0.2]], {1: [[0.2, 0.1]]})
    t = DrafterTree(Tree(parent=[-1, 0], rank=[0, 0]), (0, 1), ("light", "strong"))
    with pytest.raises(SolverError, match=r"next to 0 light siblings, but .* only for a in \[1\]"):
        graft_expected_tokens(t, acc)
    deep = DrafterTree.single(Tree(parent=[-1, 0, 0, 0], rank=[0, 0, 1, 2]), "light")
    with pytest.raises(SolverError, match="light rank 2 is beyond the light vector's 2 ranks"):
        graft_expected_tokens(deep, acc)
    three = DrafterTree(Tree(parent=[-1, 0], rank=[0, 0]), (0, 2), ("a", "b", "c"))
    with pytest.raises(SolverError, match="two drafters"):
        graft_expected_tokens(three, acc)
    tc, dcs = _curves(lambda n: 10.0, lambda w: 1.0, lambda w: 1.0)
    with pytest.raises(SolverError, match="1 draft latency curves for a tree of 2 drafters"):
        graft_step_cost(t, tc, dcs[:1])
    with pytest.raises(SolverError, match="budget must be at least 1"):
        solve_graft_dp(acc, 0, 3)
    with pytest.raises(SolverError, match="graft depth -1 must be an integer >= 0"):
        solve_graft_dp(acc, 5, 3, graft_depths=[-1])
    with pytest.raises(SolverError, match="must be a GraftAcceptance"):
        solve_graft_dp([0.5], 5, 3)
    with pytest.raises(SolverError, match="at most 7"):
        brute_force_graft(acc, None, None, 8, 3)
    with pytest.raises(ProfileError, match="budget 9 exceeds the largest target token count 8"):
        solve_graft(acc, tc, dcs, budget=9, max_depth=3)


def test_a_strong_draft_table_from_a_block_size_skips_the_plans_it_cannot_price():
    # the strong drafter a one-pass block drafter timed from 4 drafted tokens (c(1)..c(3) unmeasured): a plan with
    # 1..3 strong nodes cannot be priced and is skipped, as choose skips such trees (was: ProfileError "draft
    # forward at 1 tokens is below the smallest measured count 4 tokens" from the first such candidate, no choice)
    t = {n: 10.0 + 0.05 * (n - 1) for n in TOKENS}
    lc = LatencyCurve.synthetic(t, {n: 0.05 for n in TOKENS}, id="light")
    sc = LatencyCurve.synthetic(t, {n: 0.5 for n in TOKENS if n >= 4}, id="strong", cost_model="one-pass")
    ch = solve_graft(PAYS, lc, [lc, sc], budget=8, max_depth=4, max_branching=4, top=1000)
    assert ch.candidates and all(r["nodes_per_drafter"][1] in (0, 4, 5, 6, 7) for r in ch.candidates)
    assert any(r["nodes_per_drafter"][1] >= 4 for r in ch.candidates)  # the strong's priced plans are kept
