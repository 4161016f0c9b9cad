"""Tree speculative decoding on tiny random float32 models: the golden tests (tree decoding == plain greedy
decoding), cache correctness after compaction, stop rules, sampling end-to-end, and input checks."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sequoia_opt.attention import causal_tree_mask
from sequoia_opt.decoding import AutoregressiveDecoder, TreeBuffers, autoregressive_generate
from sequoia_opt.drafting import SpeculativeDecoder
from sequoia_opt.errors import DecodingError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.tree import Tree
from tiny_pair import commit_one, draft_one, verify_one

CFG = ModelConfig.preset("tiny")  # vocab 256, dim 64, 2 layers, 4 heads / 2 KV heads, 512 positions

# ---------------------------------------------------------------------------------------------- fixtures


# single-threaded for the whole session: tests/conftest.py


def _model(seed: int, cfg: ModelConfig = CFG) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, device="cpu", dtype=torch.float32).eval()


def _perturbed(model: Transformer, noise: float, seed: int) -> Transformer:
    """A copy of ``model`` with Gaussian noise (``noise`` x each tensor's std): agrees with it partly, so
    verification sees both acceptances and rejections at various ranks."""
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.std())
    return out


@pytest.fixture(scope="module")
def target() -> Transformer:
    return _model(0)


@pytest.fixture(scope="module")
def drafts(target) -> dict[str, Transformer]:
    return {
        "same": target,  # draft == target: everything accepted
        "noisy": _perturbed(target, 0.3, seed=1),  # partial agreement: accepts at ranks 0, 1, 2
        "random": _model(7, CFG.with_(n_layers=1)),  # unrelated: almost everything rejected
    }


SEQUOIA_LIKE = Tree.from_choices([
    [0], [1], [2], [3],
    [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0],
    [0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 0, 0],
    [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0],
])  # 20 nodes, depth 6, the shape a Sequoia DP produces: wide near the root, a deep rank-0 spine

TREES = {
    "chain": Tree.chain(6),
    "star": Tree(parent=[-1] + [0] * 6, rank=[0, 0, 1, 2, 3, 4, 5]),
    "budget1": Tree.chain(1),
    "wide": Tree.from_choices([[i] for i in range(8)] + [[i, j] for i in range(8) for j in range(2)]),
    "sequoia": SEQUOIA_LIKE,
}

PROMPTS = [[1], [5, 17, 3], [200, 3, 3, 9, 41, 77], list(range(40, 52))]
NEW = 20

_AR_CACHE: dict[tuple[int, ...], list[int]] = {}


def _plain(target, prompt, n=NEW):
    key = (id(target), n, *prompt)
    if key not in _AR_CACHE:
        _AR_CACHE[key] = autoregressive_generate(target, prompt, n).tokens
    return _AR_CACHE[key]


def _count_forwards(*models):
    calls = []
    handles = [m.register_forward_pre_hook(lambda mod, args, kw: calls.append(1), with_kwargs=True)
               for m in models]
    return calls, handles


# ---------------------------------------------------------------------------------------------- golden tests


@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("draft_name", ["same", "noisy", "random"])
def test_greedy_tree_decoding_equals_plain_greedy(target, drafts, tree_name, draft_name):
    tree = TREES[tree_name]
    dec = SpeculativeDecoder(target, drafts[draft_name], tree, backend="torch")
    for prompt in PROMPTS:
        res = dec.generate(prompt, NEW)  # the decoder's caches are reused across prompts
        assert res.tokens == _plain(target, prompt), (tree_name, draft_name, prompt)
        assert sum(s.accepted_len for s in res.steps) == NEW
        assert res.stop_reason == "max_new_tokens"
        if draft_name == "same":
            # the draft proposes the target's argmax: every step but the last accepts a whole root-to-leaf
            # path of maximal depth along rank 0
            full = tree.tree_depth + 1
            assert all(s.accepted_len == full for s in res.steps[:-1])


def test_budget_one_tree_is_plain_decoding_step_for_step(target, drafts):
    dec = SpeculativeDecoder(target, drafts["noisy"], Tree.chain(1))
    ar = AutoregressiveDecoder(target)
    for prompt in PROMPTS:
        res, ref = dec.generate(prompt, NEW), ar.generate(prompt, NEW)
        assert res.tokens == ref.tokens
        assert [s.tokens for s in res.steps] == [s.tokens for s in ref.steps]
        assert all(s.accepted_nodes == 0 and s.accepted_len == 1 for s in res.steps)
    assert dec.policy.drafter.cache is None  # a root-only tree never runs the draft


@st.composite
def _random_trees(draw):
    n = draw(st.integers(1, 14))
    parent, rank, kids = [-1], [0], [0]
    for i in range(1, n):
        p = draw(st.integers(0, i - 1))
        parent.append(p)
        rank.append(kids[p])
        kids[p] += 1
        kids.append(0)
    return Tree.from_edges(parent, rank)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=_random_trees(), prompt_seed=st.integers(0, 10_000))
def test_greedy_equals_plain_on_random_trees(target, drafts, tree, prompt_seed):
    rng = np.random.default_rng(prompt_seed)
    prompt = rng.integers(0, CFG.vocab_size, size=int(rng.integers(1, 8))).tolist()
    res = SpeculativeDecoder(target, drafts["noisy"], tree).generate(prompt, 12)
    assert res.tokens == _plain(target, prompt, 12)


# ---------------------------------------------------------------------------------------------- logits and caches


def _plain_logits(model, tokens):
    """Last-position logits of a cache-free causal forward over ``tokens``."""
    with torch.inference_mode():
        return model(torch.tensor([tokens]))[0, -1]


def test_tree_logits_equal_path_recompute(target, drafts):
    tree = SEQUOIA_LIKE
    dec = SpeculativeDecoder(target, drafts["random"], tree)
    prompt = [3, 14, 15, 92, 65, 35, 89, 79]
    state = dec.start(prompt, 30)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, CFG.vocab_size, (tree.size,), generator=gen)
    tokens[0] = prompt[-1]
    with torch.inference_mode():
        logits = verify_one(dec, state, tokens)  # (n, V)
    tok = tokens.tolist()
    for i, path in enumerate(tree.paths):
        ref = _plain_logits(target, prompt[:-1] + [tok[j] for j in path])
        torch.testing.assert_close(logits[i], ref, atol=1e-4, rtol=1e-4, msg=f"node {i}")


def _fresh_cache(model, tokens, max_len):
    cache = model.new_cache(max_len)
    with torch.inference_mode():
        model(torch.tensor([tokens]), torch.arange(len(tokens)), cache=cache,
              cache_slots=torch.arange(len(tokens)), prefix_len=0, tree_mask=causal_tree_mask(len(tokens)))
    return cache


def _assert_cache_prefix_equal(cache, ref, upto):
    for layer, ref_layer in zip(cache.layers, ref.layers):
        torch.testing.assert_close(layer.k[:, :, :upto], ref_layer.k[:, :, :upto], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(layer.v[:, :, :upto], ref_layer.v[:, :, :upto], atol=1e-5, rtol=1e-5)


# A depth-4 tree where the path root -> [1] -> [1, 1] -> [1, 1, 0] -> [1, 1, 0, 1] goes through non-first
# siblings and skips over other nodes in breadth-first order.
PATH_TREE = Tree.from_choices([
    [0], [1], [2], [0, 0], [1, 0], [1, 1], [2, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1],
    [1, 1, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0],
])
PATH_CHOICES = [[1], [1, 1], [1, 1, 0], [1, 1, 0, 1]]


@pytest.mark.parametrize("accepted", [4, 3, 2, 1, 0])
def test_commit_of_scattered_path_matches_fresh_recompute(target, drafts, accepted):
    """Force tree tokens so that greedy verification accepts the first ``accepted`` nodes of PATH_CHOICES
    (rank 1 at depths 1, 2 and 4), then check both caches against a fresh prefill of the committed tokens,
    the next root's logits against a fresh recompute, and that decoding then continues exactly."""
    tree, draft = PATH_TREE, drafts["noisy"]
    choices = [[]] + tree.choices()
    node_of = {tuple(c): i for i, c in enumerate(choices)}
    path_nodes = [0] + [node_of[tuple(c)] for c in PATH_CHOICES]
    assert path_nodes != sorted(range(len(path_nodes)))  # scattered in BFS order
    prompt = [7, 7, 100, 21, 4]
    greedy = _plain(target, prompt, 24)
    gen = torch.Generator().manual_seed(accepted)
    tokens = torch.randint(0, CFG.vocab_size, (tree.size,), generator=gen)
    bad = set(greedy[:6])
    for i in range(tree.size):  # filler tokens never equal the greedy continuation
        while int(tokens[i]) in bad:
            tokens[i] = (int(tokens[i]) + 1) % CFG.vocab_size
    tokens[0] = prompt[-1]
    for d, node in enumerate(path_nodes[1 : accepted + 1]):
        tokens[node] = greedy[d]

    dec = SpeculativeDecoder(target, draft, tree, max_len=64)
    state = dec.start(prompt, 24)
    L0 = state.cached
    with torch.inference_mode():
        drafted = draft_one(dec, state, tokens)
        acc = dec.accept(drafted, verify_one(dec, state, drafted))
    assert acc.path == tuple(path_nodes[: accepted + 1])
    assert list(acc.tokens) == greedy[: accepted + 1]
    emitted = commit_one(dec, state, drafted, acc)
    assert emitted == greedy[: accepted + 1]
    assert state.cached == L0 + accepted + 1 and len(state.seq) == state.cached + 1
    # the draft never processed the last level (depth 4): one fewer node when the path reaches it
    draft_cached = dec.policy.drafter.cached
    assert draft_cached == L0 + accepted + 1 - (accepted == tree.tree_depth)

    committed = state.seq[: state.cached]
    _assert_cache_prefix_equal(dec.target_cache, _fresh_cache(target, committed, 64), state.cached)
    _assert_cache_prefix_equal(dec.policy.drafter.cache, _fresh_cache(draft, state.seq[:draft_cached], 64),
                               draft_cached)
    # next step: the new root's logits from the compacted cache equal a fresh recompute
    with torch.inference_mode():
        nxt = verify_one(dec, state, draft_one(dec, state))
    torch.testing.assert_close(nxt[0], _plain_logits(target, state.seq), atol=1e-4, rtol=1e-4)
    # and decoding from this state continues exactly like plain decoding
    state.result.steps.clear()
    while not state.finished:
        dec.step(state)
    assert state.result.tokens == greedy


def test_step_statistics(target, drafts):
    tree = SEQUOIA_LIKE
    res = SpeculativeDecoder(target, drafts["noisy"], tree).generate(PROMPTS[2], 30)
    assert res.num_steps == len(res.steps) > 0
    assert sum(s.accepted_len for s in res.steps) == len(res.tokens) == 30
    assert res.tokens_per_step == pytest.approx(30 / res.num_steps)
    seen_ranks = set()
    for s in res.steps[:-1]:
        assert s.accepted_len == s.accepted_nodes + 1
        assert len(s.accepted_ranks) == s.accepted_nodes
        # one trial per visited node with children; all but possibly the last accepted a child
        accepted = [v.accepted_rank for v in s.visits if v.accepted_rank is not None]
        assert tuple(accepted) == s.accepted_ranks
        assert [v.depth for v in s.visits] == list(range(len(s.visits)))
        assert all(v.num_children >= 1 for v in s.visits)
        seen_ranks.update(s.accepted_ranks)
        assert s.draft_ms >= 0 and s.verify_ms > 0 and s.bookkeeping_ms >= 0
    assert seen_ranks & {1, 2, 3}, "the noisy draft should have a non-first sibling accepted somewhere"
    assert res.decode_ms > 0 and res.tokens_per_second > 0


# ---------------------------------------------------------------------------------------------- stop rules


def test_eos_inside_accepted_path(target, drafts):
    prompt = PROMPTS[1]
    ref = _plain(target, prompt, NEW)
    j = next(j for j in range(2, 8) if ref[j] not in ref[:j])  # first occurrence, inside the first step
    eos = ref[j]
    dec = SpeculativeDecoder(target, drafts["same"], Tree.chain(8), eos_ids=[eos])
    res = dec.generate(prompt, NEW)
    assert res.tokens == ref[: j + 1] and res.stop_reason == "eos"
    assert res.steps[-1].accepted_nodes > res.steps[-1].accepted_len - 1  # the path went past the EOS
    ar = autoregressive_generate(target, prompt, NEW, eos_ids=[eos])
    assert ar.tokens == res.tokens and ar.stop_reason == "eos"


def test_eos_as_bonus_token(target, drafts):
    prompt = PROMPTS[2]
    ref = _plain(target, prompt, NEW)
    res = SpeculativeDecoder(target, drafts["random"], Tree.chain(3), eos_ids=ref[0]).generate(prompt, NEW)
    assert res.tokens == ref[:1] and res.stop_reason == "eos"


def test_max_new_tokens_cut_like_plain_decoding(target, drafts):
    prompt = PROMPTS[2]
    ref = _plain(target, prompt, 10)
    dec = SpeculativeDecoder(target, drafts["same"], SEQUOIA_LIKE)
    for m in range(1, 11):
        res = dec.generate(prompt, m)
        assert res.tokens == ref[:m], m
        assert res.stop_reason == "max_new_tokens"
    empty = dec.generate(prompt, 0)
    assert empty.tokens == [] and empty.steps == [] and empty.stop_reason == "empty"


def test_draft_stops_at_the_tokens_a_row_can_still_emit(target, drafts):
    """A row with r tokens left drafts no deeper than r - 1 (llama-server's n_remaining - 1): with a draft that is
    always accepted, a chain of 8 and m new tokens takes ceil(m / 9) steps, the last one as deep as it can use,
    with one draft forward per level drafted; the tokens are plain decoding's."""
    prompt = PROMPTS[2]
    ref = _plain(target, prompt, 20)
    draft = copy.deepcopy(target)  # the target's weights in a module of its own: its forwards are counted alone
    dec = SpeculativeDecoder(target, draft, Tree.chain(9), max_len=128)  # room for every step's whole tree
    for m in (1, 2, 5, 9, 10, 13, 20):
        calls, handles = _count_forwards(draft)
        try:
            res = dec.generate(prompt, m)
        finally:
            for h in handles:
                h.remove()
        assert res.tokens == ref[:m], m
        left, depths = m, []
        for s in res.steps:
            depths.append(s.tree_depth)
            left -= s.accepted_len
        assert depths == [min(8, r - 1) for r in range(m, 0, -9)], m  # r: the tokens left before each step
        assert left == 0 and [s.accepted_len for s in res.steps] == [min(9, r) for r in range(m, 0, -9)]
        # the draft: its prefill, then one forward per level of each speculative step (the catch-up rides on the
        # first level's); a step of depth 0 (one token left) runs none
        assert len(calls) == 1 + sum(depths), m


def test_a_row_near_its_end_does_not_make_the_batch_draft_shallower(target, drafts):
    """The depth cap is the largest over the rows: a row that joins with 3 tokens to go is clipped by the stop
    rule, not the other row's drafts; both rows' tokens are plain decoding's."""
    long_p, short_p = PROMPTS[2], PROMPTS[3]
    dec = SpeculativeDecoder(target, drafts["same"], Tree.chain(9), max_batch=2, max_len=128)
    state = dec.start(long_p, 20)
    dec.step(state)  # everything accepted: 9 tokens, 11 to go
    dec.join(state, [short_p], 3)
    step = dec.step(state)
    assert step.tree_depth == 8 and step.emitted == (9, 3)
    while not state.finished:
        dec.step(state)
    assert [r.tokens for r in state.results] == [_plain(target, long_p, 20), _plain(target, short_p, 3)]


# ---------------------------------------------------------------------------------------------- sampling


def test_sampling_runs_reproducible_and_seed_dependent(target, drafts):
    tree = SEQUOIA_LIKE
    prompt = PROMPTS[1]

    def run(seed, draft="same", top_p=1.0):
        g = torch.Generator().manual_seed(seed)
        dec = SpeculativeDecoder(target, drafts[draft], tree, temperature=1.0, top_p=top_p, generator=g)
        return dec.generate(prompt, 25)

    a, b, c = run(1), run(1), run(2)
    assert len(a.tokens) == 25 and a.stop_reason == "max_new_tokens"
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    assert a.tokens_per_step > 2  # draft == target: the first candidate is (almost) always accepted
    for draft, top_p in (("noisy", 0.9), ("random", 0.8)):
        r = run(3, draft, top_p)
        assert len(r.tokens) == 25 and all(0 <= t < CFG.vocab_size for t in r.tokens)
    # fresh randomness each generation from the same decoder
    g = torch.Generator().manual_seed(5)
    dec = SpeculativeDecoder(target, drafts["noisy"], tree, temperature=1.0, generator=g)
    assert dec.generate(prompt, 15).tokens != dec.generate(prompt, 15).tokens


def test_sampling_baseline_reproducible(target):
    def run(seed):
        return autoregressive_generate(target, PROMPTS[0], 15, temperature=0.8, top_p=0.9,
                                       generator=torch.Generator().manual_seed(seed)).tokens

    assert run(0) == run(0) != run(1)


@pytest.fixture(scope="module")
def tiny_pair():
    """The tiny pair of tests/tiny_pair.py (the CLI's end-to-end pair): target and a noisy copy as draft."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import noisy_copy, random_model

    tgt = random_model(0)
    return tgt, noisy_copy(tgt, 0.05, 1)


@pytest.mark.parametrize("T", [1e-40, 1e-300])
def test_tiny_temperature_samples_exactly_the_greedy_output(tiny_pair, T):
    """logits / T overflowed to NaN and every token became the last vocabulary id (256 here)."""
    tgt, drf = tiny_pair
    prompt = [72, 101, 108, 108, 111, 44, 32]
    greedy = autoregressive_generate(tgt, prompt, 24).tokens
    assert len(set(greedy)) > 3  # a real continuation, not one repeated id
    plain = autoregressive_generate(tgt, prompt, 24, temperature=T, generator=torch.Generator().manual_seed(1))
    assert plain.tokens == greedy
    for tree in (SEQUOIA_LIKE, Tree.chain(4)):
        dec = SpeculativeDecoder(tgt, drf, tree, temperature=T, top_p=0.9, generator=torch.Generator().manual_seed(2))
        assert dec.generate(prompt, 24).tokens == greedy


def _with_nan_logit(model: Transformer, token: int) -> Transformer:
    """A copy whose logit for ``token`` is NaN at every position (as after a numerical overflow)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.lm_head.weight[token] = float("nan")
    return out


@pytest.mark.parametrize("T", [0.0, 1e-40, 1.0])
def test_nan_logits_never_become_a_token(target, drafts, T):
    bad = _with_nan_logit(target, 17)
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(DecodingError, match="the target model 'tiny' produced unusable output: the logits hold NaN"):
        AutoregressiveDecoder(bad, temperature=T, generator=gen).generate(PROMPTS[1], 5)
    with pytest.raises(DecodingError, match="the target model 'tiny' produced unusable output: the logits hold NaN"):
        SpeculativeDecoder(bad, drafts["noisy"], SEQUOIA_LIKE, temperature=T, generator=gen).generate(PROMPTS[1], 5)
    bad_draft = _with_nan_logit(drafts["noisy"], 17)
    dec = SpeculativeDecoder(target, bad_draft, SEQUOIA_LIKE, temperature=T, generator=gen)
    if T == 0:  # greedy: a NaN draft only proposes bad candidates, which the target's check rejects
        assert dec.generate(PROMPTS[1], 8).tokens == _plain(target, PROMPTS[1], 8)
    else:
        with pytest.raises(DecodingError, match="the draft model 'tiny' produced unusable output"):
            dec.generate(PROMPTS[1], 5)


def _micro_pair():
    cfg = ModelConfig(vocab_size=6, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=32,
                      max_position_embeddings=16, name="micro")
    tgt, drf = _model(3, cfg), _model(4, cfg)
    with torch.no_grad():  # sharpen the micro models a little so top-p removes something
        tgt.lm_head.weight.mul_(4)
        drf.lm_head.weight.mul_(4)
    return tgt, drf


@pytest.mark.parametrize("trials", [pytest.param(600, id="fast"),
                                    pytest.param(40_000, id="long", marks=pytest.mark.slow)])
def test_speculative_sampling_step_matches_target_distribution(trials):
    """End to end on a 6-token vocabulary with a different draft and top-p: over many independent steps
    from the same state, the first emitted token follows the target's sampling law p(. | prompt), and,
    when a first node was accepted, the second follows p(. | prompt, x1) (all computed exactly)."""
    tgt, drf = _micro_pair()
    prompt, T, top_p = [2, 5], 1.0, 0.95
    from sequoia_opt.decoding import process_logits

    with torch.inference_mode():
        p1 = process_logits(tgt(torch.tensor([prompt]))[0, -1], T, top_p)  # (6,)
        p2 = torch.stack([process_logits(tgt(torch.tensor([prompt + [a]]))[0, -1], T, top_p)
                          for a in range(6)])  # (6, 6) p(x2 = b | x1 = a)
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1]])
    dec = SpeculativeDecoder(tgt, drf, tree, temperature=T, top_p=top_p,
                             generator=torch.Generator().manual_seed(0))
    state = dec.start(prompt, 4)
    first, pairs = torch.zeros(6), torch.zeros(6, 6)
    with torch.inference_mode():
        for _ in range(trials):  # draft / verify / accept do not change the state: independent steps
            drafted = draft_one(dec, state)
            toks = dec.accept(drafted, verify_one(dec, state, drafted)).tokens
            first[toks[0]] += 1
            if len(toks) > 1:
                pairs[toks[0], toks[1]] += 1
    # sampling noise alone is ~0.04 at 600 trials (enough to catch wiring errors: TV(p1, q1) here is ~0.7)
    # and ~0.006 at 40k trials (the slow run; several minutes on a loaded 2-core CPU)
    # (the first token, over every trial: TV < 0.01 at 40k trials, as for every drafter; the second, over the
    # steps that accepted a first node, has fewer samples and keeps 0.015)
    tol1, tol2 = (0.1, 0.1) if trials < 10_000 else (0.01, 0.015)
    tv1 = 0.5 * (first / trials - p1).abs().sum().item()
    n2 = pairs.sum()
    assert n2 > trials / 4  # plenty of accepted first nodes
    tv2 = 0.5 * (pairs - pairs.sum(1, keepdim=True) * p2).abs().sum().item() / n2.item()
    assert tv1 < tol1 and tv2 < tol2, (tv1, tv2)


