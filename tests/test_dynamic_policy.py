"""Dynamic trees (EAGLE-2, entropy branching, best-first): the rules on scripted drafters, and the policies in
the decoder (greedy equality with plain decoding, the sampling distribution, commits)."""

from __future__ import annotations

import math

import pytest
import torch
from test_decoding import PROMPTS, _micro_pair, _model, _perturbed, _plain

from sequoia_opt.decoding import process_logits
from sequoia_opt.drafting import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from sequoia_opt.drafting import MultiDraftDecoder
from sequoia_opt.drafting.policies import DynamicPolicy
from sequoia_opt.dynamic import DynamicSetting, Expansion, entropy_children, grow, max_candidates, parse_setting
from sequoia_opt.errors import DecodingError
from tiny_pair import draft_one, verify_one


class Scripted:
    """An expander whose node v's candidates are fixed: ``probs_of(tree, v)`` gives their probabilities."""

    def __init__(self, probs_of, entropy_of=lambda tree, v: 0.0):
        self.probs_of, self.entropy_of, self.calls = probs_of, entropy_of, []

    def expand(self, tree, nodes, k):
        self.calls.append(list(nodes))
        out = []
        for v in nodes:
            ps = self.probs_of(tree, v)[:k]
            out.append(Expansion([100 * v + r for r in range(len(ps))], ps, self.entropy_of(tree, v)))
        return out


def _paths(tree, nodes):
    return sorted(round(tree.path[i], 6) for i in nodes)


def test_eagle_expands_the_topk_frontier_and_keeps_the_budget_best_paths():
    # every node offers 0.6, 0.3, 0.1
    ex = Scripted(lambda t, v: [0.6, 0.3, 0.1])
    s = DynamicSetting("eagle", steps=3, topk=2, budget=6)
    tree, sel = grow(s, 7, ex)
    # forwards: root; its 2 children; the 2 best of the 4 grandchildren (0.36 and 0.18 from child 0.6, and
    # 0.18 from 0.3 ties by creation order)
    assert [len(c) for c in ex.calls] == [1, 2, 2]
    assert tree.n == 1 + 2 + 4 + 4 == max_candidates(s)  # 1 + k + (steps - 1) k^2
    assert tree.token[0] == 7 and sel[0] == 0 and len(sel) == 6
    # kept: the 5 highest path probabilities: 0.6, 0.36, 0.3, 0.216, 0.18 (ancestor-closed)
    assert _paths(tree, sel[1:]) == sorted([0.6, 0.36, 0.3, 0.216, 0.18])
    assert all(tree.parent[i] in sel for i in sel[1:])


def test_entropy_branching_gives_sure_nodes_one_child_and_unsure_nodes_more():
    assert entropy_children(0.0, 8) == 1
    assert entropy_children(math.log(3), 8) == 3
    assert entropy_children(10.0, 4) == 4
    # the root is unsure (H = ln 3 -> 3 children), every other node sure (H = 0 -> 1 child)
    ex = Scripted(lambda t, v: [0.5, 0.3, 0.2], lambda t, v: math.log(3) if v == 0 else 0.0)
    tree, sel = grow(DynamicSetting("entropy", steps=4, topk=4, budget=10), 1, ex)
    assert sel == list(range(tree.n))
    assert [sum(1 for p in tree.parent if p == v) for v in range(4)] == [3, 1, 1, 1]
    assert tree.n == 10  # 1 + 3 + 3 + 3: three chains of depth 3, the fourth level out of budget
    assert max(tree.depth) == 3
    # the budget caps a level: budget 6 -> 3 children, then the 2 best chains get one more each
    tree, _ = grow(DynamicSetting("entropy", steps=4, topk=4, budget=6), 1,
                   Scripted(lambda t, v: [0.5, 0.3, 0.2], lambda t, v: math.log(3) if v == 0 else 0.0))
    assert tree.n == 6 and sorted(tree.path[4:]) == pytest.approx([0.3 * 0.5, 0.5 * 0.5])


