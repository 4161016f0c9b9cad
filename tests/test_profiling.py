"""Latency and acceptance profilers on tiny random models (fast)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import PROMPTS, byte_tokenizer, noisy_copy, random_model  # noqa: E402

from sequoia_opt.errors import ProfileError  # noqa: E402
from sequoia_opt.profiles import load_acceptance, load_latency, save_acceptance, save_latency  # noqa: E402
from sequoia_opt.profiling.acceptance import (  # noqa: E402
    AcceptanceCounts,
    build_acceptance_profile,
    measure_acceptance,
    measurement_tree,
    positional_check,
)
from sequoia_opt.profiling.latency import (  # noqa: E402
    build_latency_profile,
    measure_step_overhead,
    profile_model,
    random_weight_model,
)
from sequoia_opt.profiling.timing import Timing, time_alternating, time_call, token_grid  # noqa: E402
from sequoia_opt.drafting import SpeculativeDecoder  # noqa: E402
from sequoia_opt.model import ModelConfig  # noqa: E402
from sequoia_opt.tree import Tree  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    target = random_model(0)
    return target, noisy_copy(target, 0.05, 1)


@pytest.fixture(scope="module")
def prompt_ids():
    tok = byte_tokenizer()
    return [tok.encode(p) for p in PROMPTS]


# ------------------------------------------------------------------ timing
def test_token_grid_is_dense_then_geometric_and_ends_at_max():
    g = token_grid(200)
    assert g[:16] == list(range(1, 17))
    assert g[-1] == 200
    assert all(b > a for a, b in zip(g, g[1:]))
    assert all(b / a <= 1.35 for a, b in zip(g[16:], g[17:]))
    assert token_grid(3) == [1, 2, 3]
    with pytest.raises(ValueError):
        token_grid(0)


def test_time_call_counts_repeats_within_bounds():
    calls = []
    t = time_call(lambda: calls.append(1), "cpu", warmup=3, min_repeats=4, max_repeats=8)
    assert 4 <= t.repeats <= 8
    assert len(calls) == 3 + t.repeats
    assert 0 <= t.p10_ms <= t.median_ms <= t.p90_ms
    with pytest.raises(ValueError, match="got min_repeats=5, max_repeats=2"):
        time_call(lambda: None, "cpu", min_repeats=5, max_repeats=2)


# ------------------------------------------------------------------ latency
def test_random_weight_model_has_preset_shape_and_finite_logits():
    cfg = ModelConfig.preset("tiny")
    m = random_weight_model(cfg, device="cpu", dtype=torch.float32)
    assert sum(p.numel() for p in m.parameters()) == cfg.num_parameters()
    out = m(torch.tensor([[1, 2, 3]]))
    assert out.shape == (1, 3, cfg.vocab_size) and torch.isfinite(out).all()
    assert m.lm_head.weight.data_ptr() != m.embed_tokens.weight.data_ptr()  # tiny is untied


def test_latency_profile_round_trips_and_interpolates(tmp_path, pair):
    target, draft = pair
    tt = profile_model(target, [1, 2, 4, 8], [0, 16], max_repeats=5)
    dt = profile_model(draft, [1, 2, 4], [0, 16], what="draft", max_repeats=5)
    assert [t.context for t in tt] == [0, 16] and tt[0].tokens == [1, 2, 4, 8]
    overhead = measure_step_overhead(target, draft, steps=4)
    assert overhead > 0
    curve = build_latency_profile(target_tables=tt, draft_tables=dt, step_overhead_ms=overhead, device="cpu",
                                  dtype=torch.float32, target_name="tiny-t", target_config=target.config,
                                  draft_name="tiny-d", draft_config=draft.config, random_weights=True,
                                  profile_id="cpu_tiny")
    path = save_latency(tmp_path / "lat.yaml", curve)
    back = load_latency(path)
    assert back.target_ms(4, 16) == pytest.approx(curve.target_ms(4, 16))
    assert back.device["threads"] == torch.get_num_threads()
    assert back.model["random_weights"] is True and "RANDOM weights" in back.source
    t2, t4 = back.target_ms(2, 0), back.target_ms(4, 0)
    assert min(t2, t4) <= back.target_ms(3, 0) <= max(t2, t4)
    with pytest.raises(ProfileError, match="extrapolate"):
        back.target_ms(9, 0)


def test_latency_profile_without_draft_says_so(pair):
    target, _ = pair
    tt = profile_model(target, [1, 2], [0], min_repeats=3, max_repeats=3)
    curve = build_latency_profile(target_tables=tt, draft_tables=None, step_overhead_ms=0.1, device="cpu",
                                  dtype=torch.float32, target_name="t", target_config=target.config,
                                  draft_name=None, draft_config=None, random_weights=False, profile_id="x")
    assert curve.draft_ms(1) == 0.0
    assert "NOT measured" in curve.source


def test_profile_model_rounds_take_the_median_of_round_medians(pair, monkeypatch):
    import sequoia_opt.profiling.latency as lat

    target, _ = pair
    medians = iter([30.0, 10.0, 90.0, 20.0, 31.0, 12.0])  # (n=1, n=2) per round; round 2 hit a slow spell
    monkeypatch.setattr(lat, "time_forward", lambda *a, **k: Timing(next(medians), 1.0, 2.0, 4))
    (table,) = lat.profile_model(target, [1, 2], [0], rounds=3)
    assert table.tokens == [1, 2]
    assert [t.median_ms for t in table.timings] == [31.0, 12.0]  # median(30, 90, 31), median(10, 20, 12)
    assert [t.repeats for t in table.timings] == [12, 12]
    with pytest.raises(ProfileError, match="rounds"):
        lat.profile_model(target, [1], [0], rounds=0)


class _DriftingClock:
    """A fake ``time`` module: calls advance it by cost x the machine's speed factor, which drifts per call."""

    def __init__(self, factors):
        self.now, self.factors, self.calls = 0.0, list(factors), 0

    def perf_counter(self) -> float:
        return self.now

    def run(self, cost_ms: float) -> None:
        self.now += cost_ms * self.factors[self.calls % len(self.factors)] / 1e3