# ---------------------------------------------------------------------------------------------- near the end


def _with_context(model: Transformer, positions: int) -> Transformer:
    """The same weights under a config with ``positions`` max_position_embeddings."""
    out = Transformer(model.config.with_(max_position_embeddings=positions), device="cpu", dtype=torch.float32)
    out.load_state_dict(model.state_dict())
    return out.eval()


def _record_positions(model):
    """Every position a cached forward of ``model`` is given (positions is the forward's second argument)."""
    seen: list[int] = []
    handle = model.register_forward_pre_hook(lambda mod, args, kw: seen.extend(args[1].flatten().tolist()), with_kwargs=True)
    return seen, handle


@pytest.fixture(scope="module")
def ctx64(target, drafts):
    return _with_context(target, 64), _with_context(drafts["noisy"], 64)


def test_last_position_of_the_context_is_served_like_plain_decoding(ctx64):
    tgt, drf = ctx64
    prompt = [(7 * i + 3) % CFG.vocab_size for i in range(63)]
    plain = AutoregressiveDecoder(tgt).generate(prompt, 1).tokens
    assert len(plain) == 1
    dec = SpeculativeDecoder(tgt, drf, Tree.chain(3))
    res = dec.generate(prompt, 1)
    assert res.tokens == plain
    # the root (last prompt token) sits at position 62: of the chain only depth 1 (position 63) would fit, and with
    # one token to go not even that is drafted (a row with r tokens left drafts r - 1 levels at most)
    assert [(s.tree_size, s.tree_depth) for s in res.steps] == [(1, 0)]
    # the positions alone: two tokens asked of a context that holds one more are refused, as plain decoding does
    with pytest.raises(DecodingError):
        dec.generate(prompt, 2)
    with pytest.raises(DecodingError):
        AutoregressiveDecoder(tgt).generate(prompt, 2)


