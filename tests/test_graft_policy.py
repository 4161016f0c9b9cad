"""Multi-drafter trees at run time: the graft policy (TreeGraft) and SpecInfer's merge, in
MultiDraftDecoder. Greedy output equals plain decoding with mixed provenance; grafting never removes a
branch; sampling with candidates of several drafters is exact (TV against the target's own sampling)."""

from __future__ import annotations

import copy

import pytest
import torch
from test_decoding import PROMPTS, _micro_pair, _model, _perturbed, _plain

from sequoia_opt.decoding import process_logits, sample_without_replacement
from sequoia_opt.drafting import LayerSkipDrafter, ModelDrafter, PromptLookupDrafter
from sequoia_opt.drafting import MultiDraftDecoder
from sequoia_opt.drafting.policies import AlwaysGraft, GraftFeatures, GraftPolicy, LogisticScheduler, MergePolicy, NeverGraft, load_scheduler, save_scheduler
from sequoia_opt.decoding.sampling import CandidateGroup, sample_excluding, verify_groups_node
from sequoia_opt.errors import DecodingError, ProfileError
from sequoia_opt.tree import Tree
from tiny_pair import draft_one, verify_one

# a plan: light spine [0] [0,0] [0,0,0] with siblings; strong grafts at the root ([2]: a recovered branch with
# its own child [2,0]), under [1] and next to [0,0] (as [0,1])
PLAN = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [2, 0], [0, 0, 0]])
STRONG = {(2,), (2, 0), (1, 0), (0, 1)}
LABELS = [0] + [int(tuple(c) in STRONG) for c in PLAN.choices()]


@pytest.fixture(scope="module")
def target():
    return _model(0)


@pytest.fixture(scope="module")
def drafts(target):
    return {"weak": _perturbed(target, 0.6, 1), "strong": _perturbed(target, 0.15, 2)}


def _decoders(target, drafts):
    V = target.config.vocab_size
    weak, strong = drafts["weak"], drafts["strong"]
    return {
        "model/model": lambda: GraftPolicy(ModelDrafter(weak), ModelDrafter(strong), PLAN, LABELS),
        "lookup/model": lambda: GraftPolicy(PromptLookupDrafter(V), ModelDrafter(strong), PLAN, LABELS),
        "model/self": lambda: GraftPolicy(ModelDrafter(weak), LayerSkipDrafter(target, 1), PLAN, LABELS),
        "self/model": lambda: GraftPolicy(LayerSkipDrafter(target, 1), ModelDrafter(strong), PLAN, LABELS),
        "model/lookup": lambda: GraftPolicy(ModelDrafter(weak), PromptLookupDrafter(V), PLAN, LABELS),
        "merge lookup+model+model": lambda: MergePolicy(
            [PromptLookupDrafter(V), ModelDrafter(weak), ModelDrafter(strong)], [PLAN, PLAN, Tree.chain(4)]),
        "merge self+model": lambda: MergePolicy([LayerSkipDrafter(target, 1), ModelDrafter(strong)],
                                                [PLAN, Tree.chain(4)]),
    }


@pytest.mark.parametrize("kind", ["model/model", "lookup/model", "model/self", "self/model", "model/lookup",
                                  "merge lookup+model+model", "merge self+model"])
def test_greedy_output_equals_plain_decoding_with_mixed_provenance(target, drafts, kind):
    dec = MultiDraftDecoder(target, _decoders(target, drafts)[kind](), max_len=128)
    accepted_by = set()
    for prompt in PROMPTS:
        res = dec.generate(prompt, 20)
        assert res.tokens == _plain(target, prompt), (kind, prompt)
        accepted_by.update(d for s in res.steps for d in s.accepted_drafters)
        assert all(s.tree_size >= 1 for s in res.steps)
    if kind in ("model/model", "self/model"):  # both drafters' nodes were accepted somewhere
        assert accepted_by == {0, 1}