def test_time_alternating_keeps_the_ratio_on_a_drifting_machine(monkeypatch):
    import sequoia_opt.profiling.timing as timing

    clock = _DriftingClock([1.0])
    monkeypatch.setattr(timing, "time", clock)

    def call(cost_ms: float):
        def fn():
            clock.run(cost_ms)
        return fn

    def next_round():  # the machine's speed changes between rounds, the same for both calls of a round
        clock.calls += 1

    a, b = call(6.0), call(3.0)
    clock.factors = [1.0, 1.0, 1.6, 1.0, 2.5, 2.5, 2.5, 1.0, 1.3]
    assert [t.repeats for t in time_alternating([a, b], "cpu", warmup=0, min_repeats=5, max_repeats=7,
                                                rel_tol=-1.0, max_seconds=1e9)] == [7, 7]  # never past the cap
    ta, tb = time_alternating([a, lambda: (b(), next_round())], "cpu", warmup=0, min_repeats=3, max_repeats=9,
                              rel_tol=0.0, max_seconds=1e9)
    assert ta.repeats == tb.repeats == 9
    assert ta.median_ms == pytest.approx(2 * tb.median_ms) and tb.median_ms == pytest.approx(3.0 * 1.3)
    assert ta.p90_ms == pytest.approx(6.0 * 2.5)
    with pytest.raises(ValueError, match="nothing"):
        time_alternating([], "cpu")
    with pytest.raises(ValueError, match="min_repeats"):
        time_alternating([a], "cpu", min_repeats=2, max_repeats=1)


def test_paired_profile_keeps_the_curve_shape_when_the_machine_drifts(pair, monkeypatch):
    import sequoia_opt.profiling.latency as lat

    target, _ = pair
    true_ms = {1: 10.0, 2: 12.0, 4: 20.0}
    speed = iter([1.0, 1.0, 2.0, 1.5, 3.0, 1.0, 1.0, 2.0, 1.2])  # one factor per timed point, 3 rounds x 3 n

    def timing(ms: float) -> Timing:
        return Timing(ms, 0.9 * ms, 1.2 * ms, 5)

    def unpaired(model, n, ctx, **kw):
        return timing(true_ms[n] * next(speed))

    def paired(model, n, ref, ctx, **kw):
        f = next(speed)  # both calls of a pair see the same machine speed
        return timing(true_ms[n] * f), timing(true_ms[ref] * f)

    monkeypatch.setattr(lat, "time_forward", unpaired)
    monkeypatch.setattr(lat, "time_forward_paired", paired)
    (table,) = lat.profile_model(target, [1, 2, 4], [0], rounds=3, paired=True)
    t1, t2, t4 = (t.median_ms for t in table.timings)
    # T(1): the median of all nine 1-token timings (3 own, 6 as the reference) = 10 x median(speed factors)
    assert t1 == pytest.approx(10.0 * 1.2)
    assert (t2 / t1, t4 / t1) == (pytest.approx(1.2), pytest.approx(2.0))  # the true shape
    assert table.timings[2].p90_ms == pytest.approx(1.2 * t4) and table.timings[2].repeats == 15
    # the same drift, unpaired: every point keeps the speed it happened to be timed at
    speed = iter([1.0, 1.0, 2.0, 1.5, 3.0, 1.0, 1.0, 2.0, 1.2])
    (table,) = lat.profile_model(target, [1, 2, 4], [0], rounds=3)
    u1, u2, u4 = (t.median_ms for t in table.timings)
    assert (u1, u2, u4) == (pytest.approx(10.0), pytest.approx(24.0), pytest.approx(24.0))