@pytest.mark.parametrize("tree_name", ["sequoia", "wide", "chain12"])
def test_prompts_near_the_context_end_equal_plain_decoding(ctx64, tree_name):
    tgt, drf = ctx64
    tree = Tree.chain(12) if tree_name == "chain12" else TREES[tree_name]  # chain12: deeper than what is left
    ctx = 64
    dec = SpeculativeDecoder(tgt, drf, tree, backend="torch")
    rng = np.random.default_rng(0)
    clipped_steps = 0
    for P in range(ctx - 6, ctx):
        prompt = rng.integers(0, CFG.vocab_size, size=P).tolist()
        ref = autoregressive_generate(tgt, prompt, ctx - P).tokens
        for M in range(1, ctx - P + 1):
            res = dec.generate(prompt, M)
            assert res.tokens == ref[:M], (P, M)
            L = P - 1
            for s in res.steps:
                # the step's tree stays inside the context: deepest node at position L + depth < 64
                assert L + s.tree_depth < ctx
                assert s.tree_depth <= tree.tree_depth and s.tree_size == tree.level_slices[s.tree_depth].stop
                clipped_steps += s.tree_depth < tree.tree_depth
                L += s.accepted_nodes + 1
    assert clipped_steps > 0


@pytest.fixture(scope="module")
def short_draft_pair(target, drafts):
    """Target with 64 positions, drafts with 40: the same weights (accepts everything) and a noisy copy."""
    return _with_context(target, 64), {"same": _with_context(target, 40), "noisy": _with_context(drafts["noisy"], 40)}


