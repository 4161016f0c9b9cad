"""A generation of finite length (solver.generation): the last step emits only what is left, so a tree runs
more steps than N / G; the run's predicted speedup follows (issue 31)."""

from __future__ import annotations

import numpy as np
import pytest

from sequoia_opt.solver.depth import ValueModel
from sequoia_opt.solver.generation import end_overshoot_tokens, finite_generation_factor, step_length_tail
from sequoia_opt.tree import Tree, TreeMetadata

TREE = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
ACC = np.array([0.55, 0.2, 0.08])


def _simulate_steps(tree: Tree, acc: np.ndarray, n_tokens: int, gens: int, rng) -> float:
    """Mean steps to emit ``n_tokens`` tokens, each step walking the tree as the verifier does (the k-th child
    accepted with probability acc[k], the accepted path's tokens plus the bonus emitted, the last step truncated)."""
    children = {v: sorted((c for c in range(tree.size) if tree.parent[c] == v), key=lambda c: tree.rank[c])
                for v in range(tree.size)}
    total = 0
    for _ in range(gens):
        left, steps = n_tokens, 0
        while left > 0:
            v, x = 0, 1
            while True:
                u = rng.random()
                nxt, edge = None, 0.0
                for c in children[v]:
                    edge += acc[tree.rank[c]]
                    if u < edge:
                        nxt = c
                        break
                if nxt is None:
                    break
                v, x = nxt, x + 1
            left -= x
            steps += 1
        total += steps
    return total / gens


def test_the_tail_is_the_reach_of_each_depth_and_sums_to_g():
    reach = TREE.path_probabilities(ACC)
    tail = step_length_tail(TREE.depth, reach)
    assert tail[0] == 1.0
    assert tail[1] == pytest.approx(ACC.sum())  # some depth-1 node accepted: p_1 + p_2 + p_3
    assert tail[3] == pytest.approx(ACC[0] ** 3)  # the one depth-3 node: the first child thrice
    assert tail.sum() == pytest.approx(TREE.expected_tokens(ACC))
    assert np.all(np.diff(tail) <= 1e-12)  # P(X > k) falls with k


def test_overshoot_matches_the_renewal_formula_and_a_simulation():
    reach = TREE.path_probabilities(ACC)
    tail = step_length_tail(TREE.depth, reach)
    px = -np.diff(np.append(tail, 0.0))  # P(X = k + 1)
    x = np.arange(1, tail.size + 1)
    mu = float((px * x).sum())
    want = float((px * x * (x - 1)).sum()) / (2 * mu)
    assert end_overshoot_tokens(TREE.depth, reach) == pytest.approx(want)
    n, gens = 40, 4000
    steps = _simulate_steps(TREE, ACC, n, gens, np.random.default_rng(0))
    predicted = (n + want) / mu  # Wald: E[steps] = (N + E[O]) / mu
    assert steps == pytest.approx(predicted, rel=0.01)
    assert steps > n / mu * 1.01  # the steady state alone under-counts the steps by > 1 %
    f = finite_generation_factor(want, n * gens, gens)
    assert f == pytest.approx((n / mu) / predicted)


def test_plain_decoding_and_no_tokens_have_no_end_effect():
    assert end_overshoot_tokens([0], [1.0]) == 0.0  # the root alone emits one token a step: nothing left over
    assert finite_generation_factor(0.7, 0, 0) == 1.0
    assert finite_generation_factor(0.0, 40, 3) == 1.0
    with pytest.raises(ValueError):
        finite_generation_factor(-0.1, 40, 1)
    with pytest.raises(ValueError):
        step_length_tail([0, 1], [1.0])
    with pytest.raises(ValueError):
        step_length_tail([0, 1], [1.0, 1.5])


def test_the_value_model_gives_the_same_overshoot_by_depth_as_positional_when_rows_repeat():
    pos = ValueModel("positional", ACC)
    by_depth = ValueModel("by-depth", ACC, np.tile(ACC, (3, 1)))
    assert by_depth.path_probabilities(TREE) == pytest.approx(pos.path_probabilities(TREE))
    assert by_depth.end_overshoot_tokens(TREE) == pytest.approx(pos.end_overshoot_tokens(TREE))
    deeper = ValueModel("by-depth", ACC, np.array([ACC, ACC * 0.5]))  # a weaker second level: less overshoot
    assert deeper.end_overshoot_tokens(TREE) < pos.end_overshoot_tokens(TREE)


