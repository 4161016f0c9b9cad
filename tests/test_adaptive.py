"""Adaptive static trees (``treeopt run --adapt``, issue 17): the running acceptance estimate from synthetic
visits (exact counts, window forgetting, the prior), re-solves on a synthetic shift (exact tree sizes),
greedy output equal to plain decoding while the tree is swapped between steps, and the CLI's checks."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from sequoia_opt.decoding import AutoregressiveDecoder
from sequoia_opt.drafting import AdaptiveTreeDecoder, OnlineAcceptance, SpeculativeDecoder, TreeAdapter
from sequoia_opt.drafting.policies.adaptive import (MAX_PROBE_BACKOFF, acceptance_from_hazards, hazards_from_acceptance,
                                                  visit_counts)
from sequoia_opt.decoding.sampling import NodeVisit
from sequoia_opt.errors import DecodingError, ProfileError
from sequoia_opt.model import ModelConfig, Transformer
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, save_acceptance, save_latency
from sequoia_opt.tree import Tree, TreeMetadata, save_tree

V = NodeVisit  # (depth, num_children, accepted_rank)

# T(n) = 10 + (n - 1) ms, c(w) = 1 ms, no overhead: plain decoding costs 10 ms per token
CURVE = LatencyCurve.synthetic({n: 10.0 + (n - 1) for n in range(1, 17)}, {w: 1.0 for w in range(1, 17)})


# ---------------------------------------------------------------------------------------------- the estimate
def test_visit_counts_are_conditional_trials_per_rank():
    trials, hits = visit_counts([V(0, 2, 0), V(1, 2, 1), V(2, 2, None), V(0, 5, 3), V(0, 5, None)], width=2)
    # rank 0: tried by all five, accepted once; rank 1: tried by the last four (the first accepted rank 0),
    # accepted once; ranks >= 2 are outside the vector (rank 3 accepted counts as ranks 0, 1 tried and missed)
    assert trials.tolist() == [5, 4] and hits.tolist() == [1, 1]
    # a node with one candidate never tries rank 1
    assert [x.tolist() for x in visit_counts([V(0, 1, None), V(3, 1, 0)], width=3)] == [[2, 0, 0], [1, 0, 0]]


def test_hazards_round_trip_the_positional_vector():
    p = np.array([0.5, 0.25, 0.125])
    h = hazards_from_acceptance(p)
    assert h.tolist() == [0.5, 0.5, 0.5]
    assert np.allclose(acceptance_from_hazards(h), p, rtol=0, atol=1e-15)
    # earlier ranks take all the mass: the later rank's conditional acceptance is 0, not NaN
    assert hazards_from_acceptance([1.0, 0.0]).tolist() == [1.0, 0.0]


def test_estimate_from_synthetic_visits_exact():
    est = OnlineAcceptance([0.5, 0.25], window=3, prior_weight=2)
    assert est.prior_hazards.tolist() == [0.5, 0.5]
    np.testing.assert_allclose(est.acceptance, [0.5, 0.25], atol=1e-15)  # no steps: the prior
    est.add_step([V(0, 2, 0), V(1, 2, 1), V(2, 2, None)])
    assert est.trials.tolist() == [3, 2] and est.hits.tolist() == [1, 1] and est.steps == 1
    # h_0 = (1 + 2 * 0.5) / (3 + 2) = 0.4, h_1 = (1 + 2 * 0.5) / (2 + 2) = 0.5
    np.testing.assert_allclose(est.hazards, [0.4, 0.5], atol=1e-15)
    # p_1 = 0.4, p_2 = 0.6 * 0.5 = 0.3
    np.testing.assert_allclose(est.acceptance, [0.4, 0.3], atol=1e-15)


def test_window_forgets_the_oldest_steps():
    est = OnlineAcceptance([0.5, 0.25], window=2, prior_weight=0)
    est.add_step([V(0, 2, 0)])  # A: rank 0 hit
    est.add_step([V(0, 2, None)])  # B: ranks 0, 1 missed
    est.add_step([V(0, 2, 1)])  # C: rank 0 missed, rank 1 hit; A leaves the window
    assert est.trials.tolist() == [2, 2] and est.hits.tolist() == [0, 1] and est.steps == 3
    np.testing.assert_allclose(est.acceptance, [0.0, 0.5], atol=1e-15)
    est.add_step([])  # root-only steps take their place in the window too
    est.add_step([])
    assert est.trials.tolist() == [0, 0] and est.hits.tolist() == [0, 0]
    np.testing.assert_allclose(est.acceptance, [0.5, 0.25], atol=1e-15)  # back to the prior
    est.reset()
    assert est.steps == 0 and est.trials.tolist() == [0, 0]


def test_ranks_never_tried_keep_the_prior():
    est = OnlineAcceptance([0.6, 0.2, 0.1], window=8, prior_weight=0)
    est.add_step([V(0, 2, None)])  # ranks 0 and 1 tried and rejected; rank 2 never tried
    # h = (0, 0, prior 0.1 / (1 - 0.8) = 0.5) -> p = (0, 0, 0.5)
    np.testing.assert_allclose(est.hazards, [0.0, 0.0, 0.5], atol=1e-12)
    np.testing.assert_allclose(est.acceptance, [0.0, 0.0, 0.5], atol=1e-12)


def test_estimate_is_always_a_valid_vector():
    from sequoia_opt.profiles import validate_acceptance

    rng = np.random.default_rng(0)
    est = OnlineAcceptance([0.3, 0.3, 0.3], window=5, prior_weight=0.5)
    for _ in range(40):
        visits = []
        for d in range(int(rng.integers(0, 4))):
            c = int(rng.integers(1, 6))
            r = int(rng.integers(0, c + 1))
            visits.append(V(d, c, None if r == c else r))
        est.add_step(visits)
        p = est.acceptance
        validate_acceptance(p)
        assert (p >= 0).all() and p.sum() <= 1 + 1e-12


@pytest.mark.parametrize("kw, message", [
    (dict(window=0), "window"), (dict(prior_weight=-1.0), "prior weight"), (dict(prior_weight=float("nan")), "prior"),
])
def test_estimate_refuses_bad_settings(kw, message):
    with pytest.raises(DecodingError, match=message):
        OnlineAcceptance([0.5], **kw)


# ---------------------------------------------------------------------------------------------- re-solves
def _adapter(**kw) -> TreeAdapter:
    args = dict(budget=12, max_depth=8, max_branching=4, every=4, window=4, prior_weight=0)
    args.update(kw)
    return TreeAdapter(Tree.chain(3), [0.6, 0.2, 0.1], CURVE, **args)


def test_resolve_triggers_on_a_synthetic_shift():
    ad = _adapter()
    assert ad.tree == Tree.chain(3) and ad.resolves == []
    # phase 1: every rank-0 candidate accepted (chains of 5 accepted nodes per step)
    high = [V(d, 1, 0) for d in range(5)]
    assert [ad.observe(high, 6) for _ in range(3)] == [None, None, None]  # no re-solve before step 4
    grown = ad.observe(high, 6)
    # p = (1, 0, 0): a chain is best; G = n at cost T(n) + (n - 1) c(1) = 8 + 2n ms, increasing in n, so the
    # chain as deep as the depth limit allows: 9 nodes, depth 8
    assert grown == Tree.chain(9)
    r = ad.resolves[-1]
    assert (r.step, r.generation, r.tokens, r.size, r.depth, r.changed) == (4, 0, 24, 9, 8, True)
    assert r.level_widths == (1,) * 9 and r.expected_tokens == pytest.approx(9.0)
    assert r.speedup == pytest.approx(9 / 26 * 10)  # 9 tokens per 26 ms against 1 per 10 ms
    assert r.acceptance == pytest.approx((1.0, 0.0, 0.0)) and r.solve_ms > 0
    # phase 2: every candidate of 3 rejected; the window (4 steps) forgets phase 1 by the next re-solve
    low = [V(0, 3, None)]
    assert [ad.observe(low, 1) for _ in range(3)] == [None, None, None]
    shrunk = ad.observe(low, 1)
    assert shrunk == Tree.chain(1)  # p = (0, 0, 0): nothing is ever accepted, the root alone is best
    r = ad.resolves[-1]
    assert (r.step, r.tokens, r.size, r.depth, r.changed) == (8, 28, 1, 0, True)
    assert r.expected_tokens == 1.0 and r.speedup == pytest.approx(1.0)
    # phase 3: root-only steps (no trials) fill the window: the estimate is the prior again, and so is the tree
    for _ in range(3):
        assert ad.observe([], 1) is None
    assert ad.observe([], 1) == ad.prior_choice.tree
    assert ad.resolves[-1].acceptance == pytest.approx((0.6, 0.2, 0.1))
    assert [x.size for x in ad.resolves] == [9, 1, ad.prior_choice.tree.size]
    # predicted tokens per step, step-weighted: 4 steps of chain(3) under the prior (1 + 0.6 + 0.36), 4 of
    # chain(9) (9), 4 root-only (1)
    assert ad.predicted_tokens_per_step == pytest.approx((4 * 1.96 + 4 * 9 + 4 * 1) / 12)


def test_a_resolve_that_keeps_the_tree_is_logged_unchanged():
    ad = _adapter(every=2, window=8)
    high = [V(d, 1, 0) for d in range(5)]
    ad.observe(high, 6)
    assert ad.observe(high, 6) == Tree.chain(9)
    ad.observe(high, 6)
    assert ad.observe(high, 6) is None  # same estimate, same tree
    assert [(r.step, r.changed) for r in ad.resolves] == [(2, True), (4, False)]
    doc = ad.as_dict()
    assert doc["every"] == 2 and doc["window"] == 8 and doc["steps"] == 4 and doc["tokens"] == 24
    assert doc["final_tree"] == Tree.chain(9).choices() and len(doc["resolves"]) == 2
    assert (doc["final_size"], doc["final_depth"]) == (9, 8)  # Tree.chain(n): n nodes, root included
    json.dumps(doc)  # plain JSON
    ad.reset()
    assert ad.tree == Tree.chain(3) and ad.resolves == [] and ad.steps == 0


def test_adapter_refuses_bad_settings():
    with pytest.raises(DecodingError, match="re-solve interval"):
        _adapter(every=0)
    with pytest.raises(DecodingError, match="window"):
        _adapter(window=0)
    with pytest.raises(ProfileError, match="budget 40 exceeds"):
        _adapter(budget=40)  # the curve measured up to 16 target tokens


# ---------------------------------------------------------------------------------------------- decoding
CFG = ModelConfig.preset("tiny")  # vocab 256, 512 positions


def _model(seed: int, cfg: ModelConfig = CFG) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, device="cpu", dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def target() -> Transformer:
    return _model(0)


@pytest.fixture(scope="module")
def drafts(target) -> dict[str, Transformer]:
    noisy = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * p.std())
    return {"same": target, "noisy": noisy, "random": _model(7, CFG.with_(n_layers=1))}


PROMPTS = [[1], [5, 17, 3], [200, 3, 3, 9, 41, 77], list(range(40, 52)), [7] * 490]  # the last: near the context end
NEW = 20


@pytest.mark.parametrize("draft_name, prior", [
    ("same", [0.2, 0.1]),  # everything accepted: the tree grows from a pessimistic prior
    ("noisy", [0.4, 0.2, 0.1]),
    ("random", [0.8, 0.1]),  # almost nothing accepted: the tree shrinks (to the root alone), then regrows
])
def test_adaptive_greedy_equals_plain(target, drafts, draft_name, prior):
    adapter = TreeAdapter(Tree.from_choices([[0], [1], [0, 0]]), prior, CURVE, budget=12, max_depth=6,
                          max_branching=4, every=2, window=4, prior_weight=1)
    dec = AdaptiveTreeDecoder(target, drafts[draft_name], adapter, backend="torch")
    assert dec.max_len == min(512, 4096) + 12  # room for the largest tree a re-solve may choose
    plain = AutoregressiveDecoder(target)
    sizes = set()
    for prompt in PROMPTS:  # the tree, the estimate and the step count carry over from prompt to prompt
        res = dec.generate(prompt, NEW)
        assert res.tokens == plain.generate(prompt, NEW).tokens, (draft_name, len(prompt))
        sizes |= {s.tree_size for s in res.steps}
    steps = adapter.steps
    assert len(adapter.resolves) == steps // 2 and adapter.generation == len(PROMPTS) - 1
    assert any(r.changed for r in adapter.resolves)
    assert len(sizes) > 1  # the swapped trees were really used
    if draft_name == "same":
        # every rank-0 candidate accepted, rank 1 never tried (its prior is small): the chain as deep as the
        # depth limit allows
        assert adapter.tree == Tree.chain(7)
    if draft_name == "random":
        assert 1 in sizes and adapter.resolves[-1].size >= 1
        assert any(r.size == 1 for r in adapter.resolves)
    dec.policy.restart()
    assert dec.policy.tree == adapter.initial and adapter.resolves == [] and adapter.steps == 0


def test_set_tree_checks(target, drafts):
    dec = SpeculativeDecoder(target, drafts["noisy"], Tree.chain(1))
    with pytest.raises(DecodingError, match="root-only tree"):
        dec.policy.set_tree(Tree.chain(3))
    dec = SpeculativeDecoder(target, drafts["noisy"], Tree.chain(3))
    with pytest.raises(DecodingError, match="300 children"):
        dec.policy.set_tree(Tree.from_choices([[i] for i in range(300)]))
    dec.policy.set_tree(Tree.chain(5))
    assert dec.policy.tree == Tree.chain(5) and dec.policy.buffers.n == 5 and dec.generate([1, 2], 10).tokens == \
        AutoregressiveDecoder(target).generate([1, 2], 10).tokens
    with pytest.raises(DecodingError, match="depth >= 1"):
        AdaptiveTreeDecoder(target, drafts["noisy"], TreeAdapter(Tree.chain(1), [0.5], CURVE, budget=8, max_depth=4))


def test_adaptation_time_is_charged_to_the_step(target, drafts, monkeypatch):
    adapter = TreeAdapter(Tree.chain(3), [0.5], CURVE, budget=8, max_depth=4, every=1, window=4)
    dec = AdaptiveTreeDecoder(target, drafts["noisy"], adapter, backend="torch")
    real = adapter.observe
    # the decoder's clock (decoding.stats.Clock, on time.perf_counter) moves only inside the adapter: 20 ms a call
    from sequoia_opt.decoding import stats

    now = [0.0]
    monkeypatch.setattr(stats.time, "perf_counter", lambda: now[0])

    def slow(*args):
        now[0] += 0.020
        return real(*args)

    monkeypatch.setattr(adapter, "observe", slow)
    res = dec.generate([3, 4, 5], 6)
    assert len(res.steps) >= 2
    assert [s.bookkeeping_ms for s in res.steps] == pytest.approx([20.0] * len(res.steps))
    assert all(s.draft_ms == 0.0 and s.verify_ms == 0.0 for s in res.steps)


def test_the_predicted_tokens_per_step_are_the_trees_the_steps_ran_cut_at_an_answers_end(target, drafts):
    """A step near an answer's end drafts its tree cut to what the row can still emit; the adapter predicted the
    whole tree for it (a tryout: an adaptive row that never re-solved predicted more than the same static tree)."""
    tree = Tree.chain(4)  # depth 3: G = 1 + 0.5 + 0.25 + 0.125 under the prior
    adapter = TreeAdapter(tree, [0.5], CURVE, budget=8, max_depth=4, every=1000, window=4, prior_weight=1)
    dec = AdaptiveTreeDecoder(target, drafts["same"], adapter, backend="torch")
    res = dec.generate([5, 17, 3], 10)
    # the 'same' draft is always accepted: 4 + 4 tokens, then 2 left, so the third step runs the tree cut to depth 1
    assert [s.tree_depth for s in res.steps] == [3, 3, 1] and [s.accepted_len for s in res.steps] == [4, 4, 2]
    assert adapter.resolves == [] and adapter.steps == 3
    assert adapter.predicted_tokens_per_step == pytest.approx((1.875 + 1.875 + 1.5) / 3, rel=1e-12)


def test_a_batchs_step_is_one_step_of_the_adapter(target, drafts):
    """Rows of a batch are one step: a re-solve every ``every`` decoder steps, not up to B / every of them a step
    (a tryout: 3 rows, every 2, re-solved 15 times in 17 steps, two solves in one step, the first thrown away)."""
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import AdaptiveTreePolicy

    adapter = TreeAdapter(Tree.from_choices([[0], [1], [0, 0]]), [0.4, 0.2, 0.1], CURVE, budget=12, max_depth=6,
                          max_branching=4, every=2, window=4, prior_weight=1)
    dec = Decoder(target, AdaptiveTreePolicy(drafts["noisy"], adapter), max_len=160, max_batch=3, backend="torch")
    prompts, lens = [[5, 17, 3], list(range(40, 52)), [7, 7]], [8, 16, 24]
    state = dec.start_batch(prompts, 24)
    for r, n in zip(state.rows, lens):
        r.max_new_tokens = n
    while not state.finished:
        dec.step(state)
    plain = AutoregressiveDecoder(target, max_len=160)
    assert [r.tokens for r in state.results] == [plain.generate(p, n).tokens for p, n in zip(prompts, lens)]
    steps = len(state.steps)
    assert adapter.steps == steps and [r.step for r in adapter.resolves] == list(range(2, steps + 1, 2))
    assert adapter.tokens == sum(lens)
    # each step ran the tree the resolve before it chose (or the initial tree)
    ran = [s.tree_size for s in state.steps]
    for r in adapter.resolves[:-1]:
        assert ran[r.step] <= r.size  # the step after the re-solve: its tree (cut where the rows end)


# ---------------------------------------------------------------------------------------------- CLI
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app_(), [str(a) for a in args])


def app_():
    from sequoia_opt.cli import app

    return app


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt")
    acc, lat = root / "acc.yaml", root / "lat.yaml"
    save_acceptance(acc, AcceptanceProfile(id="acc-test", acceptance=np.array([0.5, 0.2, 0.1])))
    save_latency(lat, LatencyCurve.synthetic({n: 1.0 + 0.1 * n for n in range(1, 17)}, {w: 0.3 for w in range(1, 17)},
                                             id="lat-test"))
    tree = root / "t.yaml"
    save_tree(tree, Tree.from_choices([[0], [1], [0, 0]]), TreeMetadata(budget=4, extra={"budget_limit": 10}))
    return root, acc, lat, tree


@pytest.mark.parametrize("extra, message", [
    (["--adapt", "--adapt-window", "0"], "--adapt-window must be at least 1"),
    (["--adapt", "--adapt-every", "0"], "--adapt-every must be at least 1"),
    (["--adapt", "--adapt-prior-weight", "-1"], "--adapt-prior-weight must be a number >= 0"),
    (["--no-adapt", "--adapt-window", "8"], "add --adapt"),  # with -a and -l --adapt is on unless turned off
])
def test_cli_adapt_bad_values_one_line_exit_2(profiles, tmp_path, extra, message):
    root, acc, lat, tree = profiles
    # a target that does not exist: the check comes before any model is looked for
    r = invoke("run", "--tree", tree, "-a", acc, "-l", lat, "--target", tmp_path / "no-model", *extra,
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 2, r.output
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("given, missing", [(["-a"], "--adapt needs -l, the latency profile: none given and none at "),
                                            (["-l"], "--adapt needs -a, the acceptance profile: none given and "
                                                     "none at "),
                                            ([], "--adapt needs -a, the acceptance profile")])
def test_cli_adapt_needs_both_profiles(profiles, tmp_path, given, missing, monkeypatch):
    """Not given and not at the default paths (where treeopt profile writes them): named with that path."""
    root, acc, lat, tree = profiles
    monkeypatch.chdir(tmp_path)  # no profiles/ folder here
    args = [x for opt in given for x in (opt, acc if opt == "-a" else lat)]
    r = invoke("run", "--tree", tree, "--adapt", *args, "--target", tmp_path / "no-model",
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 2 and missing in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_adapt_runs_next_to_the_static_tree(profiles, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    root, acc, lat, tree = profiles
    target, draft, prompts = make_pair(tmp_path)
    r = invoke("run", "--tree", tree, "--adapt", "-a", acc, "-l", lat, "--adapt-every", "2", "--adapt-window", "4",
               "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "2",
               "--max-new-tokens", "12", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    assert [s["tree"] for s in doc["summaries"]] == ["plain", "t", "t (adaptive)"]
    ada = doc["summaries"][2]
    assert ada["mismatches"] == 0 and ada["new_tokens"] == 2 * 12
    log = ada["adaptive"]
    assert (log["every"], log["window"], log["prior_weight"], log["budget"]) == (2, 4, 8.0, 10)
    assert log["steps"] == ada["steps"] and len(log["resolves"]) == ada["steps"] // 2
    assert all(1 <= x["size"] <= 10 and x["step"] % 2 == 0 for x in log["resolves"])
    # the largest tree it verified (the final one's size sat beside tokens/step from deeper trees before it)
    assert ada["size"] <= max([doc["summaries"][1]["size"]] + [x["size"] for x in log["resolves"]])
    # its first step verifies the initial tree whole (12 tokens of room): the row is at least that tree
    assert ada["size"] >= doc["summaries"][1]["size"] and ada["depth"] >= doc["summaries"][1]["depth"]
    assert ada["tokens_per_step"] <= ada["depth"] + 1
    assert doc["summaries"][1]["adaptive"] is None
    saved = json.loads(Path(doc["json"]).read_text())
    assert saved["summaries"][2]["adaptive"]["resolves"] == log["resolves"]  # the results file holds the log
    assert any("re-solved every 2 steps" in n for n in doc["notes"])
    # the tables: the adaptive tree in the trees table, then the re-solve log
    r = invoke("run", "--tree", tree, "--adapt", "-a", acc, "-l", lat, "--adapt-every", "2", "--target", target,
               "--draft", draft, "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "8",
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 0, r.output
    assert "t (adaptive)" in r.stdout and "re-solves of the adaptive trees" in r.stdout
    # a prior measured on another pair: the run says so (every re-solve reads it)
    other = tmp_path / "other.yaml"
    save_acceptance(other, AcceptanceProfile(id="acc-other", acceptance=np.array([0.5, 0.2, 0.1]),
                                             measured={"target": "some-70b"}))
    r = invoke("run", "--tree", tree, "--adapt", "-a", other, "-l", lat, "--target", target, "--draft", draft,
               "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res",
               "--json")
    assert r.exit_code == 0, r.output
    assert any(w.startswith("--adapt: profile 'acc-other' was measured with target 'some-70b'")
               for w in json.loads(r.stdout)["warnings"])


def test_cli_adapt_names_this_machine_one_way(profiles, tmp_path):
    """An acceptance profile that recorded the device type ('cpu', as profile acceptance wrote before) and a
    latency profile that recorded this CPU's name describe one machine: no device warning (there was:
    'measured with device cpu, but this run uses AMD EPYC ...'). A latency profile of a GPU still warns."""
    from dataclasses import replace

    from sequoia_opt.device import cpu_name

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    root, _, _, tree = profiles
    target, draft, prompts = make_pair(tmp_path)
    acc, here, gpu = tmp_path / "acc.yaml", tmp_path / "here.yaml", tmp_path / "gpu.yaml"
    save_acceptance(acc, AcceptanceProfile(id="acc-cpu", acceptance=np.array([0.5, 0.2, 0.1]),
                                           measured={"mode": "greedy", "device": "cpu"}))
    curve = LatencyCurve.synthetic({n: 1.0 + 0.1 * n for n in range(1, 17)}, {w: 0.3 for w in range(1, 17)}, id="l")
    save_latency(here, replace(curve, device={"name": cpu_name(), "dtype": "float32"}))
    save_latency(gpu, replace(curve, device={"name": "NVIDIA H200", "dtype": "float32"}))
    warnings = {}
    for lat in (here, gpu):
        r = invoke("run", "--tree", tree, "--adapt", "-a", acc, "-l", lat, "--target", target, "--draft", draft,
                   "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "2", "--results-dir",
                   tmp_path / "res", "--json")
        assert r.exit_code == 0, r.output
        warnings[lat.stem] = [w for w in json.loads(r.stdout)["warnings"] if "device" in w]
    assert warnings["here"] == []
    assert warnings["gpu"] == [f"--adapt: profile 'l' was measured with device 'NVIDIA H200', but this run uses "
                               f"{cpu_name()!r}"]


# ---------------------------------------------------------------------------------------------- the guard (issue 31)
def _guard_profile(p1: float = 0.6, prompts: int = 20, spread: float = 0.05) -> AcceptanceProfile:
    """A profile of K = 3 whose prompts' p_1 vary around ``p1`` (per-prompt counts: the guard is armed)."""
    rng = np.random.default_rng(0)
    pc = np.zeros((prompts, 1, 4), dtype=np.int64)
    for i in range(prompts):
        q = float(np.clip(p1 + rng.normal(0, spread), 0.05, 0.85))
        pc[i, 0] = rng.multinomial(40, [q, 0.1, 0.05, 0.85 - q])
    c = pc.sum(axis=(0, 1))
    return AcceptanceProfile.from_dict({
        "format": "treeopt-acceptance/1", "id": "guard", "measured": {"max_new_tokens": 8},
        "acceptance": (c[:-1] / c.sum()).tolist(), "counts": c.tolist(), "counts_by_prompt": pc.tolist()})