@pytest.mark.parametrize("draft_name", ["same", "noisy"])
@pytest.mark.parametrize("tree_name", ["sequoia", "chain"])
def test_draft_with_a_shorter_context_equals_plain_and_stays_inside_it(short_draft_pair, draft_name, tree_name):
    tgt, drafts40 = short_draft_pair
    drf = drafts40[draft_name]
    prompt = [(11 * i + 5) % CFG.vocab_size for i in range(35)]
    ref = autoregressive_generate(tgt, prompt, 25).tokens
    dec = SpeculativeDecoder(tgt, drf, TREES[tree_name])
    seen, handle = _record_positions(drf)
    try:
        state = dec.start(prompt, 25)
        while not state.finished:
            before = dec.policy.drafter.cached
            stats = dec.step(state)
            if stats.tree_depth == 0:  # root-only step: no draft forward, nothing new in the draft cache
                assert state.finished or dec.policy.drafter.cached == before
    finally:
        handle.remove()
    assert state.result.tokens == ref
    assert seen and max(seen) < 40  # the draft ran, and never past its 40 positions
    depths = [s.tree_depth for s in state.result.steps]
    assert depths[-1] == 0 and depths[0] == TREES[tree_name].tree_depth  # full at first, root-only at the end
    # the draft cache holds exactly the committed tokens it claims to
    n = dec.policy.drafter.cached
    assert 0 < n <= 40  # positions 0 .. 39
    seq = prompt + state.result.tokens
    _assert_cache_prefix_equal(dec.policy.drafter.cache, _fresh_cache(drf, seq[:n], n), n)