def test_a_run_predicts_the_speedup_for_its_generation_lengths():
    import torch

    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.model import ModelConfig, Transformer

    cfg = ModelConfig.preset("tiny").with_(max_position_embeddings=96)
    torch.manual_seed(0)
    target = Transformer(cfg).eval()
    tree = Tree.from_choices([[0], [1], [0, 0]])
    spread = {"point": 1.5, "se": 0.1, "prompts": 10, "new_prompts": 10}
    meta = TreeMetadata(expected_tokens_per_step=2.0, predicted_speedup=1.5,
                        extra={"end_overshoot_tokens": 0.6, "speedup_spread": spread})
    bare = TreeMetadata(expected_tokens_per_step=2.0, predicted_speedup=1.5)
    root = Tree.from_choices([])  # the root alone, its (hand-edited) file claiming what the tree's does
    report = run_trees(target, target, [TreeEntry("t", tree, meta), TreeEntry("bare", tree, bare),
                                        TreeEntry("root", root, meta)],
                       [list(range(3, 20)), list(range(30, 41))], max_new_tokens=12, warmup=False)
    s = {x.tree: x for x in report.summaries}
    assert s["t"].new_tokens == 24
    # the root alone is plain decoding: one token a step, no faster than plain, whatever the file says
    assert root.size == 1 and s["root"].tokens_per_step == 1.0
    assert s["root"].predicted_tokens_per_step == 1.0 and s["root"].predicted_interval == (1.0, 1.0)
    assert s["root"].predicted_speedup == 1.0 and s["root"].predicted_speedup_interval is None
    assert s["t"].predicted_speedup_steady == 1.5
    # no node rates: a chain of the tree's depth 2 whose one rate gives G = 2 (its overshoot is for long answers)
    from sequoia_opt.jobs.run import answer_factor as af

    fs = af(tree, meta, [12, 12], priced=True)
    assert s["t"].predicted_speedup == pytest.approx(1.5 * fs) and 1.0 < s["t"].predicted_speedup < 1.5
    # nothing recorded but G and the speedup: a chain of the tree's depth with G's one rate stands for the step's
    # tokens, each step priced on a line from a plain step's cost to the whole tree's (G / S plain steps)
    from sequoia_opt.jobs.run import answer_factor

    approx = answer_factor(tree, bare, [12, 12], priced=True)
    assert s["bare"].predicted_speedup == pytest.approx(1.5 * approx) and 0.9 < approx < 1.0
    # the speedup's prediction interval is scaled as its point
    from sequoia_opt.solver.intervals import PromptSpread

    lo, hi = PromptSpread.from_dict(spread, (0.0, None)).prediction_interval(2)
    k = (1.5 * fs - 1.0) / 0.5  # its distance from 1x shrinks as the point's does
    assert s["t"].predicted_speedup_interval == pytest.approx((1 + (lo - 1) * k, 1 + (hi - 1) * k))
    assert s["t"].predicted_speedup_interval[0] < s["t"].predicted_speedup < s["t"].predicted_speedup_interval[1]


