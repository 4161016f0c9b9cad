"""Rows joining a running generation (``Decoder.join``, continuous batching): every request decodes exactly as
it would alone, whenever it joins (shorter or longer than the rows already running, while rows leave), with a
draft model, prompt lookup, or no policy; a drained state starts over; the limits are refused before any
forward."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sequoia_opt.decoding import AutoregressiveDecoder, Decoder
from sequoia_opt.drafting import StaticTreePolicy
from sequoia_opt.drafting.drafters.lookup import PromptLookupDrafter
from sequoia_opt.errors import DecodingError
from sequoia_opt.tree import Tree

sys.path.insert(0, str(Path(__file__).parent))

from test_decoding import _model, _perturbed  # noqa: E402

PROMPTS = [[5, 17, 3], list(range(40, 52)), [1], list(range(100, 131)), [200, 3, 3, 9, 41, 77], [7, 7, 7, 7]]
_REF: dict[tuple, list[int]] = {}


@pytest.fixture(scope="module")
def target():
    return _model(0)


@pytest.fixture(scope="module")
def draft(target):
    return _perturbed(target, 0.3, seed=1)


def _alone(target, prompt, new):
    key = (tuple(prompt), new)
    if key not in _REF:
        _REF[key] = AutoregressiveDecoder(target, max_len=256).generate(prompt, new).tokens
    return _REF[key]


def _stream(dec, prompts, new, arrive_every=2, lens=None):
    """Start with prompt 0; after every ``arrive_every`` steps the next prompt joins; run to the end."""
    state = dec.start_batch([prompts[0]], new if lens is None else lens[0])
    waiting = list(range(1, len(prompts)))
    steps = 0
    batches = []
    while waiting or not state.finished:
        if waiting and state.batch < dec.max_batch and ((steps and steps % arrive_every == 0) or state.finished):
            i = waiting.pop(0)
            dec.join(state, [prompts[i]], new if lens is None else lens[i])
        if not state.finished:
            batches.append(dec.step(state).batch)
            steps += 1
    return state, batches


@pytest.mark.parametrize("kind", ["plain", "chain", "tree", "lookup"])
def test_joiners_decode_as_alone(target, draft, kind):
    tree = {"chain": Tree.chain(4), "tree": Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]]),
            "lookup": Tree.chain(3)}.get(kind)
    if kind == "plain":
        policy = None
    elif kind == "lookup":
        policy = StaticTreePolicy(PromptLookupDrafter(target.config.vocab_size), tree)
    else:
        policy = StaticTreePolicy(draft, tree)
    dec = Decoder(target, policy, max_len=256, max_batch=4)
    lens = [20, 12, 24, 8, 16, 10]  # rows leave at different steps while others join
    state, batches = _stream(dec, PROMPTS, 20, lens=lens)
    assert [r.tokens for r in state.results] == [_alone(target, p, n) for p, n in zip(PROMPTS, lens)]
    assert all(r.stop_reason == "max_new_tokens" for r in state.results)
    assert max(batches) >= 3 and batches[0] == 1  # concurrency rose from one row


def test_join_a_longer_prompt_than_the_frontier_makes_holes(target, draft):
    """A joiner longer than every cached row moves the shared frontier: the old rows get holes, exactly."""
    dec = Decoder(target, StaticTreePolicy(draft, Tree.chain(3)), max_len=256, max_batch=3)
    state = dec.start_batch([[5, 17, 3]], 16)
    dec.step(state)
    dec.join(state, [list(range(100, 140))], 16)
    assert dec.face.rows.holes and dec.face.rows.frontier >= 39
    while not state.finished:
        dec.step(state)
    assert state.results[0].tokens == _alone(target, [5, 17, 3], 16)
    assert state.results[1].tokens == _alone(target, list(range(100, 140)), 16)


def test_join_after_every_row_finished_starts_over(target, draft):
    dec = Decoder(target, StaticTreePolicy(draft, Tree.chain(2)), max_len=256, max_batch=2)
    state = dec.start_batch([[5, 17, 3]], 4)
    while not state.finished:
        dec.step(state)
    idx = dec.join(state, [[200, 3, 3, 9], [7, 7]], 6)
    assert idx == [1, 2] and state.batch == 2
    while not state.finished:
        dec.step(state)
    assert [r.tokens for r in state.results] == [_alone(target, p, n) for p, n in
                                                 (([5, 17, 3], 4), ([200, 3, 3, 9], 6), ([7, 7], 6))]


def test_join_refusals(target, draft):
    dec = Decoder(target, StaticTreePolicy(draft, Tree.chain(2)), max_len=40, max_batch=2)
    state = dec.start_batch([[1, 2, 3]], 4)
    with pytest.raises(DecodingError, match="1 live rows and 2 joining exceed this decoder's max_batch=2"):
        dec.join(state, [[4], [5]], 4)
    with pytest.raises(DecodingError, match="KV cache has 40 slots"):
        dec.join(state, [list(range(38))], 8)
    assert state.batch == 1 and len(state.results) == 1  # nothing half-joined
    empty = dec.join(state, [[9, 9]], 0)
    assert state.results[empty[0]].stop_reason == "empty" and state.batch == 1


def test_a_state_is_served_only_by_the_decoder_and_prefill_that_made_it():
    """Stepping a state after its decoder started another read the other one's cache: wrong tokens, no error
    (plain, lookup, dynamic, self:L) or a bare IndexError (static, chain, graft). Refused now, in one line."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import random_model

    from sequoia_opt.decoding import Decoder
    from sequoia_opt.errors import DecodingError

    target = random_model(0)
    dec, other = Decoder(target, max_len=128), Decoder(target, max_len=128)
    want = Decoder(target, max_len=128).generate([5, 17, 3], 12).tokens
    s1 = dec.start([5, 17, 3], 12)
    dec.step(s1)
    s2 = dec.start(list(range(40, 60)), 12)
    for call in (lambda: dec.step(s1), lambda: dec.draft(s1), lambda: dec.join(s1, [[3]], 4)):
        with pytest.raises(DecodingError, match="started another generation after this one"):
            call()
    with pytest.raises(DecodingError, match="started by another decoder"):
        other.step(s2)
    while not s2.finished:  # the live one runs on, and a fresh start serves again
        dec.step(s2)
    s3 = dec.start([5, 17, 3], 12)
    while not s3.finished:
        dec.step(s3)
    assert s3.results[0].tokens == want