def test_scheduler_that_never_calls_the_strong_drafter_runs_the_light_tree_alone(target, drafts):
    pol = GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), PLAN, LABELS,
                      scheduler=NeverGraft(), cut_at_answer_end=False)
    res = MultiDraftDecoder(target, pol, max_len=128).generate(PROMPTS[2], 20)
    assert res.tokens == _plain(target, PROMPTS[2])
    assert {s.tree_size for s in res.steps} == {pol.n_light} == {5}
    ms, calls, accepted = res.drafter_totals()
    assert calls == [res.num_steps, 0] and ms[1] == 0.0 and accepted[1] == 0


@pytest.mark.parametrize("kind", ["graft", "merge"])
def test_graft_and_merge_draft_no_deeper_than_the_row_can_still_emit(target, kind):
    """With drafters that are always accepted (copies of the target), a row with r tokens left drafts the plan cut
    to depth r - 1 (the root alone at r = 1), the whole plan before; the tokens are plain decoding's, and with the
    cut off every step drafts the whole plan."""
    prompt = PROMPTS[2]
    ref = _plain(target, prompt, 12)

    def policy(cut):
        same = [ModelDrafter(copy.deepcopy(target)) for _ in range(2)]
        if kind == "graft":
            return GraftPolicy(*same, PLAN, LABELS, cut_at_answer_end=cut)
        return MergePolicy(same, [PLAN, Tree.chain(2)], cut_at_answer_end=cut)

    D = PLAN.tree_depth  # 3: the light spine [0] [0, 0] [0, 0, 0] (graft), the deepest of the two trees (merge)
    for m in (1, 2, 5, 7, 12):
        res = MultiDraftDecoder(target, policy(True), max_len=128).generate(prompt, m)
        assert res.tokens == ref[:m], (kind, m)
        assert [s.tree_depth for s in res.steps] == [min(D, r - 1) for r in range(m, 0, -(D + 1))], (kind, m)
        assert res.steps[-1].drafter_calls == ((0, 0) if m % (D + 1) == 1 else (1, 1))  # the root alone asks none
        whole = MultiDraftDecoder(target, policy(False), max_len=128).generate(prompt, m)
        assert whole.tokens == ref[:m] and {s.tree_depth for s in whole.steps} == {D}, (kind, m)


def test_grafting_never_removes_a_branch_and_never_repeats_a_light_sibling(target, drafts):
    """From one state, the light drafter's part of the tree is the same whether or not the strong drafter is
    called, and every grafted candidate is a token no light sibling has."""
    for temperature in (0.0, 1.0):
        trees = {}
        for sched in (NeverGraft(), AlwaysGraft()):
            pol = GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), PLAN, LABELS,
                              scheduler=sched)
            dec = MultiDraftDecoder(target, pol, max_len=128, temperature=temperature,
                                    generator=torch.Generator().manual_seed(5))
            state = dec.start(PROMPTS[3], 10)
            trees[sched.name] = draft_one(dec, state)
        light, full = trees["never"], trees["always"]
        n = light.n
        assert full.n == PLAN.size and n == 5
        assert full.token_list[:n] == light.token_list and full.parent[:n] == light.parent
        for node in range(full.n):
            toks = [full.token_list[c] for c in full.children[node]]
            assert len(set(toks)) == len(toks)  # siblings distinct: no duplicate of a light candidate
            assert [full.source[c] for c in full.children[node]] == sorted(full.source[c] for c in full.children[node])
        assert sorted(full.source[n:]) == [1, 1, 1, 1]


def test_merge_keeps_one_node_per_token_with_both_provenances(target, drafts):
    """Two copies of one drafter propose the same tree: the union is that tree, every node proposed by both."""
    pol = MergePolicy([ModelDrafter(drafts["weak"]), ModelDrafter(drafts["weak"])], [PLAN, Tree.chain(3)])
    dec = MultiDraftDecoder(target, pol, max_len=128)
    state = dec.start(PROMPTS[3], 10)
    tree = draft_one(dec, state)
    assert tree.n == PLAN.size
    spine = [0, 1, 4]  # the chain's nodes are the plan's rank-0 spine
    assert [tree.provenance[i] for i in spine[1:]] == [0b11, 0b11]
    assert all(tree.provenance[i] == 0b01 for i in range(1, tree.n) if i not in spine)
    assert len(tree.groups(0)) == 2 and tree.group_children(0)[1] == [tree.children[0][0]]


