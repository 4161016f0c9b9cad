"""The prompt lookup (n-gram) drafter and point-mass verification: its candidates on hand-made texts, its
trees, greedy output identical to plain decoding (also near the end of the context), acceptance on a text
that repeats itself, exact sampling (the pure rule and the decoder), and its parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_decoding import CFG, PROMPTS, SEQUOIA_LIKE, TREES, _micro_pair, _model, _plain, _with_context
from test_drafters import assert_near_the_end_equals_plain

from sequoia_opt.decoding import (AutoregressiveDecoder, TreeBuffers, autoregressive_generate, process_logits,
                                  verify_point_mass_batch, verify_point_mass_node)
from sequoia_opt.drafting import DRAFTERS, PromptLookupDrafter, SpeculativeDecoder, parse_drafter_spec
from sequoia_opt.errors import DecodingError
from sequoia_opt.tree import Tree
from tiny_pair import draft_one, one_row_state, verify_one


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * (counts.double() / counts.sum() - p.double()).abs().sum().item()


@pytest.fixture(scope="module")
def target():
    return _model(0)


def _lookup(V=16, **kw):
    return PromptLookupDrafter(V, **kw)


# ---------------------------------------------------------------------------------------------- the rule


def test_registry_and_protocol_attributes(target):
    kind = DRAFTERS["lookup"]
    assert (kind.cost_model, kind.has_probs, kind.loads_model) == ("one-pass", False, False)
    d = kind.build(parse_drafter_spec("lookup:2-4"), target, None)
    assert isinstance(d, PromptLookupDrafter)
    assert (d.cost_model, d.has_probs, d.cached, d.prompt_lookup_min, d.prompt_lookup_max) == \
        ("one-pass", False, 0, 2, 4)
    buf = TreeBuffers.build(Tree.chain(4), "cpu")
    assert d.context > 10**15 and d.limit(one_row_state(list(range(10**3))), buf) == 3


def test_longest_match_is_the_first_candidate():
    d = _lookup()
    assert d.candidates([5, 6, 7, 8, 5, 6, 7], [], 1) == [8]
    assert d.candidates([5, 6, 7, 8, 5, 6, 7], [], 3) == [8, 0, 1]  # then fillers 0, 1


def test_longer_match_beats_frequency():
    # (7, 1, 2) is followed by 3 once; (1, 2) by 4 twice: the length-3 match ranks first
    seq = [7, 1, 2, 3, 8, 1, 2, 4, 9, 1, 2, 4, 7, 1, 2]
    assert _lookup().candidates(seq, [], 2) == [3, 4]


def test_frequency_then_recency():
    # (1, 2) is followed by 9 twice and by 4 once: 9 first, however recent 4 is
    assert _lookup(prompt_lookup_max=2).candidates([1, 2, 9, 1, 2, 9, 1, 2, 4, 1, 2], [], 3) == [9, 4, 0]
    # a tie in frequency: the most recent continuation first
    assert _lookup(prompt_lookup_max=2).candidates([1, 2, 3, 1, 2, 4, 1, 2], [], 2) == [4, 3]


def test_no_match_gives_fillers_distinct_from_the_found_candidates():
    assert _lookup().candidates([3, 4], [], 3) == [0, 1, 2]
    assert _lookup().candidates([1, 0, 1], [], 3) == [0, 1, 2]  # found 0, then fillers 1, 2
    assert _lookup().candidates([2, 1, 0, 2], [], 3) == [1, 0, 2]  # found 1, then fillers 0, 2
    assert _lookup().candidates([7], [], 2) == [0, 1]  # a one-token context has no earlier occurrence
    assert _lookup(prompt_lookup_min=2).candidates([5, 6, 5], [], 1) == [0]  # (5) alone is too short
    with pytest.raises(DecodingError, match="17 distinct candidates"):
        _lookup().candidates([1], [], 17)


def test_the_root_path_extends_the_context():
    d = _lookup()
    # (4) occurs earlier only inside the path: [9] + [4, 6, 4] -> 6
    assert d.candidates([9], [4, 6, 4], 1) == [6]
    # followers in the committed text and in the path are counted together (tie: the path's is more recent)
    assert d.candidates([4, 7, 1], [4, 8, 4], 3) == [8, 7, 0]
    # the index is not changed by a path
    assert d.indexed == 3 and d.candidates([4, 7, 1], [4], 2) == [7, 0]


def test_index_follows_the_committed_sequence_and_rebuilds_on_another_one():
    d = _lookup()
    d.prefill(one_row_state([5, 6, 7]))
    assert d.indexed == 3 and d.candidates([5, 6, 7, 8, 5, 6, 7], [], 1) == [8] and d.indexed == 7
    assert d.candidates([1, 2, 1], [], 1) == [2] and d.indexed == 3  # not an extension: rebuilt
    d.reset()
    assert d.indexed == 0 and d.cached == 0


_state = one_row_state


def test_a_chain_copies_the_continuation():
    d = _lookup()
    buf = TreeBuffers.build(Tree.chain(5), "cpu")  # 5 nodes, depth 4
    out = d.propose(_state([10, 11, 12, 13, 14, 20, 10, 11]), buf)
    assert out.tokens.tolist() == [[11, 12, 13, 14, 20]] and out.probs is None and out.depth == 4


@pytest.mark.parametrize("tree_name", ["sequoia", "wide", "star"])
def test_every_node_gets_its_ranked_candidates_and_siblings_are_distinct(tree_name):
    tree = TREES[tree_name]
    buf = TreeBuffers.build(tree, "cpu")
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 6, size=50).tolist()  # a small alphabet: many matches
    d = _lookup(prompt_lookup_max=4)
    toks = d.propose(_state(seq), buf).tokens[0].tolist()
    assert toks[0] == seq[-1]
    for i, ch in enumerate(buf.children):
        if not ch:
            continue
        path, j = [], i
        while j > 0:
            path.insert(0, toks[j])
            j = tree.parent[j]
        assert [toks[c] for c in ch] == d.candidates(seq, path, len(ch))
        assert len({toks[c] for c in ch}) == len(ch)
    forced = torch.arange(buf.n).unsqueeze(0)  # (1, n)
    forced[0, 0] = seq[-1]
    assert d.propose(_state(seq), buf, forced).tokens is forced


@pytest.mark.parametrize("kw,name", [
    ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
    ({"prompt_lookup_min": 4, "prompt_lookup_max": 3}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 2.0}, "prompt_lookup_max"),
    ({"prompt_lookup_min": True}, "prompt_lookup_min"),
    ({"prompt_lookup_max": "3"}, "prompt_lookup_max"),
    ({"vocab_size": 0}, "vocab_size"),
])
def test_bad_parameters_are_refused_naming_them(kw, name):
    kw = {"vocab_size": 16, **kw}
    with pytest.raises(DecodingError, match=name):
        PromptLookupDrafter(kw.pop("vocab_size"), **kw)


def test_a_lookup_drafter_serves_one_decoder(target):
    d = PromptLookupDrafter(CFG.vocab_size)
    SpeculativeDecoder(target, d, SEQUOIA_LIKE)
    with pytest.raises(DecodingError, match="already serves a decoder"):
        SpeculativeDecoder(target, d, SEQUOIA_LIKE)
    with pytest.raises(DecodingError, match="vocabulary"):
        SpeculativeDecoder(target, PromptLookupDrafter(128), SEQUOIA_LIKE)


# ---------------------------------------------------------------------------------------------- greedy decoding

REPEATING = [[5, 17, 3, 9, 5, 17, 3, 9, 5, 17], list(range(40, 52)) * 2, [1, 2, 1, 2, 1, 2, 1]]


@pytest.mark.parametrize("tree_name", ["sequoia", "chain", "wide", "star", "budget1"])
def test_greedy_equals_plain_decoding(target, tree_name):
    dec = SpeculativeDecoder(target, PromptLookupDrafter(CFG.vocab_size), TREES[tree_name], backend="torch")
    for prompt in PROMPTS + REPEATING:
        res = dec.generate(prompt, 20)  # one drafter across prompts: reset by each generation
        assert res.tokens == _plain(target, prompt), (tree_name, prompt)
        assert res.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("tree_name", ["sequoia", "chain12"])
def test_greedy_near_the_context_end_equals_plain_decoding(target, tree_name):
    ctx = 64
    tgt = _with_context(target, ctx)
    tree = Tree.chain(12) if tree_name == "chain12" else TREES[tree_name]
    dec = SpeculativeDecoder(tgt, PromptLookupDrafter(CFG.vocab_size, prompt_lookup_max=4), tree, backend="torch")
    # period 7: plenty of matches
    assert_near_the_end_equals_plain(dec, [[(3 * i) % 7 + 20 for i in range(P)] for P in (ctx - 14, ctx - 5, ctx - 1)])


def test_a_text_that_repeats_is_accepted_several_tokens_per_step(target):
    """The tiny target's greedy continuation settles into a loop; with that loop in the prompt, the lookup
    drafter's chain is the target's own continuation, so every step but the last accepts the whole chain."""
    prompt = [5, 17, 3]
    loop = autoregressive_generate(target, prompt, 40).tokens
    assert loop[-4:] == loop[-2:] * 2  # the fact this test rests on: a period-2 loop
    chain = Tree.chain(5)  # depth 4
    dec = SpeculativeDecoder(target, PromptLookupDrafter(CFG.vocab_size), chain, backend="torch")
    res = dec.generate(prompt + loop, 21)
    assert res.tokens == AutoregressiveDecoder(target).generate(prompt + loop, 21).tokens
    assert all(s.accepted_nodes == chain.tree_depth for s in res.steps[:-1])
    assert res.tokens_per_step > 3.5
    # and from the bare prompt, acceptance grows once the loop has been generated
    assert dec.generate(prompt, 60).tokens_per_step > 1.5


# ---------------------------------------------------------------------------------------------- sampling

TRIALS = 200_000


@pytest.mark.parametrize("cands", [[], [3], [3, 0], [5, 1, 3], [0, 7, 2, 6], [3, 3, 1], list(range(8))])
def test_point_mass_verification_is_exact(cands):
    """p has zeros (as outside a top-p nucleus): candidates 5, 6 and 7 have p(x) = 0; [3, 3, 1] repeats a
    candidate. TRIALS independent rows at once."""
    p = torch.tensor([0.25, 0.05, 0.2, 0.3, 0.2, 0.0, 0.0, 0.0])
    c = torch.tensor(cands, dtype=torch.int64).reshape(1, -1).expand(TRIALS, -1)
    acc, tok = verify_point_mass_batch(p.expand(TRIALS, -1), c, torch.Generator().manual_seed(1))
    tv = _tv(torch.bincount(tok, minlength=8), p)
    assert tv < 0.01, tv
    hit = acc >= 0
    assert torch.equal(tok[hit], c[hit].gather(1, acc[hit, None]).squeeze(1))
    for r, x in enumerate(cands):  # a distinct candidate is accepted exactly when emitted: rate p(x)
        if x not in cands[:r]:
            assert abs((acc == r).double().mean().item() - p[x].item()) < 0.01
        else:
            assert not (acc == r).any()  # a repeat has p(x) = 0 in the residual
    assert (p[tok] > 0).all() and (tok[~hit, None] != c[~hit]).all()  # a residual sample is never a candidate


def test_point_mass_node_and_degenerate_rows():
    p = torch.tensor([0.0, 1.0, 0.0])
    g = torch.Generator().manual_seed(0)
    assert verify_point_mass_node(p, torch.tensor([1, 0]), g) == (0, 1)  # p(x) = 1: always accepted
    assert verify_point_mass_node(p, torch.tensor([0, 2]), g) == (None, 1)  # p(x) = 0: never
    with pytest.raises(ValueError):
        verify_point_mass_node(torch.zeros(3), torch.tensor([1]), g)


@pytest.mark.parametrize("trials", [pytest.param(4_000, id="fast"),
                                    pytest.param(100_000, id="long", marks=pytest.mark.slow)])
def test_decoder_with_the_lookup_drafter_samples_the_target_distribution(trials):
    """End to end on a 6-token vocabulary with top-p: over many verifications of one drafted tree (drafting
    and the target forward are deterministic; only acceptance is random), the first emitted token follows
    p(. | prompt) and, after an accepted first node, the second follows p(. | prompt, x1). Measured TV:
    0.0031 / 0.0012 at 4k trials, 0.0027 / 0.0010 at 100k (the slow run, about 80 s on one CPU core); the
    fast run's tolerance leaves room for another random stream (its sampling noise is up to ~0.02)."""
    tgt = _micro_pair()[0]
    prompt, T, top_p = [2, 5, 1, 2, 5, 3, 2, 1, 4, 2], 1.0, 0.95
    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (6,)
        p2 = torch.stack([process_logits(tgt(torch.tensor([prompt + [a]]))[0, -1], T, top_p)
                          for a in range(6)])  # (6, 6) p(x2 = b | x1 = a)
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0]])
    dec = SpeculativeDecoder(tgt, PromptLookupDrafter(6), tree, temperature=T, top_p=top_p,
                             generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    drafted = draft_one(dec, state)
    assert drafted.tokens.tolist()[:4] == [2, 5, 1, 0]  # (2) was followed by 5 twice, by 1 once; filler 0
    assert torch.equal(draft_one(dec, state).tokens, drafted.tokens)
    logits = verify_one(dec, state, drafted)
    first, pairs = torch.zeros(6), torch.zeros(6, 6)
    for _ in range(trials):
        toks = dec.accept(drafted, logits).tokens
        first[toks[0]] += 1
        if len(toks) > 1:
            pairs[toks[0], toks[1]] += 1
    tv1 = _tv(first, p1)
    n2 = pairs.sum()
    assert n2 > trials / 4
    tv2 = 0.5 * (pairs - pairs.sum(1, keepdim=True) * p2).abs().sum().item() / n2.item()
    tol = 0.03 if trials < 10_000 else 0.01
    assert tv1 < tol and tv2 < tol, (tv1, tv2)


def test_sampling_generation_runs_and_is_reproducible(target):
    def run(seed):
        dec = SpeculativeDecoder(target, PromptLookupDrafter(CFG.vocab_size), SEQUOIA_LIKE, temperature=1.0,
                                 top_p=0.9, generator=torch.Generator().manual_seed(seed))
        return dec.generate(REPEATING[0], 25).tokens

    a = run(1)
    assert a == run(1) and len(a) == 25 and all(0 <= t < CFG.vocab_size for t in a)


def test_a_chain_grown_token_by_token_from_lookups_is_plain_decoding(target):
    """``--policy chain`` with prompt lookup (llama.cpp's n-gram chains): the drafter has no logits, so the chain
    takes its ranked top candidate and reads draft-p-min from its match confidence (it raised a TypeError)."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import ChainPolicy

    prompt = [5, 17, 3]
    loop = autoregressive_generate(target, prompt, 40).tokens
    dec = Decoder(target, ChainPolicy(PromptLookupDrafter(CFG.vocab_size), 4, name="lookup"), backend="torch")
    res = dec.generate(prompt + loop, 21)
    assert res.tokens == AutoregressiveDecoder(target).generate(prompt + loop, 21).tokens
    assert res.tokens_per_step > 3.5  # the loop is in the prompt: whole chains accepted
    strict = Decoder(target, ChainPolicy(PromptLookupDrafter(CFG.vocab_size), 4, p_min=1.0, name="lookup"),
                     backend="torch")
    assert strict.generate(prompt, 12).tokens == AutoregressiveDecoder(target).generate(prompt, 12).tokens