def _guarded(profile, **kw) -> TreeAdapter:
    args = dict(budget=12, max_depth=8, max_branching=4, every=4, window=8, prior_weight=8, min_trials=4)
    args.update(kw)
    return TreeAdapter(Tree.chain(3), profile.acceptance, CURVE, profile=profile, **args)


def test_guard_is_armed_only_by_per_prompt_counts():
    prof = _guard_profile()
    assert _guarded(prof).guarded
    assert not _guarded(prof, guard=False).guarded
    old = AcceptanceProfile(id="old", acceptance=prof.acceptance, counts=prof.counts)
    assert not _guarded(old).guarded and _guarded(old).check() is None


def test_inside_the_interval_the_resolve_is_the_usual_one():
    prof = _guard_profile()
    ad = _guarded(prof)
    # the workload of the profile: rank 0 accepted 3 times in 5 at each node
    steps = [[V(0, 1, 0), V(1, 1, 0)], [V(0, 1, None)], [V(0, 1, 0), V(1, 1, None)], [V(0, 1, 0), V(1, 1, 0)]]
    for v in steps:
        ad.observe(v, len(v) + 1)
    r = ad.resolves[-1]
    lo, hi = r.interval
    assert r.reason == "scheduled" and lo <= r.live_tokens_per_step <= hi
    assert r.acceptance == pytest.approx(tuple(ad.estimate.acceptance))  # prior + window, as without the guard


