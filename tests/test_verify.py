"""The pure decoding rules on explicit distributions: logit processing, samplers, the greedy tree walk,
and the exactness of multi-candidate speculative sampling (Sequoia Algorithm 2)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from sequoia_opt.decoding import GREEDY_LIMIT_TEMPERATURE, argmax_tokens, process_logits, sample_categorical, sample_without_replacement, verify_greedy, verify_sampling_batch, verify_sampling_node
from sequoia_opt.tree import Tree

TRIALS = 100_000  # seeded trials per check: sampling noise in total variation is ~0.003 for V <= 10


# single-threaded for the whole session: tests/conftest.py


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * (counts.double() / counts.sum() - p.double()).abs().sum().item()


def _dist(seed: int, V: int, top_p: float = 1.0, sharpness: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return process_logits(torch.randn(V, generator=g) * sharpness, 1.0, top_p)


# ---------------------------------------------------------------------------------------------- process_logits


def test_process_logits_temperature_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]])
    greedy = process_logits(logits, 0.0)
    assert torch.equal(greedy[0], torch.tensor([1.0, 0, 0, 0]))
    torch.testing.assert_close(process_logits(logits, 1.0), torch.softmax(logits, -1))
    torch.testing.assert_close(process_logits(logits, 0.5), torch.softmax(logits / 0.5, -1))
    sm = torch.softmax(logits[0], -1)  # 0.644, 0.237, 0.087, 0.032
    nucleus = process_logits(logits[0], 1.0, top_p=0.85)  # smallest set with mass >= 0.85: two tokens
    torch.testing.assert_close(nucleus, torch.cat([sm[:2] / sm[:2].sum(), torch.zeros(2)]))
    assert process_logits(logits[0], 1.0, top_p=0.5)[0] == 1.0  # the top token is always kept
    assert (process_logits(logits, 1.0, top_p=0.3).sum(-1) - 1).abs().max() < 1e-6
    assert process_logits(logits.half(), 1.0).dtype == torch.float32
    for bad in (dict(temperature=-0.1), dict(temperature=1.0, top_p=0.0), dict(temperature=1.0, top_p=1.5)):
        with pytest.raises(ValueError):
            process_logits(logits, **bad)


@pytest.mark.parametrize("T", [1e-40, 1e-300, 5e-324, 1e-45, GREEDY_LIMIT_TEMPERATURE / 2])
def test_process_logits_tiny_temperature_is_the_greedy_limit(T):
    """logits / T overflowed (NaN rows; every sampled token became the last id): now the T -> 0 limit."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.5, 3.0, 3.0, -float("inf")], [-3.0, -7.0, -1.0, -2.0]])
    probs = process_logits(logits, T)
    expected = torch.tensor([[1.0, 0, 0, 0], [0, 0.5, 0.5, 0], [0, 0, 1.0, 0]])  # ties: uniform
    assert torch.equal(probs, expected)
    assert torch.equal(process_logits(logits[0], T), expected[0])
    assert torch.equal(process_logits(logits, T, top_p=0.9), expected)
    assert torch.equal(process_logits(logits.half(), T), expected)


def test_process_logits_is_finite_and_converges_for_every_finite_temperature():
    logits = torch.tensor([1.0, 0.9999, 0.0, -float("inf"), -50.0])
    limit = torch.tensor([1.0, 0, 0, 0, 0])
    for T in (GREEDY_LIMIT_TEMPERATURE, 2e-38, 1e-30, 1e-10, 1e-7):  # at and above the threshold: divided
        probs = process_logits(logits, T)
        assert torch.equal(probs, limit), T  # runner-up 1e-4 behind: exp(-1e-4 / 1e-7) = exp(-1000) = 0
    probs = process_logits(logits, 1e-4)  # the runner-up weighs exp(-1) against the maximum
    e = math.exp(-1.0)
    torch.testing.assert_close(probs, torch.tensor([1.0, e, 0.0, 0.0, 0.0]) / (1 + e), atol=1e-4, rtol=0)
    for T in (1e30, 1e300):  # huge T: uniform over the finite logits, the impossible token stays at 0
        torch.testing.assert_close(process_logits(logits, T), torch.tensor([0.25, 0.25, 0.25, 0.0, 0.25]))