def test_prompt_past_the_draft_context_never_runs_the_draft(short_draft_pair):
    tgt, drafts40 = short_draft_pair
    drf = drafts40["noisy"]
    prompt = [(3 * i + 1) % CFG.vocab_size for i in range(45)]
    dec = SpeculativeDecoder(tgt, drf, SEQUOIA_LIKE)
    calls, handles = _count_forwards(drf)
    try:
        res = dec.generate(prompt, 10)
    finally:
        for h in handles:
            h.remove()
    assert res.tokens == autoregressive_generate(tgt, prompt, 10).tokens
    assert calls == [] and all(s.tree_size == 1 and s.draft_ms >= 0 for s in res.steps)
    assert len(res.steps) == 10


@pytest.mark.parametrize("max_len", [30, 24, 10, 3])
def test_cache_that_cannot_hold_the_tree_at_the_end_clips_it(target, drafts, max_len):
    prompt = [9, 8, 7]
    M = max_len - len(prompt) + 1  # the most plain decoding with this max_len serves
    ref = AutoregressiveDecoder(target, max_len=max_len).generate(prompt, M).tokens
    dec = SpeculativeDecoder(target, drafts["same"], SEQUOIA_LIKE, max_len=max_len)  # 20 nodes
    res = dec.generate(prompt, M)
    assert res.tokens == ref and len(ref) == M
    L = len(prompt) - 1
    for s in res.steps:
        assert L + s.tree_size <= max_len  # the step's slots L .. L + n_d - 1 fit
        L += s.accepted_nodes + 1
    assert res.steps[-1].tree_size < SEQUOIA_LIKE.size
    with pytest.raises(DecodingError, match=f"KV cache has {max_len} slots"):
        dec.generate(prompt, M + 1)