def test_near_the_end_of_the_cache_steps_become_plain_and_output_is_unchanged(target, drafts):
    pol = GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), PLAN, LABELS)
    dec = MultiDraftDecoder(target, pol, max_len=30)
    prompt = PROMPTS[3]
    res = dec.generate(prompt, 30 - len(prompt))
    assert res.tokens == _plain(target, prompt, 30 - len(prompt))
    assert res.steps[-1].tree_size == 1 and res.steps[0].tree_size == PLAN.size


def test_bad_plans_and_pairs_are_refused(target, drafts):
    with pytest.raises(DecodingError, match="light node under a strong"):
        GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), Tree.chain(3), [0, 1, 0])
    with pytest.raises(DecodingError, match="light first"):
        GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]),
                    Tree.from_choices([[0], [1]]), [0, 1, 0])
    with pytest.raises(DecodingError, match="drafters 0"):
        GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), Tree.chain(2), [0, 2])
    with pytest.raises(DecodingError, match="vocabulary"):
        MultiDraftDecoder(target, GraftPolicy(PromptLookupDrafter(7), ModelDrafter(drafts["strong"]), PLAN, LABELS))
    with pytest.raises(DecodingError, match="one tree per drafter"):
        MergePolicy([ModelDrafter(drafts["weak"])], [PLAN])


def test_names_must_match_the_drafters_or_a_drafters_vocabulary_goes_unchecked(target, drafts):
    """A names list shorter than the drafters used to be accepted: the decoder's vocabulary check zips names with
    drafters, so an unnamed drafter with another vocabulary ran unchecked."""
    V = target.config.vocab_size
    with pytest.raises(DecodingError, match="one name per drafter: got 1 names for 2 drafters"):
        MergePolicy([ModelDrafter(drafts["strong"]), PromptLookupDrafter(V + 43)], [PLAN, PLAN], names=["a"])
    with pytest.raises(DecodingError, match=r"names its two drafters \(light, strong\), got \['x'\]"):
        GraftPolicy(ModelDrafter(drafts["strong"]), PromptLookupDrafter(V + 43), PLAN, LABELS, names=("x",))

    class Unnamed(MergePolicy):  # a policy of the user's own that forgets a name: the decoder refuses it
        def __init__(self, *a):
            super().__init__(*a)
            self.names = self.names[:1]

    with pytest.raises(DecodingError, match="names 1 drafter"):
        MultiDraftDecoder(target, Unnamed([ModelDrafter(drafts["strong"]), PromptLookupDrafter(V + 43)],
                                          [PLAN, PLAN]))


def test_scheduler_file_round_trips_and_refuses_another_pair(tmp_path):
    s = LogisticScheduler(weights=[-3.0, 0.0, 0.0, -1.0], bias=2.0, pair={"target": "t", "light": "a", "strong": "b"},
                          card={"trained_on": "test"})
    f = tmp_path / "s.yaml"
    save_scheduler(f, s)
    back = load_scheduler(f, pair={"target": "t", "light": "a", "strong": "b"})
    assert back.weights == s.weights and back.bias == 2.0 and back.card == {"trained_on": "test"}
    confident = GraftFeatures(0.95, 0.9, 0.8, 3.0)
    unsure = GraftFeatures(0.1, 0.2, 0.1, 0.0)
    assert not back.decide(confident) and back.decide(unsure)
    assert back.probability(unsure) == pytest.approx(1 / (1 + 2.718281828 ** -(2.0 - 0.3)), rel=1e-6)
    with pytest.raises(ProfileError, match="trained for strong 'b'"):
        load_scheduler(f, pair={"strong": "c"})
    # another kind is refused, not run as a logistic model
    f.write_text(f.read_text().replace("kind: logistic", "kind: forest"))
    with pytest.raises(ProfileError, match="scheduler kind 'forest' is not one this version runs"):
        load_scheduler(f)
    f.write_text("format: other/1\n")
    with pytest.raises(ProfileError, match="treeopt-scheduler/1"):
        load_scheduler(f)