@pytest.mark.parametrize("T", [0.0, 1e-40, 1.0])
def test_process_logits_refuses_nan_and_inf_logits(T):
    ok = torch.tensor([[0.0, 1.0, -float("inf")], [2.0, 2.0, 1.0]])
    assert torch.isfinite(process_logits(ok, T)).all()  # -inf marks an impossible token: fine
    for bad in (float("nan"), float("inf")):
        x = ok.clone()
        x[1, 2] = bad
        with pytest.raises(ValueError, match="NaN or \\+inf"):
            process_logits(x, T)
    with pytest.raises(ValueError, match="all -inf"):
        process_logits(torch.full((2, 3), -float("inf")), T)


def test_argmax_tokens_refuses_nan_and_inf():
    assert argmax_tokens(torch.tensor([[0.0, 3.0, 1.0], [5.0, -1.0, -float("inf")]])) == [1, 0]
    assert argmax_tokens(torch.tensor([0.0, 3.0, 4.0])) == [2]
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="no greedy token"):
            argmax_tokens(torch.tensor([[0.0, 3.0, 1.0], [5.0, bad, 0.0]]))


# ---------------------------------------------------------------------------------------------- samplers


def test_sample_categorical_distribution():
    p = _dist(0, 8, top_p=0.9)
    g = torch.Generator().manual_seed(1)
    tokens = sample_categorical(p.expand(TRIALS, -1), g)
    counts = torch.bincount(tokens, minlength=8)
    assert _tv(counts, p) < 0.01
    assert counts[p == 0].sum() == 0
    assert sample_categorical(p, g).dim() == 0


def test_sample_categorical_draw_at_the_total_gives_the_last_token_with_mass(monkeypatch):
    """A draw that lands on the total (u * total == total: a uniform of 1.0, or a product rounded up to the
    total) falls past every bin, onto the trailing zero-mass bins: the inverse CDF's value there is the last
    token with mass (2 and 4), not the argmax (1 and 2)."""
    import sequoia_opt.decoding.sampling as sampling

    monkeypatch.setattr(sampling, "_rand", lambda shape, gen, dev: torch.ones(shape, device=dev))
    p = torch.tensor([[0.5, 2.0, 0.5, 0.0, 0.0], [0.0, 0.0, 1.5, 1.0, 0.5]])
    assert sample_categorical(p, torch.Generator()).tolist() == [2, 4]
    assert int(sample_categorical(p[0], torch.Generator())) == 2


def test_sample_without_replacement_is_ordered_plackett_luce():
    V = 5
    q = _dist(2, V)
    g = torch.Generator().manual_seed(3)
    s = sample_without_replacement(q.expand(TRIALS, -1), 2, g)  # (TRIALS, 2)
    assert (s[:, 0] != s[:, 1]).all()
    counts = torch.bincount(s[:, 0] * V + s[:, 1], minlength=V * V)
    # P(first = a, second = b) = q_a * q_b / (1 - q_a)
    exact = (q[:, None] * q[None, :] / (1 - q[:, None])).fill_diagonal_(0).flatten()
    assert _tv(counts, exact) < 0.01


def test_sample_without_replacement_pads_with_zero_probability_tokens():
    q = torch.tensor([0.0, 0.7, 0.0, 0.3, 0.0])
    s = sample_without_replacement(q.expand(1000, -1), 4, torch.Generator().manual_seed(0))
    assert set(s[:, :2].flatten().tolist()) == {1, 3}  # the real samples come first
    assert set(s[:, 2:].flatten().tolist()) <= {0, 2, 4}  # then padding
    assert all(len(set(row)) == 4 for row in s.tolist())


