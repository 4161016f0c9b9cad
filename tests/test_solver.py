"""The Sequoia DP against brute force, the plain-Python reference, closed forms and best-first; baselines;
the hardware-aware choice on synthetic latency curves."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sequoia_opt.errors import ProfileError, SolverError
from sequoia_opt.profiles import LatencyCurve
from sequoia_opt.solver import (
    best_first,
    chain,
    choose,
    compare_baselines,
    kary_tree,
    plain_ms_per_token,
    score_tree,
    solve_dp,
    specinfer,
    step_cost,
)
from sequoia_opt.solver.hardware import draft_forwards
from sequoia_opt.solver.reference import reference_table
from sequoia_opt.tree import Tree


# ---------------------------------------------------------------------------------------------- brute force
@functools.lru_cache(maxsize=None)
def _plane_trees(m: int, d: int, B: int) -> tuple:
    """All ordered trees with exactly m nodes, depth <= d, at most B children: nested tuples of children."""
    if m == 1:
        return ((),)
    if d == 0:
        return ()
    out = []

    def forests(rem: int, slots: int):
        if rem == 0:
            yield ()
            return
        if slots == 0:
            return
        for s in range(1, rem + 1):
            for t in _plane_trees(s, d - 1, B):
                for rest in forests(rem - s, slots - 1):
                    yield (t,) + rest

    out.extend(forests(m - 1, B))
    return tuple(out)


def _value(t: tuple, p) -> float:
    return 1.0 + sum((p[i] if i < len(p) else 0.0) * _value(c, p) for i, c in enumerate(t))


def _brute(p, n: int, d: int, B: int) -> float:
    return max(_value(t, p) for m in range(1, n + 1) for t in _plane_trees(m, d, B))


VECTORS = [
    [0.6, 0.2, 0.1],
    [0.1, 0.5, 0.3],  # non-monotone: rank 1 beats rank 0
    [0.0, 0.9],  # zero first entry: rank 1 only reachable through a worthless rank 0
    [0.3, 0.0, 0.0, 0.6],
    [0.25, 0.25, 0.25, 0.25],
    [1.0],
]


@pytest.mark.parametrize("p", VECTORS)
@pytest.mark.parametrize("B", [1, 2, 3, 6])
def test_dp_equals_brute_force_up_to_7_nodes(p, B):
    sol = solve_dp(p, 7, 6, B)
    for n in range(1, 8):
        for d in range(1, 7):
            want = _brute(p, n, d, B)
            assert sol.table[n, d] == pytest.approx(want, rel=1e-12, abs=1e-12), (n, d)
            tree = sol.tree(n, d)
            assert tree.size <= n and tree.tree_depth <= d and tree.max_branching_used <= B
            assert tree.expected_tokens(p) == pytest.approx(want, rel=1e-9)


def test_non_monotone_vector_uses_rank_gap_filler():
    # p_1 = 0, p_2 = 0.9: the best 3-node tree is root + rank 0 (worthless) + rank 1
    sol = solve_dp([0.0, 0.9], 3, 1, 2)
    assert sol.table[3, 1] == pytest.approx(1.9)
    assert sol.table[2, 1] == pytest.approx(1.0)
    assert sol.tree(3, 1).rank == (0, 0, 1)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6),
    st.integers(1, 24),
    st.integers(1, 6),
    st.integers(1, 5),
)
def test_dp_equals_plain_python_reference(raw, n, D, B):
    total = sum(raw)
    p = [x / total * 0.95 for x in raw] if total > 0.95 else raw
    ref = np.array(reference_table(p, n, D, B))
    sol = solve_dp(p, n, D, B)
    assert ref.shape == sol.table.shape == (n + 1, D + 1)
    np.testing.assert_allclose(sol.table, ref, rtol=1e-12, atol=1e-12)
    assert not np.isnan(sol.table).any()
    assert sol.tree().expected_tokens(p) == pytest.approx(ref[n, D], rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.integers(1, 60), st.one_of(st.none(), st.integers(1, 8)))
def test_best_first_equals_dp_for_non_increasing_p(raw, n, depth):
    p = sorted(raw, reverse=True)
    if sum(p) > 1:
        p = [x / sum(p) for x in p]
    D = depth if depth is not None else n  # depth n is no limit for n nodes
    tree = best_first(p, n, max_depth=depth, max_branching=8)
    assert tree.size <= n
    if depth is not None:
        assert tree.tree_depth <= depth
    assert tree.expected_tokens(p) == pytest.approx(solve_dp(p, n, max(D, 1), 8).table[n, max(D, 1)], rel=1e-9)


def test_table_basics():
    p = [0.5, 0.3]
    sol = solve_dp(p, 10, 5, 2)
    assert (sol.table[1, :] == 1.0).all()  # G(1) = 1: the root alone
    assert (sol.table[0, :] == 0.0).all()
    assert sol.table[10, 1] == pytest.approx(1.8)  # depth 1: root + both ranks
    # "at most m nodes": non-decreasing in m and in d
    assert (np.diff(sol.table[1:], axis=0) >= -1e-15).all()
    assert (np.diff(sol.table[1:], axis=1) >= -1e-15).all()
    assert sol.tree(1, 3).size == 1


def test_certain_first_candidate_gives_the_chain():
    sol = solve_dp([1.0, 0.0, 0.0], 9, 16, 4)
    assert sol.table[9, 16] == pytest.approx(9.0)  # G = n
    tree = sol.tree(9, 16)
    assert tree == chain(8)
    assert sol.table[9, 5] == pytest.approx(6.0)  # depth-limited chain


@pytest.mark.parametrize("alpha", [0.3, 0.8])
@pytest.mark.parametrize("gamma", [1, 4, 9])
def test_chain_matches_closed_form(alpha, gamma):
    # for a chain only rank 0 matters: p_1 = alpha
    p = [alpha, 0.1]
    want = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert chain(gamma).expected_tokens(p) == pytest.approx(want, rel=1e-12)
    # and with B = 1 the DP's best tree is that chain
    assert solve_dp(p, gamma + 1, gamma, 1).table[gamma + 1, gamma] == pytest.approx(want, rel=1e-12)


def test_zeros_give_no_nan():
    for p in ([0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.2, 0.0]):
        sol = solve_dp(p, 50, 8, 8)
        assert np.isfinite(sol.table).all()
        assert sol.tree().expected_tokens(p) == pytest.approx(sol.table[50, 8])
    assert solve_dp([0.0, 0.0], 20, 4).tree().size == 1  # nothing worth speculating


def test_trailing_zero_ranks_are_never_used():
    tree = solve_dp([0.5, 0.3, 0.0, 0.0], 40, 6, 4).tree()
    assert max(tree.rank) <= 1


@pytest.mark.parametrize(
    "args, match",
    [
        (([], 10, 4), "empty"),
        (([0.5, float("nan")], 10, 4), "p_2"),
        (([0.5, -0.1], 10, 4), "negative"),
        (([0.7, 0.5], 10, 4), "sums to 1.2"),
        (([0.5], 0, 4), "budget"),
        (([0.5], 10, 0), "depth"),
        (([0.5], 10, 4, 0), "branching"),
    ],
)
def test_bad_inputs_raise_solver_error(args, match):
    with pytest.raises(SolverError, match=match):
        solve_dp(*args)


def test_big_problem_is_fast_and_consistent():
    rng = np.random.default_rng(1)
    p = np.sort(rng.random(32))[::-1]
    p = p / p.sum() * 0.9
    sol = solve_dp(p, 512, 16, 32)
    tree = sol.tree(512, 16)
    assert tree.size <= 512 and tree.tree_depth <= 16
    assert tree.expected_tokens(p) == pytest.approx(sol.table[512, 16], rel=1e-9)
    widths = sol.level_widths_many([512, 100], [16, 4])
    assert tuple(int(x) for x in widths[0][: tree.tree_depth + 1]) == tree.level_widths
    assert widths[1].sum() == sol.tree(100, 4).size


# ---------------------------------------------------------------------------------------------- baselines
def test_baseline_shapes():
    assert kary_tree(2, 3).size == 15
    assert kary_tree(3, 2, budget=7).level_widths == (1, 3, 3)
    t = specinfer(3, 4)
    assert t.size == 13 and t.level_widths == (1, 3, 3, 3, 3)
    p = [0.5, 0.2, 0.1]
    assert t.expected_tokens(p) == pytest.approx(1 + 0.8 * (1 + 0.5 + 0.25 + 0.125))
    assert chain(0).size == 1


def test_best_first_respects_limits_and_skips_zero_nodes():
    t = best_first([0.5, 0.3, 0.1], 30, max_depth=2, max_branching=2)
    assert t.tree_depth <= 2 and t.max_branching_used <= 2 and t.size == 7
    assert best_first([0.5, 0.0], 10).size == 10  # a chain; rank 1 is worthless
    assert max(best_first([0.5, 0.0], 10).rank) == 0


# ---------------------------------------------------------------------------------------------- hardware
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
P = [0.6, 0.12, 0.05, 0.03, 0.02, 0.01, 0.01, 0.005]


def _curve(target, draft_ms=0.5, overhead=0.0):
    return LatencyCurve.synthetic({t: target(t) for t in TOKENS}, {t: draft_ms for t in TOKENS}, step_overhead_ms=overhead)


def test_flat_curve_picks_a_large_budget():
    ch = choose(P, _curve(lambda n: 20.0, draft_ms=0.01), 512, 12)
    assert ch.tree.size > 256
    assert ch.speedup > 2


def test_steep_curve_picks_a_small_budget():
    ch = choose(P, _curve(lambda n: 1.0 * n, draft_ms=0.01), 512, 12)
    assert ch.tree.size <= 4
    assert ch.speedup >= 1.0


def test_choice_arithmetic_is_consistent():
    curve = _curve(lambda n: 20.0 + (0 if n <= 64 else 0.1 * (n - 64)), draft_ms=1.0, overhead=0.5)
    ch = choose(P, curve, 256, 10)
    widths = ch.tree.level_widths
    cost = sum(curve.draft_ms(w) for w in widths[:-1]) + curve.target_ms(ch.tree.size) + 0.5
    assert ch.cost_ms == pytest.approx(cost)
    assert ch.tokens_per_s == pytest.approx(1000 * ch.tree.expected_tokens(P) / cost)
    assert plain_ms_per_token(curve) == pytest.approx(20.5)
    assert ch.speedup == pytest.approx(ch.tokens_per_s * 20.5 / 1000)
    assert len(ch.alternatives) == 5
    rates = [a.cost.tokens_per_s for a in ch.alternatives]
    assert rates == sorted(rates, reverse=True)
    # no alternative on the grid beats the choice, and the choice beats every baseline
    for b in compare_baselines(P, 256, 10, 32, curve, best_first_budget=ch.budget):
        assert b.cost.tokens_per_s <= ch.tokens_per_s + 1e-9
    assert score_tree(chain(0), P, curve).speedup == pytest.approx(1.0)


def test_budget_past_the_measured_range_is_refused():
    with pytest.raises(ProfileError, match="extrapolate"):
        choose(P, _curve(lambda n: 20.0), 1024, 8)


def test_compare_baselines_refuses_what_the_curve_did_not_measure():
    curve = LatencyCurve.synthetic({1: 10.0, 8: 11.0, 24: 12.0}, {1: 1.0, 8: 1.2, 24: 1.5})
    with pytest.raises(ProfileError, match="budget 128 exceeds the largest target token count 24"):
        compare_baselines(P, 128, 8, 32, curve)  # was: a 24-node best-first tree, without a word
    res = {b.name: b for b in compare_baselines(P, 24, 8, 32, curve)}
    assert res["best-first"].tree.size == 24 and res["best-first"].params == {"budget": 24}
    with pytest.raises(SolverError, match="best-first budget must be in 1..24"):
        compare_baselines(P, 24, 8, 32, curve, best_first_budget=32)


def test_compare_baselines_says_which_baseline_the_curve_cannot_score():
    narrow = LatencyCurve.synthetic({1: 10.0, 8: 11.0, 24: 12.0}, {1: 1.0, 2: 1.1}, id="narrow")
    res = {b.name: b for b in compare_baselines(P, 24, 8, 32, narrow)}
    bf = res["best-first"]  # 24 nodes, level widths past 2: scoring it would extrapolate the draft curve
    assert bf.cost is None and max(bf.tree.level_widths[:-1]) > 2
    assert bf.note == (f"best-first not scored: it needs a draft forward over {max(bf.tree.level_widths[:-1])} "
                       "tokens; latency profile 'narrow' measured draft forwards up to 2")
    assert bf.as_dict()["note"] == bf.note and "speedup" not in bf.as_dict()
    assert res["chain"].cost is not None and res["chain"].note is None  # was: the whole call raised


def test_compare_without_curve_ranks_by_expected_tokens():
    res = {b.name: b for b in compare_baselines(P, 64, 8, 32)}
    assert set(res) == {"chain", "k-ary", "specinfer", "best-first"}
    assert res["chain"].params == {"gamma": 8}
    assert res["chain"].expected_tokens == pytest.approx((1 - 0.6**9) / 0.4)
    dp = solve_dp(P, 64, 8).table[64, 8]
    for b in res.values():
        assert b.tree.size <= 64 and b.expected_tokens <= dp + 1e-12
        assert b.cost is None
    assert res["best-first"].expected_tokens == pytest.approx(dp)  # P is non-increasing


# ---------------------------------------------------------------------------------------------- drafter cost model
def _two_models(target: dict, draft: dict, overhead: float = 0.0) -> tuple[LatencyCurve, LatencyCurve]:
    """The same tables read per-level and one-pass."""
    return tuple(LatencyCurve.synthetic(target, draft, step_overhead_ms=overhead, cost_model=cm)
                 for cm in ("per-level", "one-pass"))


def test_one_pass_step_cost_is_one_draft_forward_over_the_speculated_tokens():
    per_level, one_pass = _two_models({1: 10.0, 2: 10.0, 4: 12.0, 8: 16.0}, {1: 1.0, 2: 1.5, 4: 2.0, 8: 3.0},
                                      overhead=0.5)
    # widths [1, 2, 2], n = 5: one-pass c(4) = 2.0, T(5) = 13.0 (between 12 at 4 and 16 at 8), + 0.5
    c = step_cost([1, 2, 2], 2.0, one_pass)
    assert (c.draft_ms, c.target_ms, c.overhead_ms, c.cost_ms) == pytest.approx((2.0, 13.0, 0.5, 15.5))
    assert c.tokens_per_s == pytest.approx(1000 * 2.0 / 15.5) and c.speedup == pytest.approx(2.0 * 10.5 / 15.5)
    # per-level (unchanged): c(1) + c(2) = 2.5
    assert step_cost([1, 2, 2], 2.0, per_level).cost_ms == pytest.approx(16.0)
    # a chain of 3: one-pass c(3) = 1.75 (between 1.5 at 2 and 2.0 at 4), per-level 3 c(1) = 3.0
    assert step_cost([1, 1, 1, 1], 1.0, one_pass).draft_ms == pytest.approx(1.75)
    assert step_cost([1, 1, 1, 1], 1.0, per_level).draft_ms == pytest.approx(3.0)
    # root-only: no draft forward under either model, speedup exactly 1
    for curve in (per_level, one_pass):
        assert step_cost([1], 1.0, curve).draft_ms == 0 and step_cost([1], 1.0, curve).speedup == pytest.approx(1.0)
    # the cost model may be given explicitly; by default it is the curve's
    assert step_cost([1, 2, 2], 2.0, per_level, cost_model="one-pass") == c
    assert score_tree(specinfer(2, 2), P, one_pass).draft_ms == pytest.approx(2.0)
    assert draft_forwards([1, 3, 4], "one-pass") == [7] and draft_forwards([1, 3, 4], "per-level") == [1, 3]
    with pytest.raises(ProfileError, match="draft cost model is 'heads'"):
        step_cost([1, 2], 1.0, one_pass, cost_model="heads")


def test_one_pass_choice_goes_deeper_when_each_level_costs_a_draft_forward():
    # flat T(n) up to 64 tokens, a flat draft forward of 3 ms: per-level pays it at every level, one-pass once
    per_level, one_pass = _two_models({t: 20.0 for t in TOKENS if t <= 64}, {t: 3.0 for t in TOKENS if t <= 64})
    a, b = choose(P, per_level, 64, 12), choose(P, one_pass, 64, 12)
    assert b.tree.tree_depth > a.tree.tree_depth
    # each choice's cost is its own model's arithmetic
    assert a.cost_ms == pytest.approx(3.0 * a.tree.tree_depth + 20.0)
    assert b.cost_ms == pytest.approx(3.0 + 20.0)
    # the one-pass choice is at least as fast, under one-pass, as the per-level choice's tree would be
    assert b.tokens_per_s >= score_tree(a.tree, P, one_pass).tokens_per_s - 1e-9


def test_one_pass_never_scores_a_tree_past_the_measured_draft_forward():
    per_level, one_pass = _two_models({t: 20.0 for t in TOKENS if t <= 64}, {1: 1.0, 4: 1.0, 8: 1.0})
    ch = choose(P, one_pass, 64, 12)
    assert ch.tree.size - 1 <= 8 and all(c.size - 1 <= 8 for c in ch.alternatives) and ch.skipped > 0
    assert choose(P, per_level, 64, 12).tree.size > 9  # per-level only needs each level <= 8 wide
    for b in compare_baselines(P, 32, 8, 8, one_pass):
        assert (b.cost is None) == (b.tree.size - 1 > 8)
        assert b.cost is not None or "draft forward over" in b.note


def test_choose_solves_anew_for_tables_of_another_vector_or_branching():
    """A library user's choose(p2, ..., solution=solve_dp(p1, ...)) returned the tree best under p1 with its
    figures (G 5.17 where the tree gives 1.19 under p2): positional tables of another vector or branching limit
    are not reused."""
    from sequoia_opt.profiles import load_latency
    from sequoia_opt.solver import choose, solve_dp

    from pathlib import Path

    curve = load_latency(Path(__file__).parents[1] / "profiles" / "example" / "latency.yaml")
    p1, p2 = [0.8, 0.1, 0.05], [0.1, 0.05, 0.01]
    own = choose(p2, curve, 32, 6)
    reused = choose(p2, curve, 32, 6, solution=solve_dp(p1, 64, 8))
    assert reused.tree.choices() == own.tree.choices()
    assert reused.expected_tokens == pytest.approx(own.tree.expected_tokens(p2))
    wide = choose(p1, curve, 32, 6, max_branching=4)
    narrow_tables = choose(p1, curve, 32, 6, max_branching=4, solution=solve_dp(p1, 64, 8, max_branching=1))
    assert narrow_tables.expected_tokens == pytest.approx(wide.expected_tokens) and max(wide.tree.level_widths) > 1
    same = solve_dp(p1, 64, 8, max_branching=4)  # tables of this vector and B are reused as they are
    assert choose(p1, curve, 32, 6, max_branching=4, solution=same).solution is same
    # by-depth tables solved at another B too (a review): a chain's figures were returned for B = 4
    from sequoia_opt.solver.depth import solve_dp_by_depth

    rows = np.array([p1, [0.7, 0.15, 0.05]])
    by_depth = choose(p1, curve, 32, 6, max_branching=4, solution=solve_dp_by_depth(rows, 64, 8, 4))
    assert by_depth.solution.max_branching == 4 and max(by_depth.tree.level_widths) > 1
    with pytest.raises(SolverError, match="DepthDPSolution given was solved with max_branching 1, not 4"):
        choose(p1, curve, 32, 6, max_branching=4, solution=solve_dp_by_depth(rows, 64, 8, 1))


def test_the_baselines_take_numpy_integers_as_the_solver_does():
    import numpy as np

    from sequoia_opt.solver.baselines import best_first, chain, kary_tree, specinfer

    assert chain(np.int64(3)).choices() == chain(3).choices()
    assert kary_tree(np.int32(2), np.int64(2), budget=np.int64(5)).choices() == kary_tree(2, 2, budget=5).choices()
    assert specinfer(np.int64(2), np.int64(3)).choices() == specinfer(2, 3).choices()
    p = [0.5, 0.2, 0.1]
    assert best_first(p, np.int64(6)).choices() == best_first(p, 6).choices()
    with pytest.raises(SolverError, match="gamma must be an integer >= 0"):
        chain(np.float64(3.0))


def test_a_draft_table_from_a_block_size_skips_the_narrower_trees_instead_of_failing():
    # a one-pass block drafter timed from 4 drafted tokens: c(1)..c(3) are not measured. The trees of 2..4 nodes
    # cannot be scored, the larger ones can (was: ProfileError "draft forward at 1 tokens is below the smallest
    # measured count 4 tokens" from the 2-node candidate, and no choice at all)
    target = {t: 10.0 + 0.01 * t for t in (1, 2, 4, 8, 16, 32)}
    curve = LatencyCurve.synthetic(target, {4: 1.0, 8: 1.1, 16: 1.2, 32: 1.3}, cost_model="one-pass")
    assert curve.min_draft_tokens() == 4 and curve.max_draft_tokens() == 32
    ch = choose(P, curve, 32, 6)
    assert ch.skipped > 0 and ch.tree.size - 1 >= 4
    best = max((score_tree(solve_dp(P, m, d).tree(), P, curve).tokens_per_s, m, d)
               for m in range(5, 33) for d in range(1, 7))  # every tree of >= 4 drafted tokens the curve prices
    assert ch.tokens_per_s == pytest.approx(best[0], rel=1e-9)
    assert all(a.size == 1 or a.size - 1 >= 4 for a in ch.alternatives)
    # per-level: every tree drafts over the root (c(1)): only plain decoding is priced, and said so by the skips
    per_level = LatencyCurve.synthetic(target, {4: 1.0, 8: 1.1, 16: 1.2, 32: 1.3})
    ch = choose(P, per_level, 32, 6)
    assert ch.tree.size == 1 and ch.speedup == pytest.approx(1.0) and ch.considered == 6  # budget 1, depths 1..6
    res = {b.name: b for b in compare_baselines(P, 32, 6, 32, per_level)}  # was: ProfileError from the chain
    assert res["chain"].params == {"gamma": 0} and res["chain"].cost.speedup == pytest.approx(1.0)  # the one priced
    assert res["best-first"].cost is None
    assert res["best-first"].note.endswith("needs a draft forward over 1 tokens; latency profile 'synthetic' measured "
                                      "draft forwards from 4")


def _level_widths_of(t: tuple) -> list[int]:
    out, level = [1], [t]
    while True:
        level = [c for x in level for c in x]
        if not level:
            return out
        out.append(len(level))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=3), st.integers(1, 7), st.integers(1, 6), st.integers(1, 3),
       st.sampled_from(["per-level", "one-pass"]), st.lists(st.floats(0.0, 2.0), min_size=8, max_size=8),
       st.lists(st.floats(0.0, 0.4), min_size=8, max_size=8), st.floats(0.0, 1.0))
def test_hardware_choice_equals_brute_force_tokens_per_second_up_to_7_nodes(raw, n, D, B, cost_model, dt, dc, over):
    """The cost-aware objective: every tree of <= n nodes, depth <= D, branching <= B, scored by tokens/s under a
    non-decreasing T(n); the grid covers every budget <= 8 here. Exact where the step's cost depends on the tree
    through its size and depth only (choose's docstring): a one-pass drafter's c(n - 1) with any non-decreasing c,
    a per-level drafter whose c(w) does not grow with w (d forwards at c each). A per-level c(w) that does grow is
    test_a_steep_per_level_draft_cost_can_favour_a_narrower_tree_than_choose."""
    p = [x / sum(raw) * 0.95 for x in raw] if sum(raw) > 0.95 else raw
    draft = np.cumsum(dc) if cost_model == "one-pass" else np.full(8, dc[0])
    curve = LatencyCurve.synthetic(dict(zip(range(1, 9), np.cumsum(dt) + 5.0)), dict(zip(range(1, 9), draft)),
                                   step_overhead_ms=over, cost_model=cost_model)
    best = max(step_cost(_level_widths_of(t), _value(t, p), curve).tokens_per_s
               for m in range(1, n + 1) for t in _plane_trees(m, D, B))
    ch = choose(p, curve, n, D, B)
    assert ch.tokens_per_s == pytest.approx(best, rel=1e-9)
    assert ch.tree.size <= n and ch.tree.tree_depth <= D and ch.tree.max_branching_used <= B
    assert score_tree(ch.tree, p, curve).tokens_per_s == pytest.approx(best, rel=1e-9)


def test_a_steep_per_level_draft_cost_can_favour_a_narrower_tree_than_choose():
    """What choose does not claim (its docstring): for a per-level drafter whose c(w) grows with w, the step's cost
    depends on the tree's level widths, and a narrower tree of the same size and depth than the DP's (which maximises
    tokens per step) can be faster. A tryout's case: c(2) = 50 c(1), a flat T."""
    p = [0.6, 0.3]
    curve = LatencyCurve.synthetic({t: 10.0 for t in range(1, 9)}, {1: 0.1, 2: 5.0, 3: 5.0, 4: 5.0},
                                   cost_model="per-level")
    ch = choose(p, curve, 5, 3, 2)
    assert ch.tree.level_widths == (1, 1, 1) and ch.tokens_per_s == pytest.approx(192.157, abs=1e-3)
    chain = Tree.from_choices([[0], [0, 0], [0, 0, 0]])  # 4 nodes, depth 3: its DP tree of (4, 3) is wider
    narrow = Tree.from_choices([[0], [0, 0], [0, 0, 0], [0, 0, 1]])  # widths 1, 1, 1, 2
    assert score_tree(chain, p, curve).tokens_per_s == pytest.approx(211.262, abs=1e-3)
    assert score_tree(narrow, p, curve).tokens_per_s == pytest.approx(221.748, abs=1e-3)
    assert choose(p, curve, 5, 3, 1).tree.level_widths == (1, 1, 1, 1)  # a chain limit finds the chain