def test_batch_sizes_are_timed_round_by_round_so_a_slow_spell_lands_on_each_alike(pair, monkeypatch):
    """T(b, n) at every batch size interleaved round by round (profile_batches): the editing workload's profile of
    2026-12-07, timed batch size after batch size, read T(2, 1) above T(4, 1) through the VM's drift."""
    import sequoia_opt.profiling.latency as lat
    from sequoia_opt.profiling.batch import profile_batches

    target, _ = pair
    true_ms = {(1, 1): 10.0, (1, 2): 12.0, (2, 1): 11.0, (2, 2): 14.0}  # (batch, n) -> ms on a steady machine
    log: list[int] = []  # the batch size of every timed point, in order

    def factor(rows: int) -> float:  # the first 4 timed points (of 2 batch sizes x 2 rounds x 2 n) run 1.5x slow
        log.append(rows)
        return 1.5 if len(log) <= 4 else 1.0

    def timing(ms: float) -> Timing:
        return Timing(ms, ms, ms, 3)

    def one(model, n, ctx, rows=None, **kw):
        return timing(true_ms[rows, n] * factor(rows))

    def paired(model, n, ref, ctx, rows=None, **kw):
        f = factor(rows)
        return timing(true_ms[rows, n] * f), timing(true_ms[rows, ref] * f)

    monkeypatch.setattr(lat, "time_forward", one)
    monkeypatch.setattr(lat, "time_forward_paired", paired)
    seen: list[tuple[str, int, int]] = []
    prof = profile_batches(target, None, [1, 2], [1, 2], [1], [8], target_name="t", draft_name=None,
                           profile_id="p", device=target.device, dtype=target.dtype, rounds=2, paired=True,
                           progress=lambda what, done, total: seen.append((what, done, total)))
    assert log == [1, 1, 2, 2, 1, 1, 2, 2]  # round 1 of both batch sizes, then round 2 of both
    t = {b: prof.curve(b).target_ms(1, 8) for b in (1, 2)}
    assert t[1] == pytest.approx(10.0 * 1.25) and t[2] == pytest.approx(11.0 * 1.25)  # each: one slow, one fast
    assert prof.curve(2).target_ms(2, 8) / t[2] == pytest.approx(14.0 / 11.0)
    # one progress line over both sweeps: done counts up to the sum of their points
    assert [(d, n) for _, d, n in seen] == [(i, 8) for i in range(1, 9)]
    assert seen[2][0].startswith("target (batch 2)") and "round 1/2" in seen[2][0]
    # the same drift timed batch size after batch size (profile_model per b): batch 1 slow, batch 2 fast
    log.clear()
    seq = {b: lat.profile_model(target, [1, 2], [8], rounds=2, paired=True, rows=b)[0].timings[0].median_ms
           for b in (1, 2)}
    assert seq[1] == pytest.approx(15.0) and seq[2] == pytest.approx(11.0)  # T(2, 1) / T(1, 1) 0.73, not 1.1