BAD_ROWS = {
    "nan": [0.2, float("nan"), 0.8],
    "inf": [0.2, float("inf"), 0.8],
    "negative": [0.6, -0.1, 0.5],
    "all zero": [0.0, 0.0, 0.0],
}


@pytest.mark.parametrize("bad", list(BAD_ROWS))
def test_samplers_refuse_rows_that_are_not_distributions(bad):
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.1, 0.6, 0.3], BAD_ROWS[bad]])
    with pytest.raises(ValueError, match="sample_categorical needs rows of finite, non-negative weights"):
        sample_categorical(probs, g)
    with pytest.raises(ValueError, match="sample_categorical"):
        sample_categorical(probs[1], g)
    with pytest.raises(ValueError, match="sample_without_replacement needs rows of finite"):
        sample_without_replacement(probs, 2, g)
    good = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.5, 0.0]])
    cands = torch.tensor([[1], [0]])
    with pytest.raises(ValueError, match="draft distribution q"):
        verify_sampling_batch(good, probs, cands, g)
    with pytest.raises(ValueError, match="sample_categorical"):  # p, or its residual, is sampled at the end
        verify_sampling_batch(probs, good, cands, g)
    assert sample_categorical(good, g).tolist()[1] in (0, 1)  # the valid rows still sample


# ---------------------------------------------------------------------------------------------- sampling verifier


def _run_verifier(p, q, k, seed):
    g = torch.Generator().manual_seed(seed)
    P, Q = p.expand(TRIALS, -1), q.expand(TRIALS, -1)
    cands = sample_without_replacement(Q, k, g)  # (TRIALS, k) drafted children, rank order
    accepted, token = verify_sampling_batch(P, Q, cands, g)
    return accepted, token, cands


CASES = [  # (V, top_p of p, top_p of q, seed)
    (6, 1.0, 1.0, 10),
    (8, 1.0, 1.0, 11),
    (10, 1.0, 1.0, 12),
    (8, 0.8, 0.8, 13),  # top-p on both, different supports
    (10, 0.7, 1.0, 14),
    (6, 1.0, 0.6, 15),  # the draft's nucleus may hold fewer tokens than k
]


@pytest.mark.parametrize("V,top_p_p,top_p_q,seed", CASES)
def test_single_candidate_is_exact_and_accepts_sum_min(V, top_p_p, top_p_q, seed):
    p, q = _dist(seed, V, top_p_p), _dist(seed + 100, V, top_p_q)
    accepted, token, cands = _run_verifier(p, q, 1, seed)
    assert _tv(torch.bincount(token, minlength=V), p) < 0.01
    rate = (accepted == 0).double().mean().item()
    assert abs(rate - torch.minimum(p, q).sum().item()) < 0.01
    assert torch.equal(token[accepted == 0], cands[accepted == 0, 0])


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("V,top_p_p,top_p_q,seed", CASES)
def test_multiple_candidates_without_replacement_are_exact(V, top_p_p, top_p_q, seed, k):
    p, q = _dist(seed, V, top_p_p), _dist(seed + 100, V, top_p_q)
    accepted, token, cands = _run_verifier(p, q, k, seed + k)
    assert _tv(torch.bincount(token, minlength=V), p) < 0.01
    # the first candidate is still accepted with probability sum min(p, q)
    assert abs((accepted == 0).double().mean().item() - torch.minimum(p, q).sum().item()) < 0.01
    hit = accepted >= 0
    assert torch.equal(token[hit], cands[hit].gather(1, accepted[hit, None]).squeeze(1))
    assert (q[cands[hit].gather(1, accepted[hit, None]).squeeze(1)] > 0).all()  # padding never accepted


def test_more_candidates_accept_more_often():
    p, q = _dist(20, 8), _dist(21, 8)
    rates = [(_run_verifier(p, q, k, 5)[0] >= 0).double().mean().item() for k in (1, 2, 3)]
    assert rates[0] < rates[1] < rates[2]