def test_best_first_pops_in_path_order_and_scores_lazily():
    # child probabilities 0.9, 0.05 everywhere: best-first follows the chain, siblings come last
    ex = Scripted(lambda t, v: [0.9, 0.05])
    tree, sel = grow(DynamicSetting("best-first", steps=4, topk=2, budget=6), 0, ex)
    assert sel == list(range(6))
    assert tree.path[1:] == pytest.approx([0.9, 0.81, 0.729, 0.6561, 0.05])
    assert [len(c) for c in ex.calls] == [1, 1, 1, 1]  # one forward per chain node, capped at steps = 4
    # a flat drafter: the root's 2 children, then both scored in one forward
    ex = Scripted(lambda t, v: [0.5, 0.5])
    tree, _ = grow(DynamicSetting("best-first", steps=3, topk=2, budget=7), 0, ex)
    assert ex.calls == [[0], [1, 2], [3, 4, 5, 6]][: len(ex.calls)] and tree.n == 7
    assert sorted(tree.path[1:]) == pytest.approx([0.25] * 4 + [0.5] * 2)


def test_the_verified_size_is_what_the_rule_can_grow():
    from sequoia_opt.dynamic import max_tree_size

    assert max_tree_size(parse_setting("eagle:steps=2,topk=2,budget=100000")) == 1 + 2 + 4
    assert max_tree_size(parse_setting("entropy:steps=2,topk=3,budget=100000")) == 1 + 3 + 9
    assert max_tree_size(parse_setting("best-first:steps=3,topk=1,budget=50")) == 4
    assert max_tree_size(parse_setting("best-first:steps=3,topk=3,budget=10")) == 10
    assert max_candidates(parse_setting("entropy:steps=2,topk=2,budget=100000")) == 7  # slots, not the budget
    pol = DynamicPolicy(ModelDrafter(_model(1)), parse_setting("eagle:steps=2,topk=2,budget=100000"))
    assert pol.max_verified == 7 and pol.max_size == 7


def test_settings_parse_and_bad_ones_are_refused():
    assert parse_setting("eagle:steps=4,topk=2,budget=16") == DynamicSetting("eagle", 4, 2, 16)
    assert parse_setting("best-first:s3-k4-n20") == DynamicSetting("best-first", 3, 4, 20)
    assert parse_setting(DynamicSetting("entropy", 2, 3, 9).label) == DynamicSetting("entropy", 2, 3, 9)
    for bad in ("eagle", "beam:steps=1,topk=1,budget=4", "eagle:steps=0,topk=2,budget=8",
                "eagle:steps=2,topk=2,budget=1", "eagle:steps=2,topk=2", "eagle:steps=2,topk=x,budget=4",
                "eagle:steps=2,topk=2,budget=4,steps=3"):
        with pytest.raises(ValueError):
            parse_setting(bad)


@pytest.fixture(scope="module")
def target():
    return _model(0)


@pytest.fixture(scope="module")
def draft(target):
    return _perturbed(target, 0.15, 2)


SETTINGS = [DynamicSetting("eagle", 3, 2, 6), DynamicSetting("eagle", 4, 3, 12),
            DynamicSetting("entropy", 4, 3, 10), DynamicSetting("best-first", 4, 3, 10),
            DynamicSetting("best-first", 2, 1, 3)]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.label)
@pytest.mark.parametrize("kind", ["model", "self"])
def test_greedy_output_equals_plain_decoding(target, draft, setting, kind):
    drafter = ModelDrafter(draft) if kind == "model" else LayerSkipDrafter(target, 1)
    pol = DynamicPolicy(drafter, setting)
    dec = MultiDraftDecoder(target, pol, max_len=160)
    sizes, accepted = [], 0
    for prompt in PROMPTS:
        res = dec.generate(prompt, 24)
        assert res.tokens == _plain(target, prompt, 24), (setting.label, prompt)
        sizes += [s.tree_size for s in res.steps]
        accepted += sum(s.accepted_nodes for s in res.steps)
        assert all(s.tree_depth <= setting.steps for s in res.steps)
    assert max(sizes) <= setting.budget
    assert accepted > 0  # the trees did speculate something that the target accepted
    assert len(pol.last_tree.forward_widths) <= setting.steps