@pytest.mark.parametrize("max_len", [1, 2, 7, 16, 40, None])
def test_refuses_exactly_what_plain_decoding_refuses(max_len):
    tgt = _model(0, CFG.with_(max_position_embeddings=16))
    drf = _model(1, CFG.with_(max_position_embeddings=9, n_layers=1))
    plain = AutoregressiveDecoder(tgt, max_len=max_len)
    trees = [Tree.chain(1), Tree.chain(20), SEQUOIA_LIKE]
    decs = [SpeculativeDecoder(tgt, drf, t, max_len=max_len if max_len is not None else 16 + t.size)
            for t in trees]

    def refused(d, P, M):
        try:
            d.check(list(range(P)), M)
        except DecodingError as err:
            return "context" if "exceed the model context" in str(err) else "cache" if "KV cache" in str(err) else err
        return None

    for P in range(1, 19):
        for M in range(19):
            want = refused(plain, P, M)
            assert (want is None) == (M == 0 or (P + M <= 16 and P + M - 1 <= (max_len or 16))), (P, M)
            for d in decs:
                assert refused(d, P, M) == want, (P, M, d.tree.size)


@pytest.mark.parametrize("draft_ctx", [64, 40])
def test_sampling_near_the_context_end_runs(short_draft_pair, ctx64, draft_ctx):
    tgt = short_draft_pair[0]
    drf = short_draft_pair[1]["noisy"] if draft_ctx == 40 else ctx64[1]
    for P, M in ((60, 4), (63, 1), (50, 14)):
        prompt = [(5 * i + 2) % CFG.vocab_size for i in range(P)]
        dec = SpeculativeDecoder(tgt, drf, SEQUOIA_LIKE, temperature=1.0, top_p=0.9,
                                 generator=torch.Generator().manual_seed(P))
        res = dec.generate(prompt, M)
        assert len(res.tokens) == M and all(0 <= t < CFG.vocab_size for t in res.tokens)
        assert res.steps[-1].tree_depth < SEQUOIA_LIKE.tree_depth


def test_clipped_buffers_are_a_prefix_and_memoised(ctx64):
    tgt, drf = ctx64
    dec = SpeculativeDecoder(tgt, drf, SEQUOIA_LIKE)
    full = dec.policy.buffers
    for d in range(SEQUOIA_LIKE.tree_depth + 1):
        b = full.clipped(d)
        n = SEQUOIA_LIKE.level_slices[d].stop
        assert b.n == n and b.tree_depth == d
        assert torch.equal(b.tree_mask.dense, full.tree_mask.dense[:n, :n])
        assert b.children == tuple(tuple(c for c in ch if c < n) for ch in full.children[:n])
    assert full.clipped(SEQUOIA_LIKE.tree_depth) is full
    with pytest.raises(ValueError, match="depth 7"):
        full.clipped(7)
    kept = dict(full.cuts)  # every cut the loop above asked for, kept with the buffers
    assert set(kept) == set(range(SEQUOIA_LIKE.tree_depth))
    assert all(full.clipped(d) is b for d, b in kept.items())
    prompt = list(range(60))
    for _ in range(2):  # steps near the context's end cut the tree: the policy reads the same cuts
        dec.generate(prompt, 4)
        assert all(dec.policy.buffers_at(d) is b for d, b in kept.items())
        assert dec.policy.buffers_at(SEQUOIA_LIKE.tree_depth) is full
        assert full.cuts == kept and all(full.cuts[d] is b for d, b in kept.items())  # compiled once per depth


# ---------------------------------------------------------------------------------------------- bad input


def test_refuses_different_vocabularies(target):
    other = _model(1, CFG.with_(vocab_size=128))
    with pytest.raises(DecodingError, match="vocabulary"):
        SpeculativeDecoder(target, other, Tree.chain(3))