def test_identical_distributions_always_accept_the_first_candidate():
    p = _dist(30, 8, top_p=0.9)
    accepted, token, cands = _run_verifier(p, p.clone(), 2, 0)
    assert (accepted == 0).all() and torch.equal(token, cands[:, 0])


def test_disjoint_supports_reject_and_sample_from_p():
    p = torch.tensor([0.5, 0.5, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.25, 0.75])
    accepted, token, _ = _run_verifier(p, q, 2, 1)
    assert (accepted == -1).all()
    assert _tv(torch.bincount(token, minlength=4), p) < 0.01


def test_verify_sampling_node_single():
    p, q = _dist(40, 6), _dist(41, 6)
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    outcomes = set()
    for _ in range(800):
        cands = sample_without_replacement(q[None], 2, g)[0]
        r, tok = verify_sampling_node(p, q, cands, g)
        assert r is None or tok == int(cands[r])
        outcomes.add(r)
        counts[tok] += 1
    assert outcomes == {None, 0, 1}
    assert _tv(counts, p) < 0.1  # a smoke check of the wrapper; exactness is tested in batch above
    # seeded: the same generator state gives the same answer
    r1 = verify_sampling_node(p, q, cands, torch.Generator().manual_seed(9))
    r2 = verify_sampling_node(p, q, cands, torch.Generator().manual_seed(9))
    assert r1 == r2


def test_zero_candidates_samples_from_p():
    p = _dist(50, 7)
    g = torch.Generator().manual_seed(0)
    acc, tok = verify_sampling_batch(p.expand(TRIALS, -1), p.expand(TRIALS, -1),
                                     torch.zeros(TRIALS, 0, dtype=torch.int64), g)
    assert (acc == -1).all() and _tv(torch.bincount(tok, minlength=7), p) < 0.01


# ---------------------------------------------------------------------------------------------- greedy walk


def test_verify_greedy_walk():
    tree = Tree.from_choices([[0], [1], [2], [0, 0], [1, 0], [1, 1], [1, 1, 0]])
    # nodes: 0 root, 1 [0], 2 [1], 3 [2], 4 [0,0], 5 [1,0], 6 [1,1], 7 [1,1,0]
    tokens = [9, 10, 11, 12, 13, 14, 15, 16]
    argmax = {0: 11, 2: 15, 6: 16, 7: 42}  # root -> [1] -> [1, 1] -> [1, 1, 0] -> bonus 42
    full = [argmax.get(i, 99) for i in range(tree.size)]
    acc = verify_greedy(full, tokens, tree.children)
    assert acc.path == (0, 2, 6, 7) and acc.tokens == (11, 15, 16, 42) and acc.bonus == 42
    assert [(v.depth, v.num_children, v.accepted_rank) for v in acc.visits] == [(0, 3, 1), (1, 2, 1), (2, 1, 0)]
    assert acc.accepted_nodes == 3
    # rejection at the root: the bonus is the target's argmax there
    acc = verify_greedy([5] * tree.size, tokens, tree.children)
    assert acc.path == (0,) and acc.tokens == (5,)
    assert [(v.depth, v.accepted_rank) for v in acc.visits] == [(0, None)]
    # a root-only tree: no trial, just the bonus
    acc = verify_greedy([7], [1], Tree.chain(1).children)
    assert acc.path == (0,) and acc.tokens == (7,) and acc.visits == ()


def test_verify_greedy_exhaustive_small_tree():
    """Every argmax assignment on a small tree: the emitted tokens are the greedy walk's tokens."""
    tree = Tree.from_choices([[0], [1], [0, 0], [1, 0]])
    tokens = [0, 1, 2, 1, 2]  # distinct among siblings
    for argmax in itertools.product(range(3), repeat=tree.size):
        acc = verify_greedy(list(argmax), tokens, tree.children)
        node, expect = 0, []
        while True:
            nxt = [c for c in tree.children[node] if tokens[c] == argmax[node]]
            expect.append(argmax[node])
            if not nxt:
                break
            node = nxt[0]
        assert list(acc.tokens) == expect