def test_a_runs_predicted_tokens_per_step_is_for_its_own_generation_lengths():
    """treeopt run compared its measured tokens/step (total tokens over steps: the last step of each generation
    emits only what is left) with the tree's steady-state G: at --max-new-tokens 1 it read 1 measured against 2.5
    predicted, '(OUT)'. The prediction is now for the run's lengths: exact from the file's node rates (one step, one
    token at N = 1), the renewal limit from its end_overshoot_tokens otherwise, the steady G without either."""
    from sequoia_opt.jobs.run import answer_factor
    from sequoia_opt.solver.depth import ValueModel
    from sequoia_opt.profiles import AcceptanceProfile
    from sequoia_opt.tree import Tree, TreeMetadata

    tree = Tree.from_choices([[0], [1], [0, 0], [0, 0, 0]])
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.2])), "positional")
    g = vm.expected_tokens(tree)
    meta = TreeMetadata(expected_tokens_per_step=g, extra=vm.run_checks(tree))
    assert g * answer_factor(tree, meta, [1]) == pytest.approx(1.0)  # one step, one token
    assert g * answer_factor(tree, meta, [1, 1, 1]) == pytest.approx(1.0)
    two = g * answer_factor(tree, meta, [2])  # a step emits 1 (then one more step) or >= 2 tokens (done)
    p_more = vm.path_probabilities(tree)[tree.depth == 1].sum()  # P(X >= 2)
    assert two == pytest.approx(2 / (1 + (1 - p_more)))
    renewal = finite_generation_factor(meta.extra["end_overshoot_tokens"], 3 * 512, 3)
    assert answer_factor(tree, meta, [512] * 3) == pytest.approx(renewal, rel=2e-3)
    # without node rates: the renewal limit; without either: no factor (the steady G is shown)
    only = TreeMetadata(expected_tokens_per_step=g, extra={"end_overshoot_tokens": meta.extra["end_overshoot_tokens"]})
    assert answer_factor(None, only, [512] * 3) == pytest.approx(renewal, rel=1e-12)  # no depth: the renewal
    # with G alone (a graft or dynamic policy, an older file): a chain of the tree's depth with G's one rate
    a = np.roots([1, 1, 1, 1 - g])  # 1 + a + a^2 + a^3 = G
    a = float(next(x.real for x in a if abs(x.imag) < 1e-9 and 0 < x.real < 1))
    chain_tail = [1.0, a, a * a, a ** 3]
    from sequoia_opt.solver.generation import expected_steps

    assert answer_factor(tree, TreeMetadata(expected_tokens_per_step=g), [8]) == pytest.approx(
        8 / (g * expected_steps(chain_tail, 8)), rel=1e-6)
    assert answer_factor(None, TreeMetadata(expected_tokens_per_step=g), [8], depth=3) == pytest.approx(
        answer_factor(tree, TreeMetadata(expected_tokens_per_step=g), [8]))
    assert answer_factor(None, TreeMetadata(expected_tokens_per_step=g), [8]) is None  # no depth: no chain
    assert answer_factor(tree, TreeMetadata(), [8]) is None  # no G
    assert answer_factor(tree, meta, []) is None


def _priced_tree_file():
    """A depth-3 tree (widths 1 2 1 1) solved on a synthetic curve, its file as solve writes it (node rates, cut
    step costs): (tree, curve, value model, metadata)."""
    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve
    from sequoia_opt.solver.hardware import run_costs, score_tree

    tree = Tree.from_choices([[0], [1], [0, 0], [0, 0, 0]])
    curve = LatencyCurve.synthetic({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0, 5: 14.0}, {1: 1.0, 2: 1.5})
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.2])), "positional")
    meta = TreeMetadata(expected_tokens_per_step=vm.expected_tokens(tree),
                        predicted_speedup=score_tree(tree, vm.acceptance, curve).speedup,
                        extra={**vm.run_checks(tree), **run_costs(tree, curve)})
    return tree, curve, vm, meta


