"""The step as the runner runs it (issue 31): the decoding loop's own verify / bookkeeping / draft times per tree
size in latency profiles (``loop``), timed through the Decoder, and the cost model that charges them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import noisy_copy, random_model  # noqa: E402

from sequoia_opt.errors import ProfileError  # noqa: E402
from sequoia_opt.profiles import LatencyCurve, load_latency, save_latency  # noqa: E402
from sequoia_opt.profiling.latency import build_latency_profile, profile_model  # noqa: E402
from sequoia_opt.profiling.steps import (LoopTable, draft_extras, probe_tree, ratio_rel_se, round_rel_se,  # noqa: E402
                                         static_loop_decoders, time_loop)
from sequoia_opt.solver.hardware import choose, plain_ms_per_token, step_cost  # noqa: E402
from sequoia_opt.tree import Tree  # noqa: E402


def _doc(loop=None):
    cur = {"context_tokens": 64,
           "target": {"tokens": [1, 2, 4, 8], "target_forward_ms": [10.0, 11.0, 13.0, 17.0]},
           "draft": {"tokens": [1, 2, 4, 8], "draft_forward_ms": [1.0, 1.1, 1.3, 1.7]}}
    if loop is not None:
        cur["loop"] = loop
    return {"format": "treeopt-latency/1", "id": "t", "step_overhead_ms": 0.5, "curves": [cur]}


LOOP = {"policy": "chain", "tokens": [1, 2, 4, 8], "verify_ms": [10.5, 12.0, 15.0, 21.0],
        "bookkeeping_ms": [0.3, 0.4, 0.5, 0.7], "draft_extra_ms": 0.8}


def test_without_a_loop_the_step_is_the_forwards_and_the_fixed_overhead():
    c = LatencyCurve.from_dict(_doc())
    assert not c.has_loop() and c.loop_policy is None
    assert c.step_target_ms(4) == c.target_ms(4) == 13.0 and c.step_overhead(4) == 0.5 and c.draft_extra_ms() == 0
    s = step_cost([1, 1, 1], 2.0, c)  # a chain of 2 drafts: 2 x c(1) + T(3) + overhead
    assert s.cost_ms == pytest.approx(2 * 1.0 + 12.0 + 0.5)
    assert plain_ms_per_token(c) == pytest.approx(10.5)


def test_with_a_loop_the_step_is_the_loops(tmp_path):
    c = LatencyCurve.from_dict(_doc(LOOP))
    assert c.has_loop() and c.loop_policy == "chain"
    assert c.step_target_ms(3) == pytest.approx(13.5) and c.step_overhead(3) == pytest.approx(0.45)
    s = step_cost([1, 1, 1], 2.0, c)  # 2 x (c(1) + 0.8) + verify(3) + bookkeeping(3)
    assert (s.draft_ms, s.target_ms, s.overhead_ms) == pytest.approx((2 * 1.8, 13.5, 0.45))
    assert plain_ms_per_token(c) == pytest.approx(10.8)  # the loop's plain step
    assert s.speedup == pytest.approx(1000 * 2.0 / s.cost_ms * 10.8 / 1000)
    back = load_latency(save_latency(tmp_path / "l.yaml", c))
    assert back.to_dict()["curves"][0]["loop"] == dict(LOOP, draft_step_extra_ms=0.0)


def test_the_loop_caps_the_largest_tree_scored():
    loop = dict(LOOP, tokens=[1, 2, 4], verify_ms=[10.5, 12.0, 15.0], bookkeeping_ms=[0.3, 0.4, 0.5])
    c = LatencyCurve.from_dict(_doc(loop))
    assert c.max_target_tokens() == 4  # T(n) reaches 8, the loop 4: no extrapolation past either
    with pytest.raises(ProfileError, match="outside the timed sizes 1..4"):
        c.step_target_ms(6)
    ch = choose([0.9, 0.05], c, 4, 4)
    assert ch.tree.size <= 4


@pytest.mark.parametrize("edit, match", [
    (dict(policy="beam"), "policy is 'beam'"),
    (dict(tokens=[2, 4, 8, 16]), "from 1"),
    (dict(tokens=[1, 4, 2, 8]), "strictly increasing"),
    (dict(verify_ms=[10.0, 11.0]), "as long as tokens"),
    (dict(verify_ms=[0.0, 11.0, 12.0, 13.0]), "must be positive"),
    (dict(bookkeeping_ms=[0.1, -0.1, 0.1, 0.1]), "non-negative"),
    (dict(draft_extra_s=0.1), "unsupported unit"),
    (dict(draft_step_extra_ms=-0.1), "non-negative"),
    (dict(draft_first_ms=0.1), "unknown key 'draft_first_ms'"),
])
def test_bad_loop_tables_are_one_line_errors(edit, match):
    with pytest.raises(ProfileError, match=match):
        LatencyCurve.from_dict(_doc(dict(LOOP, **edit)))


def test_draft_extras_split_the_loops_draft_beyond_c_into_a_per_step_and_a_per_forward_part():
    widths = [(1,), (1, 1), (1, 1, 1), (1, 1, 1, 1), (1,) * 6]
    # a chain's loop draft of f forwards: 0.7 ms once (the first forward reloads the draft) + 1.5 ms per forward;
    # c(1) = 1 ms, so 0.7 per step and 0.5 per forward beyond it
    t = LoopTable(context=0, policy="chain", tokens=[1, 2, 3, 4, 6], level_widths=widths,
                  draft_ms=[0.0] + [0.7 + 1.5 * f for f in (1, 2, 3, 5)], verify_ms=[1.0] * 5, bookkeeping_ms=[0.1] * 5)
    assert draft_extras(t, lambda w: 1.0) == pytest.approx((0.7, 0.5))
    # one noisy size does not move a Theil-Sen fit
    noisy = LoopTable(**{**t.__dict__, "draft_ms": [0.0, 2.2, 3.7, 9.9, 8.2]})
    assert draft_extras(noisy, lambda w: 1.0) == pytest.approx((0.7, 0.5))
    # the old model's figure (one extra per forward: the median of the sizes') is what a flat per-forward fit gives
    flat = LoopTable(**{**t.__dict__, "draft_ms": [0.0, 3.0, 6.0, 9.0, 15.0]})
    assert draft_extras(flat, lambda w: 1.0) == pytest.approx((0.0, 2.0))
    # sizes below a line through 0 (r = -0.6 + 0.5 f): no negative part per step; one extra per forward instead
    below = LoopTable(**{**t.__dict__, "draft_ms": [0.0, 0.9, 2.4, 3.9, 6.9]})
    assert draft_extras(below, lambda w: 1.0) == pytest.approx((0.0, 0.25))  # median of -0.1, 0.2, 0.3, 0.38
    assert draft_extras(t, lambda w: 5.0) == (0.0, 0.0)  # never negative
    assert draft_extras(t, lambda w: 1.0, max_width=0) == (0.0, 0.0)  # nothing within the measured c
    # one forward count (a one-pass drafter: c(3) = 1.15, c(7) = 1.35, 0.5 beyond each): the two parts cannot be
    # told apart
    one = LoopTable(context=0, policy="static", tokens=[1, 4, 8], level_widths=[(1,), (1, 3), (1, 7)],
                    draft_ms=[0.0, 1.65, 1.85], verify_ms=[1.0] * 3, bookkeeping_ms=[0.1] * 3)
    assert draft_extras(one, lambda w: 1.0 + 0.05 * w, "one-pass") == pytest.approx((0.0, 0.5))


def test_a_step_that_drafts_pays_the_per_step_extra_once(tmp_path):
    c = LatencyCurve.from_dict(_doc(dict(LOOP, draft_extra_ms=0.1, draft_step_extra_ms=0.7)))
    assert c.draft_step_extra_ms() == 0.7 and c.step_draft_ms([]) == 0.0
    assert c.step_draft_ms([1, 1]) == pytest.approx(2 * 1.1 + 0.7)
    s1, s2 = step_cost([1, 1], 1.5, c), step_cost([1, 1, 1], 2.0, c)  # chains of 1 and 2 drafts
    assert s1.draft_ms == pytest.approx(1.1 + 0.7) and s2.draft_ms == pytest.approx(2.2 + 0.7)
    assert step_cost([1], 1.0, c).draft_ms == 0.0  # plain decoding drafts nothing
    back = load_latency(save_latency(tmp_path / "l.yaml", c))
    assert back.draft_step_extra_ms() == 0.7 and back.draft_extra_ms() == pytest.approx(0.1)
    # a loop written before the per-step part was measured reads as 0: every forward charged alike
    old = LatencyCurve.from_dict(_doc(LOOP))
    assert old.draft_step_extra_ms() == 0.0 and step_cost([1, 1, 1], 2.0, old).draft_ms == pytest.approx(2 * 1.8)


def test_probe_trees():
    assert probe_tree(1) == Tree.chain(1) and probe_tree(5, "chain") == Tree.chain(5)
    t = probe_tree(9)
    assert t.size == 9 and t.level_widths == (1, 4, 4)


class _FakeDecoder:
    """A decoder whose steps take fixed times scaled by the machine's current speed (``clock["slow"]``): verify
    10 + n ms, draft n ms, bookkeeping 1 + n / 2 ms for a tree of n tokens."""

    def __init__(self, n, clock):
        self.n, self.clock = n, clock

    def start_batch(self, prompts, max_new_tokens):
        from types import SimpleNamespace
        self.rows = len(prompts)
        return SimpleNamespace(finished=False)

    def step(self, state):
        from types import SimpleNamespace
        f, n = self.clock["slow"], self.n
        self.steps = getattr(self, "steps", 0) + 1
        # a row leaves after the fifth step of a leaving decoder: its steps from then are not counted
        b = self.rows - 1 if self.clock.get("leave") == n and self.steps > 5 else self.rows
        return SimpleNamespace(draft_ms=f * (n - 1), verify_ms=f * (10.0 + n), bookkeeping_ms=f * (1.0 + n / 2),
                               tree_size=n, batch=b, rows=[SimpleNamespace(tree_size=n)] * b)


def test_time_loop_pairs_every_step_with_a_plain_step_so_a_slow_spell_cancels():
    """A slow spell (1.5x) while one size is timed: paired with the plain steps beside it, that size keeps its
    true times (unpaired medians would come out 1.5x too slow and the table's shape wrong)."""
    clock = {"slow": 1.0}
    made = []

    def make(n):
        clock["slow"] = 1.5 if n == 4 else 1.0
        return _FakeDecoder(n, clock)

    def make_plain():
        made.append(1)
        return _FakeDecoder(1, clock)

    table = time_loop(make, [1, 2, 3, 4], 8, 50, steps=4, warmup=1, rounds=1, make_plain=make_plain)
    assert len(made) == 3  # one reference per timed size and round
    assert table.tokens == [1, 2, 3, 4]
    # the reference's median plain step: 8 of 12 steps at full speed (11 ms verify, 1.5 ms bookkeeping)
    assert table.verify_ms == pytest.approx([11.0, 12.0, 13.0, 14.0])
    assert table.draft_ms == pytest.approx([0.0, 1.0, 2.0, 3.0])
    assert table.bookkeeping_ms == pytest.approx([1.5, 2.0, 2.5, 3.0])


def test_time_loop_through_the_decoder_on_a_tiny_pair():
    target = random_model(0)
    draft = noisy_copy(target, 0.05, 1)
    grid = [1, 2, 4]
    table = time_loop(static_loop_decoders(target, draft, max_len=96), grid, 24, 257, steps=3, warmup=1, rounds=1)
    assert table.tokens == grid and table.policy == "static"
    assert table.draft_ms[0] < 0.05 and all(d > 0 for d in table.draft_ms[1:])  # plain decoding drafts nothing
    assert all(v > 0 for v in table.verify_ms) and all(b > 0 for b in table.bookkeeping_ms)
    assert table.level_widths == [(1,), (1, 1), (1, 3)]
    tt = profile_model(target, grid, [24], max_repeats=3, min_repeats=2)
    dt = profile_model(draft, [1, 2, 4], [24], what="draft", max_repeats=3, min_repeats=2)
    curve = build_latency_profile(target_tables=tt, draft_tables=dt, step_overhead_ms=0.1, device="cpu",
                                  dtype=target.dtype, target_name="t", target_config=target.config, draft_name="d",
                                  draft_config=draft.config, random_weights=True, profile_id="x", loop_tables=[table])
    assert curve.has_loop(24) and curve.loop_policy == "static"
    # the profile keeps 4 decimals of a ms: a bookkeeping step of 0.03 ms is 0.0284 for 0.02844
    assert curve.step_target_ms(4, 24) == pytest.approx(table.verify_ms[2], rel=1e-3, abs=5e-5)
    assert curve.step_overhead(2, 24) == pytest.approx(table.bookkeeping_ms[1], rel=1e-3, abs=5e-5)
    assert curve.draft_extra_ms(24) >= 0.0
    assert plain_ms_per_token(curve, 24) == pytest.approx(table.verify_ms[0] + table.bookkeeping_ms[0], rel=1e-3,
                                                          abs=1e-4)


def test_time_loop_runs_every_step_at_the_batch_size():
    made = []

    def make(n):
        made.append(_FakeDecoder(n, {"slow": 1.0}))
        return made[-1]

    table = time_loop(make, [1, 2], 8, 50, steps=2, warmup=1, rounds=1, rows=3)
    assert table.tokens == [1, 2] and {d.rows for d in made} == {3}  # b random prompts, one per row
    assert table.timed == [2, 2]
    # a row that leaves early (its drafts accepted): the steps after it are not the step at b rows
    made.clear()

    def leaving(n):
        made.append(_FakeDecoder(n, {"slow": 1.0, "leave": 2}))
        return made[-1]

    table = time_loop(leaving, [1, 2], 8, 50, steps=8, warmup=1, rounds=1, rows=3)
    assert table.timed == [8, 4]  # steps 2-5 of 1 + 8 counted at size 2; the plain reference's all 8


def test_ratio_rel_se_is_the_medians_normal_error_from_the_mad():
    # median 2, MAD 1: 1.2533 x 1.4826 / sqrt(3) / 2
    assert ratio_rel_se([1.0, 2.0, 3.0]) == pytest.approx(1.2533 * 1.4826 / 3 ** 0.5 / 2)
    assert ratio_rel_se([5.0] * 8) == 0.0
    assert ratio_rel_se([1.0, 2.0]) == float("inf")  # too few to say
    assert ratio_rel_se([-1.0, 0.0, 0.0]) == float("inf")


def test_round_rel_se_is_the_spread_between_rounds():
    # rounds 1.0, 1.2, 1.1: sd 0.1, mean 1.1
    assert round_rel_se([1.0, 1.2, 1.1]) == pytest.approx(0.1 / 3 ** 0.5 / 1.1)
    assert round_rel_se([1.1] * 4) == 0.0
    assert round_rel_se([1.0, 1.2]) == float("inf")  # two rounds cannot say how rounds differ
    assert round_rel_se([-1.0, 0.5, 0.5]) == float("inf")


def test_time_loop_adds_rounds_while_rounds_disagree():
    """A size whose steps agree within each round but whose rounds differ (a decoder instance keeps its speed:
    +-10 % between rounds here) is not known from its steps' spread: it gets rounds until max_rounds."""
    made = []

    class PerInstance(_FakeDecoder):
        def step(self, state):
            out = super().step(state)
            if self.n == 2:
                out.verify_ms *= 1.1 if made.count(2) % 2 else 0.9
            return out

    def make(n):
        made.append(n)
        return PerInstance(n, {"slow": 1.0})

    time_loop(make, [1, 2, 3], 8, 50, steps=4, warmup=0, rounds=1, max_rounds=5,
              make_plain=lambda: PerInstance(1, {"slow": 1.0}))
    assert made.count(2) == 5 and made.count(3) == 3  # size 3 steady: three rounds that agree


def test_time_loop_adds_rounds_only_for_sizes_still_noisy():
    """max_rounds: after the first round, a size whose step ratio scatters (size 3: verify +-30 % step to step)
    gets more rounds until max_rounds; a steady one (size 2) is done once three rounds show its rounds agree."""
    made = []

    class Noisy(_FakeDecoder):
        def step(self, state):
            out = super().step(state)
            if self.n == 3:
                out.verify_ms *= 1.3 if self.steps % 2 else 0.7
            return out

    def make(n):
        made.append(n)
        return Noisy(n, {"slow": 1.0})

    table = time_loop(make, [1, 2, 3], 8, 50, steps=4, warmup=0, rounds=1, max_rounds=4, make_plain=lambda: Noisy(
        1, {"slow": 1.0}))
    assert made.count(2) == 3 and made.count(3) == 4
    assert table.timed == [4 * 7, 12, 16]  # the plain reference steps beside every timed step
    assert table.verify_ms[1] == pytest.approx(12.0)
    # without max_rounds, one round each, as before
    made.clear()
    time_loop(make, [1, 2, 3], 8, 50, steps=4, warmup=0, rounds=1, make_plain=lambda: Noisy(1, {"slow": 1.0}))
    assert made == [2, 3]


def test_batch_profiles_time_the_loop_at_every_batch_size():
    from sequoia_opt.profiles.batch import BatchLatencyProfile
    from sequoia_opt.profiling.batch import profile_batches

    target = random_model(0)
    draft = noisy_copy(target, 0.05, 1)
    prof = profile_batches(target, draft, [1, 2], [1, 2, 3], [1, 2], [16], target_name="t", draft_name="d",
                           profile_id="p", device=target.device, dtype=target.dtype, random_weights=True,
                           loop="chain", min_repeats=2, max_repeats=2)
    for b in (1, 2):
        c = prof.curve(b)
        assert c.has_loop(16) and c.loop_policy == "chain"
        # a chain plan's step at b is the loop's: verify(3) in place of T(b, 3)
        assert step_cost([1, 1, 1], 2.0, c, 16).target_ms == pytest.approx(c.step_target_ms(3, 16))
        assert c.step_target_ms(3, 16) != c.target_ms(3, 16)
    back = BatchLatencyProfile.from_dict(prof.to_dict())
    assert back.curve(2).has_loop(16) and back.curve(2).to_dict()["curves"][0]["loop"]["policy"] == "chain"
    plain = profile_batches(target, None, [2], [1, 2], [1], [16], target_name="t", draft_name=None, profile_id="q",
                            device=target.device, dtype=target.dtype, random_weights=True, loop="chain",
                            min_repeats=2, max_repeats=2)
    assert not plain.curve(2).has_loop(16)  # no draft model: nothing to time


def test_repeating_prompts_repeat_one_segment_per_row():
    from sequoia_opt.profiling.steps import repeating_prompts

    ps = repeating_prompts(3, 40, 257, period=6, seed=2)
    assert len(ps) == 3 and all(len(p) == 41 for p in ps)
    for p in ps:
        assert len(set(p[:6])) > 1  # a random segment, not one id
        assert all(p[i] == p[i % 6] for i in range(41))  # the segment, again and again
    assert ps[0] != ps[1]  # each row its own text
    assert ps == repeating_prompts(3, 40, 257, period=6, seed=2)
    with pytest.raises(ValueError, match="period >= 2"):
        repeating_prompts(3, 40, 257, period=1)


def test_batch_profiles_time_an_ngram_drafters_loop_on_text_that_repeats(monkeypatch):
    import sequoia_opt.profiling.steps as steps
    from sequoia_opt.drafting.drafters import LayerSkipDrafter, PromptLookupDrafter
    from sequoia_opt.profiling.batch import profile_batches

    seen = []

    class Spy(steps.LoopSweep):  # the batch profile's loop sweeps, one per batch size and context
        def __init__(self, *args, **kw):
            seen.append(kw.get("prompts"))
            super().__init__(*args, **kw)

    monkeypatch.setattr(steps, "LoopSweep", Spy)
    target = random_model(0)
    common = dict(target_name="t", profile_id="q", device=target.device, dtype=target.dtype, random_weights=True,
                  loop="chain", min_repeats=2, max_repeats=2)
    prof = profile_batches(target, None, [2], [1, 2, 3], [1], [16], draft_name="lookup",
                           loop_drafter=lambda: PromptLookupDrafter(257), **common)
    c = prof.curve(2)
    assert c.has_loop(16) and c.loop_policy == "chain"
    assert step_cost([1, 1, 1], 2.0, c, 16).target_ms == pytest.approx(c.step_target_ms(3, 16))
    # the n-gram steps ran on two rows of text that repeats (16 + 1 tokens each, a 16-token segment)
    assert len(seen) == 1 and len(seen[0]) == 2
    assert all(len(p) == 17 and p[16] == p[0] and len(set(p)) > 1 for p in seen[0])
    # a drafter serving one row (self layer-skip) has no step at 2 rows: T(b, n) alone, and no error
    seen.clear()
    one = profile_batches(target, None, [1, 2], [1, 2], [1], [16], draft_name="self:1",
                          loop_drafter=lambda: LayerSkipDrafter(target, 1), **common)
    assert one.curve(1).has_loop(16) and not one.curve(2).has_loop(16) and len(seen) == 1


def test_row_contexts_are_the_expected_order_statistics_shifted_to_the_mean():
    from sequoia_opt.profiling.batch import request_contexts, row_contexts

    # two equally likely contexts 0 and 4: of two rows the shorter is 0 unless both are 4 (1/4), E = 1, the longer 3
    assert row_contexts(2, 2, [0, 4]) == [1, 3]
    assert row_contexts(12, 2, [0, 4]) == [11, 13]  # shifted so the rows' mean is the context
    # three rows of {0, 6}: E[min] = 6/8, E[median] = 6 * 4/8, E[max] = 6 * 7/8; mean 3 -> 3; rounded to sum 9 (the
    # largest remainder, 0.75, takes the token left)
    assert row_contexts(3, 3, [0, 6]) == [1, 3, 5]
    assert row_contexts(50, 1, [0, 100]) == [50]  # one row: its own context, nothing padded
    assert row_contexts(50, 4, None) == [50] * 4  # no requests given: every row at the context
    assert row_contexts(7, 5, [9, 9, 9]) == [7] * 5  # requests of one length: no spread
    rows = row_contexts(100, 16, request_contexts([60, 80, 100, 200], 8))
    assert rows == sorted(rows) and abs(sum(rows) / 16 - 100) <= 0.5
    assert rows[-1] > row_contexts(100, 4, request_contexts([60, 80, 100, 200], 8))[-1] > 100  # grows with b
    # a context far below the requests': the spread narrowed around it (never a row below one token), mean kept
    far = row_contexts(128, 16, request_contexts([500, 1000, 2000, 4000], 64))
    assert far[0] == 1 and sum(far) == 16 * 128 and far == sorted(far) and far[-1] > 300
    assert row_contexts(1, 4, [0, 100]) == [1] * 4 and row_contexts(0, 2, [5, 9]) == [0, 0]
    for b in (2, 8, 256):  # the rows' mean is the context exactly, at every batch size
        assert sum(row_contexts(125, b, request_contexts([87, 102, 130, 182], 16))) == 125 * b
    assert request_contexts([3, 10], 2) == [3, 4, 10, 11]
    for bad in (lambda: row_contexts(5, 0, [1]), lambda: row_contexts(-1, 2, [1]), lambda: row_contexts(5, 2, []),
                lambda: request_contexts([], 4), lambda: request_contexts([5], 0)):
        with pytest.raises(ValueError):
            bad()


def test_batch_profiles_spread_rows_like_the_requests(monkeypatch):
    import sequoia_opt.profiling.latency as latency
    import sequoia_opt.profiling.steps as steps
    from sequoia_opt.profiles.batch import BatchLatencyProfile
    from sequoia_opt.profiling.batch import profile_batches, request_contexts, row_contexts

    seen, frontiers = [], []

    class Spy(steps.LoopSweep):
        def __init__(self, *args, **kw):
            seen.append(kw.get("prompts"))
            super().__init__(*args, **kw)

    real = latency._forward_call

    def forward_call(model, n, context, **kw):  # the slots each timed forward attends over
        if kw.get("rows"):
            frontiers.append((kw["rows"], context, kw.get("row_lengths")))
        return real(model, n, context, **kw)

    monkeypatch.setattr(steps, "LoopSweep", Spy)
    monkeypatch.setattr(latency, "_forward_call", forward_call)
    target = random_model(0)
    draft = noisy_copy(target, 0.05, 1)
    requests = request_contexts([4, 8, 40], 4)
    prof = profile_batches(target, draft, [1, 4], [1, 2], [1], [16], target_name="t", draft_name="d",
                           profile_id="p", device=target.device, dtype=target.dtype, random_weights=True,
                           loop="chain", min_repeats=2, max_repeats=2, requests=requests)
    want = row_contexts(16, 4, requests)
    assert want[-1] > 16 > want[0]  # the requests spread: the longest of four rows is past the mean
    assert prof.curve(4).row_contexts(16) == want and prof.curve(1).row_contexts(16) == [16]  # one row: no spread
    back = BatchLatencyProfile.from_dict(prof.to_dict())
    assert back.curve(4).row_contexts(16) == want  # the file keeps them, and so does a merge with another profile
    assert back.keeping(BatchLatencyProfile.from_dict(prof.to_dict())).curve(4).row_contexts(16) == want
    doc = prof.to_dict()
    entry = next(e for e in doc["batches"] if e["batch"] == 4)["curves"][0]
    for bad, says in ((want[:3], "lists 3 rows, not 4"), (want[::-1], "must be ascending")):
        entry["row_context_tokens"] = bad
        with pytest.raises(ProfileError, match=says):
            BatchLatencyProfile.from_dict(doc)
    assert {tuple(x[2]) for x in frontiers if x[0] == 4} == {tuple(want)}  # every forward at 4 rows: those rows
    assert [len(p) - 1 for p in seen[-1]] == want  # the loop's 4 rows: prompts of those contexts (+ the root)
    assert [len(p) - 1 for p in seen[0]] == [16]
    plain = profile_batches(target, draft, [4], [1, 2], [1], [16], target_name="t", draft_name="d", profile_id="q",
                            device=target.device, dtype=target.dtype, random_weights=True, loop="chain",
                            min_repeats=2, max_repeats=2)
    assert plain.curve(4).row_contexts(16) is None and [len(p) - 1 for p in seen[-1]] == [16] * 4


def test_a_forward_over_rows_of_different_lengths_attends_to_the_longest():
    from sequoia_opt.profiling.latency import _forward_call

    target = random_model(0)
    cache = target.new_cache(40 + 2, batch=3)
    captured = {}
    real = target.forward

    def spy(tokens, slots, **kw):
        captured.update(slots=slots.tolist(), prefix=kw["prefix_len"])
        return real(tokens, slots, **kw)

    target.forward = spy
    try:
        _forward_call(target, 2, 20, backend="torch", cache=cache, rows=3, row_lengths=[5, 20, 40])()
    finally:
        del target.forward
    assert captured["slots"] == [40, 41]  # the tree at the shared frontier, the longest row
    valid = captured["prefix"].valid
    assert valid.shape == (3, 40) and valid.sum(1).tolist() == [5, 20, 40]  # each row sees its own tokens
    with pytest.raises(ValueError, match="one length per row"):
        _forward_call(target, 2, 20, backend="torch", cache=cache, rows=3, row_lengths=[5, 20])


def test_the_loop_check_fits_a_spread_batchs_longest_row():
    from sequoia_opt.profiling.steps import check_loop_fits, loop_positions

    check_loop_fits(100, 9, loop_positions(100, 9), model="m", fixes="x")  # fits exactly
    with pytest.raises(ProfileError) as err:  # the rows spread past it: the longest row must fit, named
        check_loop_fits(100, 9, loop_positions(100, 9), model="m", fixes="--rows uniform", longest=130)
    assert ("timing the decoding loop at --context 100 (its longest row at 130) with trees up to 9 tokens decodes "
            f"{loop_positions(130, 9)} positions, past m's context of {loop_positions(100, 9)} tokens: lower --context "
            "to 70 or --rows uniform") == str(err.value)