def test_refuses_tree_wider_than_vocabulary():
    cfg = CFG.with_(vocab_size=8)
    m = _model(0, cfg)
    with pytest.raises(DecodingError, match="9 children"):
        SpeculativeDecoder(m, m, Tree(parent=[-1] + [0] * 9, rank=[0] + list(range(9))))
    SpeculativeDecoder(m, m, Tree(parent=[-1] + [0] * 8, rank=[0] + list(range(8))))  # exactly V is fine


def test_refuses_overflow_before_any_forward(target, drafts):
    from sequoia_opt.decoding import Decoder, TransformerTarget

    small = _model(0, CFG.with_(max_position_embeddings=32))
    draft = drafts["random"]
    dec = SpeculativeDecoder(small, small, Tree.chain(11))  # depth 10
    tight = SpeculativeDecoder(target, draft, SEQUOIA_LIKE, max_len=40)
    calls, handles = _count_forwards(small, draft, target)
    try:
        with pytest.raises(DecodingError, match="exceed the model context"):
            dec.generate(list(range(30)), 5)  # the sequence itself does not fit
        with pytest.raises(DecodingError, match="exceed the model context"):
            autoregressive_generate(small, list(range(30)), 5)
        with pytest.raises(DecodingError, match="empty"):
            dec.generate([], 5)
        with pytest.raises(DecodingError, match="outside the vocabulary"):
            dec.generate([1, CFG.vocab_size], 5)
        with pytest.raises(DecodingError, match="max_new_tokens"):
            dec.generate([1], -1)
        # 30 + 15 - 1 = 44 slots: plain decoding with the same max_len refuses it too
        with pytest.raises(DecodingError, match="KV cache has 40 slots"):
            tight.generate(list(range(30)), 15)
        with pytest.raises(DecodingError, match="KV cache has 40 slots"):
            AutoregressiveDecoder(target, max_len=40).generate(list(range(30)), 15)
        assert calls == []
    finally:
        for h in handles:
            h.remove()
    # what plain decoding serves is served, with its output: nodes past the context or the cache are
    # clipped (these four were refused before: "too deep", "KV cache has 40 slots", max_len=10, chain(40))
    assert dec.generate(list(range(20)), 5).tokens == _plain(small, list(range(20)), 5)  # nodes reach 33
    assert dec.generate(list(range(20)), 3).tokens == _plain(small, list(range(20)), 3)
    assert tight.generate(list(range(10)), 15).tokens == _plain(target, list(range(10)), 15)  # 43 slots
    short = SpeculativeDecoder(target, draft, SEQUOIA_LIKE, max_len=10)  # smaller than the 20-node tree
    assert short.generate(list(range(4)), 6).tokens == _plain(target, list(range(4)), 6)
    deep = SpeculativeDecoder(small, small, Tree.chain(40))  # deeper than the context, whatever the prompt
    assert deep.generate(list(range(5)), 27).tokens == _plain(small, list(range(5)), 27)
    with pytest.raises(DecodingError, match="max_len must be >= 1"):
        SpeculativeDecoder(target, draft, SEQUOIA_LIKE, max_len=0)
    for bad in (16.5, True, "32", None, float("inf")):  # 16.5 was 16 slots and True one, silently; inf overflowed
        with pytest.raises(DecodingError, match=r"max_len must be an integer >= 1 \(cache slots per row\), got "):
            TransformerTarget(target, max_len=bad)
    with pytest.raises(DecodingError, match="max_len must be an integer"):
        SpeculativeDecoder(target, draft, SEQUOIA_LIKE, max_len=16.5)
    assert Decoder(target, max_len=np.int64(16)).max_len == 16
    with pytest.raises(DecodingError, match="temperature"):
        SpeculativeDecoder(target, draft, SEQUOIA_LIKE, temperature=-1.0)
    with pytest.raises(DecodingError, match="top_p"):
        SpeculativeDecoder(target, draft, SEQUOIA_LIKE, temperature=1.0, top_p=0.0)


def test_overflow_messages_name_the_limit_and_only_existing_remedies(target, drafts):
    small = _model(0, CFG.with_(max_position_embeddings=32, name="small32"))
    long_draft = _model(1, CFG.with_(max_position_embeddings=512, name="draft512", n_layers=1))
    dec = SpeculativeDecoder(small, long_draft, Tree.chain(4))
    why = r"has a context of 32 tokens \(max_position_embeddings, or the sliding attention window where smaller\); "
    with pytest.raises(DecodingError, match=r"= 35 tokens exceed the model context: the target model 'small32' "
                                            + why + r"shorten the prompt to at most 27 tokens or ask for at most 2 new "
                                            r"tokens$") as err:
        dec.check(list(range(30)), 5)
    assert "max_len" not in str(err.value)  # max_len was not the limit: not suggested
    with pytest.raises(DecodingError, match=r"= 41 tokens exceed the model context: the target model 'small32' "
                                            + why + r"shorten the prompt to at most 31 tokens$"):
        dec.check(list(range(40)), 1)  # the prompt alone does not fit: no number of new tokens would
    with pytest.raises(DecodingError, match=r"shorten the prompt to at most 24 tokens$"):
        dec.check(list(range(32)), 8)  # 31 prompt tokens would still overflow with 8 new ones
    with pytest.raises(DecodingError, match=r"shorten the prompt and ask for fewer than 32 new tokens$"):
        dec.check(list(range(33)), 40)
    with pytest.raises(DecodingError, match=r"the target model 'small32' has a context of 32 tokens") as err:
        AutoregressiveDecoder(small).check(list(range(30)), 5)
    assert "max_len" not in str(err.value)
    # a shorter draft context limits nothing (its trees are clipped): the target's 512 positions count
    short_draft = _model(1, CFG.with_(max_position_embeddings=16, n_layers=1))
    SpeculativeDecoder(target, short_draft, Tree.chain(4)).check(list(range(30)), 5)
    tight = SpeculativeDecoder(target, drafts["random"], SEQUOIA_LIKE, max_len=40)
    cache_msg = (r"^the KV cache has 40 slots \(max_len=40\) but this generation needs 44 \(prompt 30 \+ "
                 r"max_new_tokens 15 - 1: every token but the last is cached\); pass max_len=44 or more, or ask "
                 r"for at most 11 new tokens$")
    with pytest.raises(DecodingError, match=cache_msg):
        tight.check(list(range(30)), 15)
    with pytest.raises(DecodingError, match=cache_msg):
        AutoregressiveDecoder(target, max_len=40).check(list(range(30)), 15)
    assert tight.generate(list(range(30)), 11).tokens == _plain(target, list(range(30)), 11)  # "at most 11"