# ---------------------------------------------------------------------------------------------- exact sampling
def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * (counts.double() / counts.sum() - p.double()).abs().sum().item()


@pytest.mark.parametrize("trials", [pytest.param(25_000, id="fast"),
                                    pytest.param(200_000, id="long", marks=pytest.mark.slow)])
def test_groups_of_two_drafters_emit_the_target_distribution(trials):
    """One node: 2 light candidates sampled without replacement from q1, then 2 strong candidates from q2 with
    the light's removed (then, in a second run, a point-mass group of fixed candidates first). Candidates are
    redrawn every trial; the emitted token follows p. Sampling noise in TV: about 0.005 at 25k trials, 0.0019
    at 200k."""
    V = 6
    p = torch.tensor([0.30, 0.05, 0.25, 0.10, 0.20, 0.10])
    q1 = torch.tensor([0.05, 0.40, 0.05, 0.30, 0.10, 0.10])
    q2 = torch.tensor([0.25, 0.10, 0.30, 0.05, 0.20, 0.10])
    g = torch.Generator().manual_seed(0)
    for point_mass_first in (False, True):
        counts = torch.zeros(V)
        accepted_strong = 0
        for _ in range(trials):
            if point_mass_first:
                light = CandidateGroup(None, torch.tensor([1, 3]), 0)
            else:
                light = CandidateGroup(q1, sample_without_replacement(q1.unsqueeze(0), 2, g)[0], 0)
            cand, q2c = sample_excluding(q2, 2, light.tokens.tolist(), g)
            assert not set(cand.tolist()) & set(light.tokens.tolist())
            hit, tok = verify_groups_node(p, [light, CandidateGroup(q2c, cand, 1)], g)
            counts[tok] += 1
            accepted_strong += hit is not None and hit[0] == 1
        assert _tv(counts, p) < 0.01, (point_mass_first, _tv(counts, p))
        assert accepted_strong > trials // 6  # the strong group is really exercised


@pytest.mark.parametrize("trials", [pytest.param(1_500, id="fast"),
                                    pytest.param(30_000, id="long", marks=pytest.mark.slow)])