def test_a_runs_predicted_speedup_prices_the_steps_cut_at_an_answers_end():
    """The decoder drafts no deeper than a row can still emit, so an answer's last steps verify a cut tree and cost
    what it costs; a tree file with a latency curve records each cut's step cost (depth_step_ms) and treeopt run's
    speedup prediction prices them: at N = 1 the one step is plain decoding's (speedup exactly 1), where pricing
    every step as a whole one predicted the whole tree's cost for one token (below 1)."""
    from sequoia_opt.jobs.run import answer_factor
    from sequoia_opt.solver.generation import expected_cost
    from sequoia_opt.solver.hardware import plain_ms_per_token, score_tree

    tree, curve, vm, meta = _priced_tree_file()  # widths 1 2 1 1
    costs = meta.extra["depth_step_ms"]
    # depth 0: plain decoding's step, T(1); depth d: c(w) for each level but the last (per-level) and T(nodes):
    # [1, 2] -> c(1) + T(3); [1, 2, 1] -> c(1) + c(2) + T(4); the whole tree c(1) + c(2) + c(1) + T(5)
    assert costs == pytest.approx([10.0, 1.0 + 12.0, 1.0 + 1.5 + 13.0, 1.0 + 1.5 + 1.0 + 14.0])
    assert costs[0] == pytest.approx(plain_ms_per_token(curve)) and costs[-1] == pytest.approx(
        score_tree(tree, vm.acceptance, curve).cost_ms)
    assert costs == sorted(costs) and len(costs) == tree.tree_depth + 1
    one = meta.predicted_speedup * answer_factor(tree, meta, [1], priced=True)
    assert one == pytest.approx(1.0)  # one token, one plain step
    assert meta.predicted_speedup * answer_factor(tree, meta, [1]) < 1.0  # the whole tree's cost for one token
    reach = vm.path_probabilities(tree)
    tail = step_length_tail(tree.depth, reach)
    for n in (2, 3, 7):
        exact = n / expected_cost(tail, n, costs) * plain_ms_per_token(curve)  # tokens per plain step's time
        assert meta.predicted_speedup * answer_factor(tree, meta, [n], priced=True) == pytest.approx(exact)
        assert answer_factor(tree, meta, [n], priced=True) > answer_factor(tree, meta, [n])
    # without the costs (an older file, or no curve): every step priced as a whole one
    bare = TreeMetadata(expected_tokens_per_step=meta.expected_tokens_per_step, extra=vm.run_checks(tree))
    assert "depth_step_ms" not in bare.extra
    assert answer_factor(tree, bare, [3], priced=True) == answer_factor(tree, bare, [3])


def test_an_answer_ended_on_eos_is_priced_with_the_steps_drafted_for_the_rows_room():
    """An answer that stops on EOS before max_new_tokens was drafted for the tokens its row had left (nobody knew
    the end): its steps verify whole trees until the room, not the answer, runs short. The priced prediction cut
    its last steps as if the end were known, a little high for short EOS-ended answers."""
    from sequoia_opt.jobs.run import answer_factor
    from sequoia_opt.solver.generation import expected_cost, expected_steps

    tree, _, vm, meta = _priced_tree_file()  # depth 3
    costs = meta.extra["depth_step_ms"]
    tail = step_length_tail(tree.depth, vm.path_probabilities(tree))
    # room >= answer + D: every step a whole tree's, E[tau] x c_D
    assert expected_cost(tail, 5, costs, room=8) == pytest.approx(expected_steps(tail, 5) * costs[-1])
    assert expected_cost(tail, 5, costs, room=5) == expected_cost(tail, 5, costs)  # the stop rule's own end
    # one token of slack: a one-token answer's step is cut to depth 1 (room 2 -> depth min(3, 1 + 1 - 1))
    assert expected_cost(tail, 1, costs, room=2) == pytest.approx(costs[1])
    assert expected_cost(tail, 1, costs) < expected_cost(tail, 1, costs, room=2) < expected_cost(tail, 1, costs,
                                                                                                room=9)
    with pytest.raises(ValueError, match="room"):
        expected_cost(tail, 5, costs, room=4)
    f_known = answer_factor(tree, meta, [1, 5], priced=True)
    f_eos = answer_factor(tree, meta, [1, 5], priced=True, rooms=[32, 32])
    exact = 6 * costs[-1] / (float(tail.sum()) * (expected_steps(tail, 1) + expected_steps(tail, 5)) * costs[-1])
    assert f_eos == pytest.approx(exact) and f_eos < f_known
    assert answer_factor(tree, meta, [1, 5], priced=True, rooms=[1, 5]) == f_known  # each ran to its stop rule
    # tokens/step does not depend on who cut the steps
    assert answer_factor(tree, meta, [1, 5], rooms=[32, 32]) == answer_factor(tree, meta, [1, 5])
    # an answer cut by its drafter's context (speculable < tokens) is cut there, whatever room the row had
    assert answer_factor(tree, meta, [24], priced=True, speculable=[10], rooms=[64]) == answer_factor(
        tree, meta, [24], priced=True, speculable=[10])
    # room past the drafter's context: the cut comes at the context's end (speculable 7 for a 5-token answer)
    assert answer_factor(tree, meta, [5], priced=True, speculable=[7], rooms=[64]) == pytest.approx(
        5 * costs[-1] / (float(tail.sum()) * expected_cost(tail, 5, costs, room=7)))