def test_tree_buffers_layout():
    tree = SEQUOIA_LIKE
    buf = TreeBuffers.build(tree, "cpu")
    assert buf.n == tree.size and buf.tree_depth == tree.tree_depth
    assert torch.equal(buf.tree_mask.dense, torch.from_numpy(tree.ancestor_mask))
    assert buf.num_drafted == tree.size - tree.level_widths[-1]
    for d, sl in enumerate(buf.level_slices):
        assert buf.level_masks[d].dense.shape == (sl.stop - sl.start, sl.stop)
        assert torch.equal(buf.level_masks[d].dense, torch.from_numpy(tree.ancestor_mask[sl, : sl.stop]))
        if d:
            prev = buf.level_slices[d - 1]
            parents = buf.child_parent_local[d] + prev.start
            assert parents.tolist() == list(tree.parent[sl])
            assert buf.child_rank[d].tolist() == list(tree.rank[sl])
            assert buf.level_branching[d - 1] == max(len(tree.children[i]) for i in range(prev.start, prev.stop))
    assert buf.level_branching[-1] == 0


def test_a_policy_that_lists_no_drafters_is_refused(target):
    """A policy that kept its drafter in an attribute of its own but left ``drafters`` empty was accepted: no
    drafter was bound or prefilled, and the first draft failed deep inside it (an extension tryout)."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.decoding.policy import DraftingPolicy

    class Forgetful(DraftingPolicy):
        def draft(self, state, rooms):
            raise AssertionError("never reached")

        def commit(self, state, trees, paths):
            pass

    with pytest.raises(DecodingError, match="the Forgetful lists no drafters: set its drafters"):
        Decoder(target, Forgetful())


def test_the_decoders_arguments_are_checked_at_its_boundary(target):
    """A library tryout: an int seed as the generator failed inside the first sampled step (greedy never noticed),
    a tokenizer's np.int64 eos id raised a TypeError, an unknown backend a ValueError from the attention code."""
    import numpy as np

    from sequoia_opt.decoding import Decoder

    with pytest.raises(DecodingError, match="generator must be a torch.Generator .* got int"):
        Decoder(target, temperature=1.0, generator=123)
    dec = Decoder(target)
    with pytest.raises(DecodingError, match="generator must be a torch.Generator"):
        dec.generator = 7
    cpu = torch.Generator().manual_seed(1)  # any device's generator: sampling draws on it and moves the numbers
    assert Decoder(target, temperature=1.0, generator=cpu).generator is cpu
    for eos, want in ((np.int64(3), {3}), (torch.tensor(3), {3}), (torch.tensor([3, 5]), {3, 5}), ([np.int32(2)], {2}),
                      ((), set())):
        assert Decoder(target, eos_ids=eos).eos_ids == frozenset(want)
    for bad in (None, 1.5, "ab", "", b"ab", [-1], [True]):
        with pytest.raises(DecodingError, match="eos_ids must be"):
            Decoder(target, eos_ids=bad)
    with pytest.raises(DecodingError, match="backend"):
        Decoder(target, backend="nope")
    # an id the target cannot emit never stopped a row: every one ran to max_new_tokens, silently
    for bad in (256, [3, 256], 10**9):
        with pytest.raises(DecodingError, match=r"eos_ids \[(256|1000000000)\] are outside the target model "
                                                r".*vocabulary \[0, 256\)"):
            Decoder(target, eos_ids=bad)
    assert Decoder(target, eos_ids=255).eos_ids == {255}
    # a string, None or a bool failed inside the range checks with a TypeError (True decoded at temperature 1)
    for name, bad in (("temperature", "0.7"), ("temperature", None), ("temperature", True), ("top_p", "a"),
                      ("top_p", None), ("top_p", [0.9]), ("temperature", 10**400), ("top_p", -10**400)):
        # (an int past float64 raised an OverflowError from float())
        with pytest.raises(DecodingError, match=f"{name} must be a number, got "):
            Decoder(target, **{name: bad})
    assert Decoder(target, temperature=np.float32(0.5), top_p=torch.tensor(0.9)).top_p == pytest.approx(0.9)
    for bad in (None, [3], "x", float("inf")):  # inf: an OverflowError from int()
        with pytest.raises(DecodingError, match="max_new_tokens must be an integer >= 0"):
            dec.generate([1, 2], bad)
    # an eos id that is a numpy int stops the row as an int one does
    prompt = [5, 17, 3]
    plain = autoregressive_generate(target, prompt, 8).tokens
    stop = Decoder(target, eos_ids=np.int64(plain[2])).generate(prompt, 8)
    assert stop.tokens == plain[:3] and stop.stop_reason == "eos"