def test_the_loop_step_is_timed_in_the_same_rounds_as_the_forwards(pair):
    """With ``loop``, each batch size's loop step takes its turn right after that batch size's T(b, n) and c(b, w)
    in every round (a slow spell then lands on the forwards and the steps alike: the 2026-12-07 editing profile,
    its forwards all timed before its steps, read T(1, 1) 1.46x the loop's plain verify, which is the forward plus
    its logits)."""
    from sequoia_opt.profiling.batch import profile_batches

    target, draft = pair
    seen: list[str] = []
    prof = profile_batches(target, draft, [1, 2], [1, 2], [1], [8], target_name="t", draft_name="d", profile_id="p",
                           device=target.device, dtype=target.dtype, rounds=2, paired=True, loop="chain",
                           min_repeats=2, max_repeats=2, progress=lambda what, done, total: seen.append(what))
    kinds = [w.split(" forward")[0].split(",")[0] for w in seen]  # "target (batch 1)", "loop step (chain)", ...
    first_round = ["target (batch 1)"] * 2 + ["draft (batch 1)", "loop step (chain)"] \
        + ["target (batch 2)"] * 2 + ["draft (batch 2)", "loop step (chain)"]
    assert kinds[:len(first_round)] == first_round
    assert kinds[len(first_round):2 * len(first_round)] == first_round  # round 2, in the same order
    assert all(k == "loop step (chain)" for k in kinds[2 * len(first_round):])  # then only the loop's extra rounds
    assert prof.curve(1).has_loop(8) and prof.curve(2).has_loop(8)


def test_interleaved_loop_sweeps_run_a_round_each_in_turn_and_extra_rounds_too():
    """LoopSweep (time_loop a round at a time) under interleave_rounds: round r of each before round r + 1 of any;
    the extra rounds of a size not yet known interleave as well, and a sweep that is done drops out."""
    from sequoia_opt.profiling.latency import interleave_rounds
    from sequoia_opt.profiling.steps import LoopSweep

    order: list[str] = []

    class Sweep:
        def __init__(self, name: str, rounds: int):
            self.name, self.left = name, rounds

        @property
        def done(self) -> bool:
            return self.left == 0

        def run_round(self) -> None:
            order.append(self.name)
            self.left -= 1

    interleave_rounds([Sweep("a", 3), Sweep("b", 1), Sweep("c", 2)])
    assert order == ["a", "b", "c", "a", "c", "a"]
    # a LoopSweep is done after its rounds when every size is known, else after max_rounds
    sw = LoopSweep(lambda n: None, [1], 4, 50, rounds=2, max_rounds=5)
    assert not sw.done and sw.total == 2
    sw.round = 2
    assert sw.done  # only plain steps (no size to know): nothing past the base rounds
    sw = LoopSweep(lambda n: None, [1, 2], 4, 50, rounds=1, max_rounds=3)
    sw.round = 1
    assert not sw.done  # size 2 has no timed pair: not known, another round is due
    sw.round = 3
    assert sw.done


def test_the_stored_spread_is_p90_minus_p10_of_the_timed_repeats(pair, monkeypatch):
    """``target_forward_spread_ms`` is what the schema (profiles/__init__.py, docs/formats.md) says: p90 - p10 of the
    timed repeats (it said p75 - p25), with rounds the median p90 minus the median p10 over rounds."""
    import sequoia_opt.profiling.latency as lat

    target, _ = pair
    rounds = iter([Timing(6.0, 2.0, 10.0, 11), Timing(7.0, 3.0, 30.0, 11), Timing(5.0, 1.0, 12.0, 11)])
    monkeypatch.setattr(lat, "time_forward", lambda *a, **k: next(rounds))
    (table,) = lat.profile_model(target, [1], [0], rounds=3)
    curve = build_latency_profile(target_tables=[table], draft_tables=None, step_overhead_ms=0.0, device="cpu",
                                  dtype=torch.float32, target_name="t", target_config=target.config,
                                  draft_name=None, draft_config=None, random_weights=False, profile_id="x")
    cur = curve.to_dict()["curves"][0]["target"]
    assert cur["target_forward_ms"] == [6.0]  # median(6, 7, 5)
    assert cur["target_forward_spread_ms"] == [12.0 - 2.0]  # median(10, 30, 12) - median(2, 3, 1)
    from sequoia_opt.profiling.timing import _quantile

    xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 100.0]  # p10 / p90 of one point's repeats: an outlier
    assert (_quantile(xs, 0.1), _quantile(xs, 0.9)) == (pytest.approx(2.0), pytest.approx(10.0))  # stays outside


def test_profile_model_refuses_past_the_context(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="exceeds"):
        profile_model(target, [8], [target.config.max_position_embeddings])


# ------------------------------------------------------------------ acceptance
def test_measurement_tree_shape():
    t = measurement_tree(3, 2)
    assert t.size == 7 and t.level_widths == (1, 3, 3)
    assert t.children[1] == (4, 5, 6)  # the rank-0 child carries the spine