def test_a_runs_summary_prices_answers_ended_on_eos_for_the_room_they_were_drafted_for():
    """The run's own summary passes each answer's room: one that stopped on EOS was drafted for max_new_tokens,
    one that ran to max_new_tokens for its length (the factor alone is tested above; this is its wiring)."""
    from sequoia_opt.decoding.stats import GenerationResult, StepStats
    from sequoia_opt.jobs.run import _summary, answer_factor

    tree, _, _, meta = _priced_tree_file()

    def result(n, stop):  # n tokens in steps of at most 2
        steps = [StepStats(tokens=(1,) * k, accepted_len=k, accepted_nodes=k - 1, accepted_ranks=(0,) * (k - 1),
                           visits=(), draft_ms=1.0, verify_ms=10.0, bookkeeping_ms=0.1, tree_size=tree.size,
                           tree_depth=tree.tree_depth) for k in [2] * (n // 2) + [1] * (n % 2)]
        return GenerationResult(tokens=[1] * n, prompt_len=8, steps=steps, stop_reason=stop)

    def predicted(stops):
        res = [result(3, stops[0]), result(12, stops[1])]
        return _summary("t", tree.size, tree.tree_depth, res, [], 100.0, meta, tree=tree, most=4,
                        factor_depth=tree.tree_depth, max_new_tokens=12).predicted_speedup

    steady = meta.predicted_speedup
    assert predicted(["max_new_tokens", "max_new_tokens"]) == pytest.approx(
        steady * answer_factor(tree, meta, [3, 12], priced=True))
    # the 3-token answer stopped on EOS: drafted for 12 tokens, its steps whole trees (dearer: a lower figure)
    eos = predicted(["eos", "max_new_tokens"])
    assert eos == pytest.approx(steady * answer_factor(tree, meta, [3, 12], priced=True, rooms=[12, 12]))
    assert eos < predicted(["max_new_tokens", "max_new_tokens"])


def test_the_tokens_past_the_drafters_context_are_predicted_as_plain_steps():
    """A tryout's 2,162-token prompt against the draft's 2,048 positions: run warned that every position generated
    lies past the draft's context and decodes plainly, then predicted the tree's 2.067 tokens/step and 1.39x and
    marked the measured 1.0 '(OUT)'. The tokens a drafter cannot guess are plain steps, one token at plain
    decoding's cost: with none guessable the prediction is 1 token/step and 1x; with some, in between."""
    from sequoia_opt.jobs.run import answer_factor
    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve
    from sequoia_opt.solver.depth import ValueModel
    from sequoia_opt.solver.generation import expected_cost, expected_steps, step_length_tail
    from sequoia_opt.solver.hardware import run_costs, score_tree
    from sequoia_opt.tree import Tree, TreeMetadata

    tree = Tree.from_choices([[0], [1], [0, 0]])
    curve = LatencyCurve.synthetic({1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}, {1: 1.0, 2: 1.5})
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.2])), "positional")
    g = vm.expected_tokens(tree)
    meta = TreeMetadata(expected_tokens_per_step=g, predicted_speedup=score_tree(tree, vm.acceptance, curve).speedup,
                        extra={**vm.run_checks(tree), **run_costs(tree, curve)})
    assert g * answer_factor(tree, meta, [24, 24], speculable=[0, 0]) == pytest.approx(1.0)
    assert meta.predicted_speedup * answer_factor(tree, meta, [24], priced=True, speculable=[0]) == pytest.approx(1.0)
    assert answer_factor(tree, meta, [24], speculable=[24]) == answer_factor(tree, meta, [24])  # all guessable
    assert answer_factor(tree, meta, [24], speculable=[99]) == answer_factor(tree, meta, [24])  # capped at N
    tail = step_length_tail(tree.depth, vm.path_probabilities(tree))
    half = g * answer_factor(tree, meta, [24], speculable=[10])  # 10 speculative tokens, then 14 plain steps
    assert half == pytest.approx(24 / (expected_steps(tail, 10) + 14))
    costs = meta.extra["depth_step_ms"]
    priced = meta.predicted_speedup * answer_factor(tree, meta, [24], priced=True, speculable=[10])
    assert priced == pytest.approx(24 * costs[0] / (expected_cost(tail, 10, costs) + 14 * costs[0]))
    assert 1.0 < half < g and 1.0 < priced < meta.predicted_speedup
    # the renewal fallback (no node rates): the plain steps weigh G each against the speculative ones' (k + E[O])
    only = TreeMetadata(expected_tokens_per_step=g, extra={"end_overshoot_tokens": 0.5})
    assert g * answer_factor(None, only, [24], speculable=[0]) == pytest.approx(1.0)
    assert answer_factor(None, only, [24], speculable=[10]) == pytest.approx(24 / (10 + 0.5 + g * 14))