def test_a_workload_below_the_interval_falls_back_to_plain_then_probes():
    prof = _guard_profile()
    ad = _guarded(prof)
    chain3 = Tree.chain(3)
    assert ad.tree == chain3
    # nothing accepted: the live tokens per step of chain(3) is 1, below the profile's interval
    miss = [V(0, 1, None)]
    assert [ad.observe(miss, 1) for _ in range(3)] == [None] * 3
    new = ad.observe(miss, 1)
    r = ad.resolves[-1]
    assert r.reason == "left the prediction interval" and r.live_tokens_per_step == pytest.approx(1.0)
    assert r.live_tokens_per_step < r.interval[0]
    # 4 misses of 4 trials: rank 0's 95 % lower bound is 0, no tree beats plain: the root alone
    assert new == Tree.chain(1) and r.size == 1 and r.speedup == pytest.approx(1.0)
    trials = ad.estimate.trials.copy()
    # the fallback's root-only steps leave the live estimate as it is (the prior would come back otherwise)
    for _ in range(ad.window - 1):
        assert ad.observe([], 1) is None
    np.testing.assert_array_equal(ad.estimate.trials, trials)
    assert [x.reason for x in ad.resolves] == ["left the prediction interval"]
    # after a window of root-only steps: a probe block, one draft a step
    probe = ad.observe([], 1)
    assert probe == Tree.chain(2) and ad.resolves[-1].reason == "probe"
    doc = ad.as_dict()
    assert doc["guard"] is True and doc["resolves"][0]["interval"] == list(r.interval)
    json.dumps(doc)
    # the probe's block finds the traffic still below: plain again, and the next probe waits twice as long
    one_miss = [V(0, 1, None)]
    assert [ad.observe(one_miss, 1) for _ in range(ad.every - 1)] == [None] * (ad.every - 1)
    assert ad.observe(one_miss, 1) == Tree.chain(1) and ad.resolves[-1].reason == "left the prediction interval"
    waits = []
    for backoff in (2, 4, 8, 8):  # doubling, capped at MAX_PROBE_BACKOFF windows
        waits.append(_steps_until(lambda: ad.observe([], 1) is not None))
        assert ad.resolves[-1].reason == "probe"
        for _ in range(ad.every - 1):
            ad.observe(one_miss, 1)
        assert ad.observe(one_miss, 1) == Tree.chain(1)
    assert waits == [2 * ad.window, 4 * ad.window, 8 * ad.window, 8 * ad.window] and MAX_PROBE_BACKOFF == 8
    # probes that find acceptance back lead to a tree as their blocks fill the window (a probe joins the window
    # that sent the guard to plain decoding), and the wait is one window again
    hits = 0
    for _ in range(4):
        _steps_until(lambda: ad.observe([], 1) is not None)
        for _ in range(ad.every):
            ad.observe([V(0, 1, 0)], 2)
        hits += ad.every
        if ad.tree.size > 1:
            break
    assert ad.tree.size > 1 and hits <= 4 * ad.every
    _steps_until(lambda: ad.observe(one_miss, 1) == Tree.chain(1))  # below again: the first probe after this ...
    assert _steps_until(lambda: ad.observe([], 1) is not None) == ad.window  # ... waits one window