def test_draft_equal_to_target_greedy_vector_is_one_then_zeros(pair, prompt_ids):
    target, _ = pair
    c = measure_acceptance(target, target, prompt_ids[:3], width=4, depth=3, max_new_tokens=12)
    assert c.trials > 0
    np.testing.assert_array_equal(c.vector(), [1.0, 0.0, 0.0, 0.0])


def test_draft_equal_to_target_sampling_first_entry_is_one(pair, prompt_ids):
    target, _ = pair
    c = measure_acceptance(target, target, prompt_ids[:3], width=3, depth=3, temperature=1.0,
                           max_new_tokens=12, seed=1)
    v = c.vector()
    assert v[0] >= 0.99 and v.sum() <= 1.0 + 1e-12


def test_vector_entries_are_probabilities_with_exactly_k_entries(pair, prompt_ids):
    target, draft = pair
    for width in (1, 3, 5):
        c = measure_acceptance(target, draft, prompt_ids[:2], width=width, depth=2, max_new_tokens=10)
        v = c.vector()
        assert v.shape == (width,)
        assert (v >= 0).all() and (v <= 1).all() and v.sum() <= 1.0 + 1e-12
        assert c.counts.sum() == c.trials == sum(int(x.sum()) for x in c.by_depth.values())


def test_clipped_steps_near_the_context_end_record_only_real_trials(pair, prompt_ids):
    """Near the end of the context the decoder clips the measurement tree: a clipped spine node is a leaf
    that proposes nothing, so it is no trial (not a rejection). With draft == target (greedy) every trial
    accepts rank 0 and a step of depth d makes exactly d trials."""
    from sequoia_opt.model import Transformer

    target, _ = pair
    prompts = prompt_ids[:3]
    ctx = max(len(p) for p in prompts) + 6
    short = Transformer(target.config.with_(max_position_embeddings=ctx))
    short.load_state_dict(target.state_dict())
    short.eval()
    c = measure_acceptance(short, short, prompts, width=3, depth=4, max_new_tokens=6)
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting import StaticTreePolicy

    # the profiler measures the whole tree to the answer's last token: the decoder it is checked against does too
    dec = Decoder(short, StaticTreePolicy(short, measurement_tree(3, 4), cut_at_answer_end=False))
    steps = [s for p in prompts for s in dec.generate(p, 6).steps]
    assert any(s.tree_depth < 4 for s in steps)  # some steps were clipped
    assert c.steps == len(steps)
    assert c.trials == sum(s.tree_depth for s in steps)
    np.testing.assert_array_equal(c.counts, [c.trials, 0, 0, 0])  # no rejection recorded for clipped nodes
    assert set(c.by_depth) <= {1, 2, 3, 4}


def _wilson_bounds(counts):
    from sequoia_opt.profiles import AcceptanceProfile

    prof = AcceptanceProfile(id="x", acceptance=counts.vector(), counts=counts.counts)
    ci = prof.confidence_interval()
    return ci[:, 0], ci[:, 1]


def test_vector_predicts_decoder_tokens_per_step(pair, prompt_ids):
    """G(tree) from the measured vector matches the decoder's measured tokens per step (issue 4)."""
    target, draft = pair
    counts = measure_acceptance(target, draft, prompt_ids, width=4, depth=4, max_new_tokens=40)
    lo, hi = _wilson_bounds(counts)
    for tree in (Tree.chain(4), Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])):
        dec = SpeculativeDecoder(target, draft, tree)
        per_step = [s.accepted_nodes + 1 for p in prompt_ids for s in dec.generate(p, 40).steps]
        mean = float(np.mean(per_step))
        half = 1.96 * float(np.std(per_step, ddof=1)) / np.sqrt(len(per_step))
        g_lo, g_hi = tree.expected_tokens(lo), tree.expected_tokens(hi)
        assert g_lo <= g_hi
        # the prediction interval and the measurement interval overlap
        assert g_lo <= mean + half and mean - half <= g_hi, (tree.summary(), g_lo, g_hi, mean, half)
        assert tree.expected_tokens(counts.vector()) > 1.2  # the pair does speculate usefully