@pytest.mark.parametrize("costs", [None, [10.0, 13.0, 15.5, 17.5], [10.0, 13.0, 6524.7, 17.5], [17.5, 15.5, 13.0, 10.0],
                                   ["10", 13.0, 15.5, 17.5], [10.0, -1.0, 15.5, 17.5], [10.0, 13.0], 5.0])
def test_the_priced_factor_agrees_with_the_files_own_speedup_whatever_its_costs_say(costs):
    """A review found the speedup of a re-timed step (the step check replaces the speedup, not depth_step_ms)
    predicted at 0.934x for one token, and hand-edited costs at 100x (one typo) or 0.6x (reversed). The whole tree's
    step is G / S plain steps, as the file's own speedup was priced; depth_step_ms only shapes the cut steps between,
    and one that falls or is no list of D + 1 positive numbers is not read (a straight line in the depth instead).
    One token is one plain step: 1x, whatever the file."""
    from sequoia_opt.jobs.run import answer_factor, relative_depth_costs
    from sequoia_opt.profiles import AcceptanceProfile
    from sequoia_opt.solver.depth import ValueModel
    from sequoia_opt.tree import Tree, TreeMetadata

    tree = Tree.from_choices([[0], [1], [0, 0], [0, 0, 0]])  # depth 3
    vm = ValueModel.of_profile(AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.2])), "positional")
    g = vm.expected_tokens(tree)
    extra = {**vm.run_checks(tree), **({} if costs is None else {"depth_step_ms": costs})}
    for speedup in (1.3, 0.9):  # the solver's figure, and a step check's that re-timed the tree slower
        meta = TreeMetadata(expected_tokens_per_step=g, predicted_speedup=speedup, extra=extra)
        rel = relative_depth_costs(meta, 3)
        assert rel[0] == 1.0 and rel[-1] == pytest.approx(g / speedup) and len(rel) == 4
        assert speedup * answer_factor(tree, meta, [1], priced=True) == pytest.approx(1.0)
        ten = speedup * answer_factor(tree, meta, [10], priced=True)
        assert min(1.0, speedup) - 1e-9 <= ten <= max(1.0, speedup) + 1e-9  # between plain and the steady state
    if costs == [10.0, 13.0, 15.5, 17.5]:  # read: its shape kept, its scale the file's speedup's
        assert rel == pytest.approx([1.0 + (c / 10.0 - 1.0) * (g / 0.9 - 1.0) / 0.75 for c in costs])
    else:  # not read (or absent): a straight line in the depth
        assert rel == pytest.approx([1.0 + (g / 0.9 - 1.0) * d / 3 for d in range(4)])


def test_chain_rate_gives_the_chain_its_tokens_per_step():
    from sequoia_opt.solver.generation import chain_rate

    for g, d in ((1.0, 1), (1.5, 1), (2.0, 3), (3.29, 6), (4.0, 3)):
        a = chain_rate(g, d)
        assert 0.0 <= a <= 1.0 and sum(a ** k for k in range(d + 1)) == pytest.approx(g, abs=1e-12)
    for g, d in ((0.9, 2), (3.5, 2), (2.0, 0)):
        with pytest.raises(ValueError, match="tokens per step"):
            chain_rate(g, d)