@pytest.mark.parametrize("setting", SETTINGS[1:4], ids=lambda s: s.label)
def test_a_grown_tree_is_no_deeper_than_the_row_can_still_emit(target, setting):
    """r tokens left: the tree grows at most r - 1 levels (one token left: the root alone, no draft forward), and
    the tokens are plain decoding's. The draft is the target itself: its trees go deeper than 1 where allowed."""
    pol = DynamicPolicy(ModelDrafter(target), setting)
    dec = MultiDraftDecoder(target, pol, max_len=160)
    prompt = PROMPTS[2]
    assert max(s.tree_depth for s in dec.generate(prompt, 24).steps) >= 2
    for m in (1, 2, 3, 7):
        res = dec.generate(prompt, m)
        assert res.tokens == _plain(target, prompt, 24)[:m], m
        left = m
        for s in res.steps:
            assert s.tree_depth <= min(setting.steps, left - 1), (m, left)
            left -= s.accepted_len
        assert left == 0
        if m == 2:
            assert res.steps[0].tree_depth == 1  # two tokens left: one level
    one = dec.generate(prompt, 1).steps
    assert len(one) == 1 and one[0].tree_size == 1 and pol.drafter_calls == [0]


def test_the_verified_tree_is_the_rules_selection(target, draft):
    pol = DynamicPolicy(ModelDrafter(draft), DynamicSetting("eagle", 3, 3, 8))
    dec = MultiDraftDecoder(target, pol, max_len=160)
    state = dec.start([5, 17, 3, 9], 10)
    tree = draft_one(dec, state)
    cand, sel = pol.last_tree, pol.last_selected
    assert tree.n == 8 and len(sel) == 8 and cand.n == 1 + 3 + 2 * 9
    assert [cand.token[c] for c in sel] == tree.token_list
    assert [sel.index(cand.parent[c]) for c in sel[1:]] == tree.parent[1:]
    # the kept nodes are the 7 best path probabilities of the grown tree
    best = sorted(cand.path[1:], reverse=True)[:7]
    assert sorted((cand.path[c] for c in sel[1:]), reverse=True) == pytest.approx(best)
    # greedy draft probabilities are the draft's softmax at temperature 1 along the path
    with torch.inference_mode():
        q = draft(torch.tensor([[5, 17, 3, 9]]))[0, -1].float().softmax(-1)
    first = cand.token.index(int(q.argmax()), 1)
    assert cand.prob[first] == pytest.approx(float(q.max()), rel=1e-5)


def test_lookup_cannot_drive_a_dynamic_tree(target):
    """Refused when the policy is made (it was refused at the first step, after the prefill)."""
    with pytest.raises(DecodingError, match="has no draft probabilities \\(PromptLookupDrafter\\)"):
        DynamicPolicy(PromptLookupDrafter(target.config.vocab_size), DynamicSetting("eagle", 2, 2, 4))


def _tv(counts, p):
    return 0.5 * (counts.double() / counts.sum() - p.double()).abs().sum().item()


@pytest.mark.parametrize("trials", [pytest.param(1_500, id="fast"),
                                    pytest.param(30_000, id="long", marks=pytest.mark.slow)])
@pytest.mark.parametrize("policy", ["eagle", "entropy", "best-first"])
def test_sampling_emits_the_target_distribution(trials, policy):
    """Each trial drafts afresh from the same state, verifies and accepts; the first emitted token follows
    p(. | prompt) at temperature 1, top-p 0.95 (fast: tolerance covers ~0.02 noise; slow: 0.01)."""
    tgt, drf = _micro_pair()
    prompt, T, top_p = [2, 5, 1, 2, 5, 3, 2, 1, 4, 2], 1.0, 0.95
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (6,)
    pol = DynamicPolicy(ModelDrafter(drf), DynamicSetting(policy, 3, 3, 6))
    dec = MultiDraftDecoder(tgt, pol, temperature=T, top_p=top_p, generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    first, accepted = torch.zeros(6), 0
    with torch.inference_mode():
        for _ in range(trials):
            tree = draft_one(dec, state)
            acc = dec.accept(tree, verify_one(dec, state, tree))
            first[acc.tokens[0]] += 1
            accepted += acc.accepted_nodes > 0
    tol = 0.035 if trials < 10_000 else 0.01
    assert _tv(first, p1) < tol, _tv(first, p1)
    assert accepted > trials // 4  # candidates were really accepted (not only bonus tokens)