def test_acceptance_profile_round_trip_and_positional_check(tmp_path, pair, prompt_ids):
    target, draft = pair
    counts = measure_acceptance(target, draft, prompt_ids[:4], width=4, depth=3, max_new_tokens=30)
    prof = build_acceptance_profile(counts, profile_id="tiny_greedy", target_name="t", draft_name="d",
                                    temperature=0.0, top_p=1.0, depth=3, device="cpu", dtype="float32",
                                    prompts_file="p.jsonl", num_prompts=4, max_new_tokens=30, seed=0)
    back = load_acceptance(save_acceptance(tmp_path / "acc.yaml", prof))
    np.testing.assert_allclose(back.acceptance, counts.vector())
    assert list(back.counts) == list(counts.counts)
    assert back.measured["mode"] == "greedy" and back.measured["width"] == 4
    rows = positional_check(counts, min_trials=1)
    assert rows and all(r["trials"] >= 1 for r in rows)
    assert rows[0]["depth"] == 1


def test_positional_check_flags_a_depth_that_differs():
    c = AcceptanceCounts.empty(2)
    for _ in range(200):
        c.add_visit(0, 0)  # depth 1: always accepted
    for _ in range(200):
        c.add_visit(1, None)  # depth 2: never
    rows = positional_check(c)
    assert [r["consistent"] for r in rows] == [False, False]
    assert rows[0]["mass"] == 1.0 and rows[1]["mass"] == 0.0


def test_a_curve_timed_beside_other_load_is_named_noisy():
    """A tryout profiled on a busy 2-core VM: T(5) came out below T(1), p10-p90 74.9 ms around 85.8, and nothing
    was said. Points whose spread passes half their median are named, with what to do."""
    from sequoia_opt.profiling.latency import LatencyTable, noisy_points
    from sequoia_opt.profiling.timing import Timing

    steady = LatencyTable(128, [1, 2, 5], [Timing(92.6, 90.0, 95.0, 5), Timing(93.0, 91.0, 96.0, 5),
                                          Timing(99.0, 95.0, 104.0, 5)])
    busy = LatencyTable(128, [1, 2, 5], [Timing(92.6, 90.0, 95.0, 5), Timing(93.0, 91.0, 96.0, 5),
                                        Timing(85.8, 40.0, 114.9, 5)])
    assert noisy_points([steady]) == []
    (line,) = noisy_points([steady, busy])
    assert line.startswith("T(n) at context 128 spread widely at n = 5 (worst: T(5) 40-114.9 ms around 85.8)")
    assert noisy_points([busy], "c")[0].startswith("c(n) at context 128")


def test_a_profile_written_to_a_json_path_is_json(tmp_path):
    """A tryout's `profile latency -o lat.json` wrote YAML into the .json file (json.load refused it). Every profile
    writer now writes JSON there, read back as the YAML is."""
    import json

    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve

    curve = LatencyCurve.synthetic({1: 10.0, 2: 11.0}, {1: 1.0})
    for name in ("l.json", "l.yaml"):
        save_latency(tmp_path / name, curve)
        assert load_latency(tmp_path / name).target_ms(2) == pytest.approx(11.0)
    assert json.loads((tmp_path / "l.json").read_text())["format"] == "treeopt-latency/1"
    assert (tmp_path / "l.yaml").read_text().startswith("format: treeopt-latency/1\n")
    acc = AcceptanceProfile(id="a", acceptance=np.array([0.5, 0.2]))
    save_acceptance(tmp_path / "a.JSON", acc)
    assert json.loads((tmp_path / "a.JSON").read_text())["id"] == "a"
    assert list(load_acceptance(tmp_path / "a.JSON").acceptance) == [0.5, 0.2]


@pytest.mark.parametrize("w", [1, 3])
def test_a_one_pass_drafters_cost_is_timed_over_w_drafted_nodes(w):
    """c(w) of a drafter without a model is one proposal of w drafted nodes, what the solver charges a tree of
    w + 1 nodes: it timed a chain of w nodes, w - 1 drafted (c(1) timed a proposal of the root alone)."""
    from sequoia_opt.drafting.drafters import PromptLookupDrafter
    from sequoia_opt.profiling.latency import time_lookup_propose

    sizes = []

    class Counting(PromptLookupDrafter):
        def propose(self, state, buffers, forced_tokens=None):
            sizes.append(buffers.n)
            return super().propose(state, buffers, forced_tokens)

    target = random_model(0)
    timing = time_lookup_propose(lambda: Counting(target.config.vocab_size), target, w, 32, min_repeats=2,
                                 max_repeats=2)
    assert timing.repeats >= 2 and sizes and set(sizes) == {w + 1}