def _steps_until(done, limit: int = 1000) -> int:
    """Steps until ``done()`` (which runs one step) is true; fails rather than hangs past ``limit``."""
    for k in range(1, limit + 1):
        if done():
            return k
    pytest.fail(f"not done after {limit} steps")


def test_a_workload_that_moved_is_solved_from_the_live_lower_bounds():
    prof = _guard_profile(p1=0.3)
    ad = _guarded(prof, window=16, every=16, min_trials=8)
    # every rank-0 candidate accepted (a repetitive document): far above the profile's interval
    hit = [V(d, 1, 0) for d in range(2)]
    for _ in range(16):
        ad.observe(hit, 3)
    r = ad.resolves[-1]
    assert r.reason == "left the prediction interval" and r.live_tokens_per_step > r.interval[1]
    # solved from the Wilson lower bounds of 32 hits in 32 trials (rank 0: ~0.89), not from the profile
    assert r.acceptance[0] == pytest.approx(0.8928, abs=2e-3)
    assert r.size > 3  # a deeper chain than the profile's tree


def test_a_run_of_an_adaptive_tree_predicts_no_less_than_a_token_a_step_and_caps_nothing_at_its_final_tree(target,
                                                                                                           drafts,
                                                                                                           monkeypatch):
    """A tryout: an adaptive run whose final tree was the root alone showed its tokens/step interval as [1, 1] (capped
    at the final tree's depth + 1 while earlier steps ran a deeper tree) and a predicted 0.98 tokens/step (the tree
    file's end-of-answer figures applied to the adapter's mean over other trees)."""
    from sequoia_opt.drafting.policies import AdaptiveTreePolicy
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.tree import TreeMetadata

    tree = Tree.chain(4)
    meta = TreeMetadata(expected_tokens_per_step=1.02, extra={"end_overshoot_tokens": 2.0, "node_rates": [0.01] * 3})
    adapter = TreeAdapter(tree, [0.01, 0.01], CURVE, budget=8, max_depth=4, every=2, window=4, prior_weight=1)
    entry = TreeEntry("t (adaptive)", tree, meta, policy=lambda d, a=adapter: AdaptiveTreePolicy(d, a))
    run = run_trees(target, drafts["same"], [entry], [[5, 17, 3], [200, 3, 3, 9]], max_new_tokens=12,
                    backend="torch", warmup=False)
    s = run.summaries[1]
    assert s.adaptive is not None and s.predicted_tokens_per_step is not None and s.predicted_tokens_per_step >= 1.0
    assert s.predicted_tokens_per_step == pytest.approx(adapter.predicted_tokens_per_step)  # no file factor applied
    assert s.tps_ci95[1] >= s.tokens_per_step > 1.0  # the 'same' draft is accepted: deeper trees ran
    # and no interval past what the deepest tree it verified can emit in a step (it read 1.000 to 3.135 for depth 2)
    assert s.depth >= 4 and s.tps_ci95[1] <= s.depth + 1  # s.depth: the deepest tree a step verified
    import sequoia_opt.jobs.run as jr

    monkeypatch.setattr(jr, "_tokens_per_step_ci95", lambda per_prompt: (1.0, 99.0))  # 2 prompts: a wide interval
    wide = run_trees(target, drafts["same"], [entry], [[5, 17, 3], [200, 3, 3, 9]], max_new_tokens=12,
                     backend="torch", warmup=False).summaries[1]
    assert wide.tps_ci95 == (1.0, wide.depth + 1.0)  # it was capped at the 12 tokens asked
    from sequoia_opt.cli.run import _resolve_table

    # the note's final tree is the adapter's last, not the starting chain nor the largest verified (it said 5 nodes)
    assert (s.adaptive["final_size"], s.adaptive["final_depth"]) == (adapter.tree.size, adapter.tree.tree_depth)
    assert adapter.tree.size != tree.size
    note = _resolve_table(run)[1][0]
    assert f"(final: {adapter.tree.size} nodes, depth {adapter.tree.tree_depth}; the largest it verified: {s.size} " \
           f"nodes, depth {s.depth})" in note, note


def test_adaptive_re_solves_stop_at_a_medusa_profiles_depth(profiles, tmp_path):
    """With 3 Medusa heads the run said 're-solved ... depth 16' while every deeper tree was cut to 3 each step:
    the re-solves' depth is capped at the profile's draft_depth_limit."""
    from sequoia_opt.jobs.entries import adaptive_entries
    from sequoia_opt.jobs.run import TreeEntry
    from sequoia_opt.tree import load_tree

    root, acc, lat, tree = profiles
    limited = tmp_path / "acc.yaml"
    save_acceptance(limited, AcceptanceProfile(id="acc-heads", acceptance=np.array([0.5, 0.2, 0.1]),
                                               measured={"draft_depth_limit": 2}))
    t, meta = load_tree(tree)
    for path, depth in ((acc, 16), (limited, 2)):
        _, notes = adaptive_entries([TreeEntry("t", t, meta)], path, lat, every=8, window=32, prior_weight=8.0,
                                    budget=None, max_depth=None, max_branching=None)
        assert any(f"within budget 10, depth {depth}, branching" in n for n in notes), notes