def test_wasteful_counts_only_the_slots_a_repack_removes(target):
    """RowCache.wasteful: the frontier's run past the longest row against REPACK_WASTE of the frontier; holes of
    rows shorter than the longest (no repack removes them) do not count."""
    from sequoia_opt.decoding.rows import REPACK_WASTE, RowCache

    rows = RowCache(target.new_cache(64, batch=3), target.device)
    rows.reset(3)
    rows.prefilled([20, 5, 6])
    assert rows.holes and not rows.wasteful()  # F = 20 is the longest row: nothing to gain
    rows.keep([1, 2])  # the long row left: F stays 20, the longest is 6
    assert (rows.frontier, REPACK_WASTE) == (20, 0.25) and rows.wasteful()  # 14 > 0.25 x 20
    rows.repack_waste = 0.75
    assert not rows.wasteful()  # 14 <= 15
    rows.repack_waste = None
    assert not rows.wasteful()
    rows.repack_waste = REPACK_WASTE
    rows.repack()
    assert rows.frontier == 6 and rows.holes and not rows.wasteful()  # the 5-slot row's hole stays


def test_a_frontier_run_past_the_rows_is_repacked_and_decodes_exactly(target, draft):
    """Under continuous batching the frontier only grows (a joiner's prompt sits far behind it); the decoder
    repacks the target's and the draft's caches once it has run a quarter of itself past the longest row, and
    every request still decodes as it would alone. Without the rule (``repack_waste=None``) the same stream lets
    the frontier run past that share."""
    prompts = [list(range(60, 100)), [5, 17, 3]] + [[(7 * i + j) % 200 + 1 for j in range(3 + i % 4)]
                                                    for i in range(10)]
    lens = [6] + [14] * 11  # the long prompt leaves early; the short ones keep joining behind its frontier
    runs = {}
    for waste in (None, 0.25):
        dec = Decoder(target, StaticTreePolicy(draft, Tree.chain(3)), max_len=256, max_batch=3)
        for rc in (dec.face.rows, dec.policy.drafter.rows):
            rc.repack_waste = waste
        seen, seen_draft = [], []
        real_room, real_limit = dec.face.room, dec.policy.drafter.limit

        def longest(rc):
            return rc.frontier, int(rc.valid[:, : rc.frontier].sum(1).max())

        def room(state, want, _real=real_room, _seen=seen, _rc=dec.face.rows):
            out = _real(state, want)  # the target's rule runs here, before the step's forwards
            if _rc.batch > 1:
                _seen.append(longest(_rc))
            return out

        def limit(state, buffers, depth=None, _real=real_limit, _seen=seen_draft, _rc=dec.policy.drafter.rows):
            out = _real(state, buffers, depth)  # the draft model's rule, before its level forwards
            if _rc.batch > 1 and out > 0:
                _seen.append(longest(_rc))
            return out

        dec.face.room, dec.policy.drafter.limit = room, limit
        state, _ = _stream(dec, prompts, 14, arrive_every=1, lens=lens)
        assert [r.tokens for r in state.results] == [_alone(target, p, n) for p, n in zip(prompts, lens)]
        runs[waste] = (seen, seen_draft, dec.face.rows.repacks, dec.policy.drafter.rows.repacks)
    (never, never_d, r0, d0), (rule, rule_d, r1, d1) = runs[None], runs[0.25]
    assert max((f - c) / f for f, c in never) > 0.4  # the stream does push the frontier ahead, in both caches
    assert max((f - c) / f for f, c in never_d) > 0.4
    assert all(f - c <= 0.25 * f for f, c in rule)  # every target forward ran within the rule
    assert all(f - c <= 0.25 * f for f, c in rule_d) and len(rule_d) > 10  # and every draft proposal
    assert r1 > r0 and d1 > d0