@pytest.mark.parametrize("kind", ["graft", "merge"])
def test_decoder_with_several_drafters_samples_the_target_distribution(trials, kind):
    """End to end on a 6-token vocabulary with top-p: each trial drafts afresh (new candidates) from the same
    state, verifies and accepts; the first emitted token follows p(. | prompt). Measured TV: see the
    assertion (fast run's tolerance covers its ~0.02 sampling noise; the slow run is held to 0.01)."""
    tgt, drf = _micro_pair()
    light_model = _perturbed(tgt, 0.8, 7)
    prompt, T, top_p = [2, 5, 1, 2, 5, 3, 2, 1, 4, 2], 1.0, 0.95
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (6,)
    plan = Tree.from_choices([[0], [1], [2], [0, 0], [2, 0]])
    if kind == "graft":
        pol = GraftPolicy(ModelDrafter(light_model), ModelDrafter(drf), plan, [0, 0, 0, 1, 0, 1])
    else:
        pol = MergePolicy([PromptLookupDrafter(6), ModelDrafter(light_model), ModelDrafter(drf)],
                          [Tree.chain(3), plan, Tree.from_choices([[0], [1], [0, 0]])])
    dec = MultiDraftDecoder(tgt, pol, temperature=T, top_p=top_p, generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    first = torch.zeros(6)
    with torch.inference_mode():
        for _ in range(trials):
            tree = draft_one(dec, state)
            acc = dec.accept(tree, verify_one(dec, state, tree))
            first[acc.tokens[0]] += 1
    tol = 0.035 if trials < 10_000 else 0.01
    assert _tv(first, p1) < tol, _tv(first, p1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_reselected_grafts_go_where_the_strong_drafter_scores_highest(target, drafts, temperature):
    """Re-selection moves the plan's leaf grafts under light parents of one depth (here depth 1: the plan's
    [1, 0] and [0, 1]) to the pairs (light node v, token t) with the highest P_strong(path to v) * q_strong(t | v),
    recomputed here from cache-free forwards of the strong model; the tree keeps the plan's size and depths, no
    sibling repeats a token, greedy output is unchanged, and sampling (point masses) runs."""
    strong = drafts["strong"]
    pol = GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(strong), PLAN, LABELS, reselect=True)
    assert pol.reselect_levels == {1: 2}  # the root's graft [2] has a child: its position stays
    dec = MultiDraftDecoder(target, pol, max_len=128, temperature=temperature,
                            generator=torch.Generator().manual_seed(3))
    prompt = PROMPTS[3]
    state = dec.start(prompt, 10)
    tree = draft_one(dec, state)
    assert tree.n == PLAN.size and sorted(tree.depth) == sorted(PLAN.depth.tolist())
    for node in range(tree.n):
        toks = [tree.token_list[c] for c in tree.children[node]]
        assert len(set(toks)) == len(toks)
    with torch.inference_mode():
        q_root = strong(torch.tensor([prompt]))[0, -1].float().softmax(-1)
        pairs = []
        for v in (1, 2):  # the light depth-1 nodes the strong drafter runs over ([0] and [1])
            tok = tree.token_list[v]
            q_v = strong(torch.tensor([prompt + [tok]]))[0, -1].float().softmax(-1)
            light_kids = {tree.token_list[c] for c in tree.children[v] if tree.source[c] == 0}
            pairs += [(float(q_root[tok] * q_v[t]), v, t) for t in range(q_v.numel()) if t not in light_kids]
    want = sorted(((v, t) for _, v, t in sorted(pairs, reverse=True)[:2]))
    got = sorted((tree.parent[c], tree.token_list[c]) for c in range(tree.n)
                 if tree.source[c] == 1 and tree.depth[c] == 2 and tree.parent[c] in (1, 2))
    assert got == want
    if temperature == 0:
        for p in PROMPTS:
            assert dec.generate(p, 20).tokens == _plain(target, p)
    else:
        assert len(dec.generate(PROMPTS[2], 20).tokens) == 20


# ---------------------------------------------------------------------------------- nothing left to graft
# A plan whose strong grafts sit at the root ([2], [3]) with a grafted branch [2, 0]; the light drafter
# proposes [0], [1] and [0, 0].
SPARE_PLAN = Tree.from_choices([[0], [1], [2], [3], [0, 0], [2, 0]])
SPARE_LABELS = [0] + [int(c[0] >= 2) for c in SPARE_PLAN.choices()]


@pytest.mark.parametrize("trials", [pytest.param(1_500, id="fast"),
                                    pytest.param(30_000, id="long", marks=pytest.mark.slow)])
def test_a_site_with_nothing_left_to_graft_gets_no_grafted_children_and_sampling_stays_exact(trials):
    """Top-p 0.9 on the micro pair: the target's nucleus at the prompt is {2, 5} (p = 0.44 / 0.56); the strong
    drafter is the target itself and the light drafter a perturbed copy whose nucleus is {0, 2, 5}. When the
    light's two root candidates are 2 and 5 (about 2/3 of the draws) the strong drafter's q with them
    removed has no mass: the root gets no grafted child and no node below it (the step tree is the light's
    4 nodes); when they are {0, 5} or {0, 2}, one grafted child (and its branch) of the plan's two. The step
    goes on exactly: the first emitted token follows p (TV below the fast run's ~0.02 noise bound)."""
    tgt, _ = _micro_pair()
    light_model = _perturbed(tgt, 0.4, 7)
    prompt, T, top_p = [2, 5, 1, 2, 5, 3, 2, 1, 4, 2], 1.0, 0.9
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (6,)
    assert p1.nonzero().flatten().tolist() == [2, 5]
    pol = GraftPolicy(ModelDrafter(light_model), ModelDrafter(tgt), SPARE_PLAN, SPARE_LABELS)
    dec = MultiDraftDecoder(tgt, pol, temperature=T, top_p=top_p, generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    first, sizes, strong_hits = torch.zeros(6), {}, 0
    with torch.inference_mode():
        for _ in range(trials):
            tree = draft_one(dec, state)
            light_root = {tree.token_list[c] for c in tree.children[0] if tree.source[c] == 0}
            grafted = [tree.token_list[c] for c in tree.children[0] if tree.source[c] == 1]
            assert set(grafted) == {2, 5} - light_root  # every token with mass left, nothing without
            sizes[tree.n] = sizes.get(tree.n, 0) + 1
            acc = dec.accept(tree, verify_one(dec, state, tree))
            first[acc.tokens[0]] += 1
            strong_hits += len(acc.path) > 1 and tree.source[acc.path[1]] == 1
    assert set(sizes) == {4, 6}  # nothing grafted / one grafted child and its branch
    assert sizes[4] > trials // 2 and sizes[6] > trials // 10
    assert strong_hits > 0
    tol = 0.035 if trials < 10_000 else 0.01
    assert _tv(first, p1) < tol, _tv(first, p1)


class _TopTwoDrafter(ModelDrafter):
    """A drafter whose logits are -inf outside its two best tokens (a drafter with a truncated vocabulary,
    padded with -inf to the target's): under greedy decoding a site where the light drafter already proposed
    both has nothing left to graft."""

    def score_nodes(self, *args, **kwargs):
        logits = super().score_nodes(*args, **kwargs)
        keep = logits.topk(2, dim=-1).indices
        return torch.full_like(logits, float("-inf")).scatter(-1, keep, logits.gather(-1, keep))


def test_greedy_grafts_only_finite_candidates_and_output_equals_plain_decoding(target, drafts):
    pol = GraftPolicy(ModelDrafter(drafts["weak"]), _TopTwoDrafter(drafts["strong"]), SPARE_PLAN, SPARE_LABELS)
    dec = MultiDraftDecoder(target, pol, max_len=128)
    sizes = set()
    for prompt in PROMPTS:
        state = dec.start(prompt, 20)
        tree = draft_one(dec, state)
        for node in range(tree.n):
            toks = [tree.token_list[c] for c in tree.children[node]]
            assert len(set(toks)) == len(toks)  # never a light sibling repeated through a -inf logit
        sizes.add(tree.n)
        assert dec.generate(prompt, 20).tokens == _plain(target, prompt)
    assert min(sizes) < SPARE_PLAN.size  # some root had fewer than two finite tokens left


def test_an_unusable_draft_distribution_names_the_drafter_and_node_not_the_target(target, drafts):
    """A grafted group whose q has no mass (a drafter's fault) is reported against that drafter, at its node;
    NaN target logits are still the target's."""
    from sequoia_opt.decoding import StepTree

    pol = GraftPolicy(ModelDrafter(drafts["weak"]), ModelDrafter(drafts["strong"]), SPARE_PLAN, SPARE_LABELS,
                      names=("light-x", "strong-y"))
    dec = MultiDraftDecoder(target, pol, temperature=1.0, generator=torch.Generator().manual_seed(0))
    V = target.config.vocab_size
    tree = StepTree(5)
    tree.add_group(0, CandidateGroup(None, torch.tensor([7]), 0))
    tree.add_group(1, CandidateGroup(torch.zeros(V), torch.tensor([9]), 1))
    logits = torch.zeros(tree.n, V)
    logits[0, 7] = 50.0  # the target accepts the light's token 7, then meets the strong's massless q at node 1
    with pytest.raises(DecodingError, match=r"^cannot verify tree node 1 \(depth 1\): the candidates of drafter "
                                            r"'strong-y' come with a distribution the residual rule cannot use"):
        dec.accept(tree, logits)
    logits[1, 0] = float("nan")
    with pytest.raises(DecodingError, match=r"the target model 'tiny' produced unusable output: the logits hold NaN.*"
                                            r"\(at tree node 1, depth 1\)$"):
        dec.accept(tree, logits)
