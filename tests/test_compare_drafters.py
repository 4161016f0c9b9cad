"""Several drafters side by side: ``run_trees`` with a drafter per tree, each drafter's best tree chosen from
its own profiles (``plan_drafter``), and ``treeopt run --compare-drafters`` end to end on a tiny pair, with
profiles written by the CLI itself at its default paths."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import PROMPTS, byte_tokenizer, make_pair, noisy_copy, random_model  # noqa: E402

import sequoia_opt.jobs.load as pipeline  # noqa: E402
from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.drafting.drafters import LayerSkipDrafter, PromptLookupDrafter  # noqa: E402
from sequoia_opt.errors import ProfileError  # noqa: E402
from sequoia_opt.jobs.run import TreeEntry, answer_factor, run_trees  # noqa: E402
from sequoia_opt.jobs.compare import (check_drafter_profiles, check_plan, check_plans, check_warning,  # noqa: E402
                                      compare_drafters, drafter_rows, plan_drafter)
from sequoia_opt.jobs.load import DrafterSpec, default_acceptance_path, default_latency_path, parse_drafter_spec  # noqa: E402
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, load_acceptance, load_latency  # noqa: E402
from sequoia_opt.prompts import load_prompts  # noqa: E402
from sequoia_opt.device import device_slug  # noqa: E402
from sequoia_opt.solver import choose  # noqa: E402
from sequoia_opt.tree import Tree, save_tree  # noqa: E402

runner = CliRunner()


def error_lines(output: str) -> list[str]:
    """The output's lines less the profile loaders' warnings: the tiny profiles these tests measure on a shared
    machine may be flagged as implausible curves, which is a warning beside the one-line error, not part of it."""
    return [ln for ln in output.splitlines() if not ln.startswith("warning: ")]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


# ------------------------------------------------------------------------------------------------ run_trees
@pytest.fixture(scope="module")
def models():
    target = random_model(0)
    draft = noisy_copy(target, 0.05, 1)
    tok = byte_tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    return target, draft, prompts


def _counted(make):
    calls = []

    def factory():
        calls.append(1)
        return make()

    return factory, calls


def test_run_trees_runs_each_entry_with_its_own_drafter_as_separate_runs_do(models):
    target, draft, prompts = models
    V = target.config.vocab_size
    tree = Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0]])
    makers = {"model": lambda: draft, "lookup": lambda: PromptLookupDrafter(V),
              "self": lambda: LayerSkipDrafter(target, 1)}
    counted = {k: _counted(m) for k, m in makers.items()}
    entries = [TreeEntry(k, tree, draft=f, drafter=k) for k, (f, _) in counted.items()]
    both = run_trees(target, None, entries, prompts, max_new_tokens=20, warmup=False)
    # the run's draft is None: every decoder took its entry's drafter, one fresh drafter per decoder
    assert [len(c) for _, c in counted.values()] == [1, 1, 1]
    assert both.greedy_ok and both.settings["drafters"] == {k: k for k in makers}
    assert [s.drafter for s in both.summaries] == [None, "model", "lookup", "self"]

    def key(rows, name):
        return [(r.prompt_index, r.new_tokens, r.steps, r.tokens_per_step, r.matches_plain)
                for r in rows if r.tree == name]

    per_drafter = {}
    for name, make in makers.items():
        alone = run_trees(target, make, [TreeEntry(name, tree)], prompts, max_new_tokens=20, warmup=False)
        assert key(both.rows, name) == key(alone.rows, name)
        assert key(both.rows, "plain") == key(alone.rows, "plain")
        per_drafter[name] = [r[2] for r in key(alone.rows, name)]
    # the drafters do propose differently: a run that gave every tree one drafter could not match all three
    assert len({tuple(v) for v in per_drafter.values()}) > 1


def test_run_trees_needs_a_drafter_for_every_entry(models):
    target, draft, prompts = models
    entries = [TreeEntry("own", Tree.chain(2), draft=lambda: draft), TreeEntry("none", Tree.chain(2))]
    with pytest.raises(ValueError, match="some entries have no drafter of their own"):
        run_trees(target, None, entries, prompts, max_new_tokens=4)
    # with a run-level draft the entry without one takes it
    run = run_trees(target, draft, entries, prompts[:1], max_new_tokens=4, warmup=False)
    assert [s.tree for s in run.summaries] == ["plain", "own", "none"] and run.greedy_ok


# ------------------------------------------------------------------------------------------------ plan_drafter
def _acc(draft: str, cost_model: str, counts=(60, 20, 10, 10)) -> AcceptanceProfile:
    """An acceptance profile of ``draft`` with these counts (the last: all rejected) out of 100 trials."""
    return AcceptanceProfile.from_dict({
        "format": "treeopt-acceptance/1", "id": f"acc-{draft}",
        "measured": {"target": "t", "draft": draft, "draft_cost_model": cost_model, "mode": "greedy"},
        "acceptance": [c / sum(counts) for c in counts[:-1]], "counts": list(counts)})


def _curve(draft: str | None, cost_model: str, c: float = 2.0) -> LatencyCurve:
    curve = LatencyCurve.synthetic({n: 10.0 + 0.5 * n for n in range(1, 17)}, {w: c + 0.1 * w for w in range(1, 17)},
                                   step_overhead_ms=1.0, context=32, id=f"lat-{draft}", cost_model=cost_model)
    if draft is not None:
        curve.model["draft"] = draft
    return curve


def test_plan_drafter_is_choose_on_its_own_profiles():
    acc, curve = _acc("self:3", "per-level"), _curve("self:3", "per-level")
    plan = plan_drafter("self:3", "per-level", acc, curve, max_depth=5, max_branching=3)
    want = choose(acc.acceptance, curve, 16, 5, 3)  # default budget: the largest measured target count
    assert plan.budget == 16 and plan.context == 32
    assert plan.tree.choices() == want.tree.choices()
    assert plan.metadata.predicted_speedup == pytest.approx(want.speedup)
    assert plan.metadata.expected_tokens_per_step == pytest.approx(want.expected_tokens)
    assert plan.metadata.extra["drafter"] == "self:3" and plan.metadata.extra["draft_cost_model"] == "per-level"
    assert plan.c1_over_t1 == pytest.approx(2.1 / 10.5)
    small = plan_drafter("self:3", "per-level", acc, curve, budget=4, max_depth=5, max_branching=3)
    assert small.tree.size <= 4 and small.tree.choices() == choose(acc.acceptance, curve, 4, 5, 3).tree.choices()
    # the same vector under a one-pass curve (c(n - 1) once per step) chooses by that cost model
    one = plan_drafter("lookup:1-3", "one-pass", _acc("lookup:1-3", "one-pass"), _curve("lookup:1-3", "one-pass"),
                       max_depth=5, max_branching=3)
    assert one.tree.choices() == choose(acc.acceptance, _curve("x", "one-pass"), 16, 5, 3).tree.choices()


def test_a_check_that_turns_a_gain_into_a_loss_is_one_warning():
    plan = plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                        max_depth=5, max_branching=3)
    assert check_warning(plan) is None  # not checked
    plan.metadata.extra["solver_predicted_speedup"] = 1.33
    for checked, warned in ((1.05, False), (1.0, False), (0.945, True)):
        plan.metadata.predicted_speedup = checked
        w = check_warning(plan)
        assert (w is not None) == warned
    assert w.startswith(f"self:3: its {plan.tree.size}-node tree's step") and "predicts 0.94x (the solver said 1.33x)" in w
    assert "\n" not in w
    plan.metadata.extra["solver_predicted_speedup"] = 0.98  # a loss before the check too: the solver said so already
    assert check_warning(plan) is None


def _fake_check(monkeypatch, ratio_of):
    """check_chosen_step replaced by a step whose cost is ``ratio_of(tree size)`` plain steps of 10 ms; records the
    sizes it was asked to time."""
    import sequoia_opt.profiling.steps as steps_mod
    from sequoia_opt.profiling.steps import StepCheck

    asked: list[int] = []

    def fake(target, make_drafter, tree, context, **kw):
        asked.append(tree.size)
        return StepCheck(tree.size, 10.0, 10.0 * ratio_of(tree.size), 24, on="prompts")

    monkeypatch.setattr(steps_mod, "check_chosen_step", fake)
    return asked


def test_check_plan_keeps_the_solvers_tree_when_its_check_holds(monkeypatch):
    plan = plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                        max_depth=5, max_branching=3)
    n, g, solver = plan.tree.size, plan.metadata.expected_tokens_per_step, plan.metadata.predicted_speedup
    assert n > 2 and plan.choice.smaller  # a ladder to fall back on
    hold = g / (0.95 * solver)  # the checked speedup 5 % under the solver's: within CHECK_MISS
    asked = _fake_check(monkeypatch, lambda size: hold if size == n else 1.0)
    kept = check_plan(plan, None, None, 32, prompts=[[1, 2, 3]])
    assert kept is plan and asked == [n]  # no ladder timed
    assert kept.metadata.predicted_speedup == pytest.approx(0.95 * solver)
    assert kept.metadata.extra["solver_predicted_speedup"] == pytest.approx(solver)
    assert kept.metadata.extra["step_check"]["ratio"] == pytest.approx(hold, rel=1e-5)
    assert [r["nodes"] for r in kept.metadata.extra["checked_trees"]] == [n]
    assert "rechosen_from" not in kept.metadata.extra and check_warning(kept) is None


def test_check_plan_falls_back_to_the_smaller_tree_that_checks_fastest(monkeypatch):
    plan = plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                        max_depth=5, max_branching=3)
    n, solver = plan.tree.size, plan.metadata.predicted_speedup
    ladder = [c.size for c in plan.choice.smaller]
    assert ladder == sorted(ladder, reverse=True) and ladder[-1] == 2 and max(ladder) < n
    # the chosen tree's step costs 3 plain steps (a predicted loss), the chain of one 1.1, the rest 2.0
    asked = _fake_check(monkeypatch, lambda size: {n: 3.0, 2: 1.1}.get(size, 2.0))
    kept = check_plan(plan, None, None, 32, prompts=[[1, 2, 3]])
    assert asked == [n, *ladder]
    assert kept is not plan and kept.tree.size == 2 and list(kept.tree.level_widths) == [1, 1]
    chain = next(c for c in plan.choice.smaller if c.size == 2)
    meta = kept.metadata
    assert meta.expected_tokens_per_step == pytest.approx(chain.cost.expected_tokens)
    assert meta.predicted_speedup == pytest.approx(chain.cost.expected_tokens / 1.1)
    assert meta.extra["solver_predicted_speedup"] == pytest.approx(chain.cost.speedup)
    was = meta.extra["rechosen_from"]
    assert was["nodes"] == n and was["solver_speedup"] == pytest.approx(solver, rel=1e-5)
    assert was["checked_speedup"] == pytest.approx(plan.choice.expected_tokens / 3.0, rel=1e-5)
    assert [r["nodes"] for r in meta.extra["checked_trees"]] == [n, *ladder]
    assert meta.budget == chain.budget and meta.extra["drafter"] == "self:3"
    w = check_warning(kept)
    assert w.startswith(f"self:3: the solver's {n}-node tree") and "kept the 2-node tree" in w and "\n" not in w


def test_check_plan_falls_back_to_the_root_alone_when_every_tree_checks_below_one(monkeypatch):
    """A tryout's draft priced at 0.01 ms: every tree of the ladder checked below 1x, and the run kept the 4-node
    tree that 'checked best' (0.38x) and ran it at 0.37x. Plain decoding is 1x exactly: it is kept, and said."""
    plan = plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                        max_depth=5, max_branching=3)
    n, solver = plan.tree.size, plan.metadata.predicted_speedup
    ladder = [c.size for c in plan.choice.smaller]
    asked = _fake_check(monkeypatch, lambda size: 5.0)  # every step 5 plain steps: each tree below 1x
    kept = check_plan(plan, None, None, 32, prompts=[[1, 2, 3]])
    assert asked == [n, *ladder]
    assert kept.tree.size == 1 and kept.metadata.predicted_speedup == 1.0
    assert kept.metadata.expected_tokens_per_step == 1.0 and kept.metadata.extra["step_check"] is None
    assert kept.metadata.extra["solver_predicted_speedup"] == 1.0  # the kept tree's own: the root's
    assert kept.metadata.extra["rechosen_from"]["solver_speedup"] == pytest.approx(solver, rel=1e-5)
    assert [r["nodes"] for r in kept.metadata.extra["checked_trees"]] == [n, *ladder]
    assert "speedup_spread" not in kept.metadata.extra
    assert check_warning(kept) == (
        f"self:3: the solver's {n}-node tree ({solver:.2f}x) timed again after the choice predicted "
        f"{plan.choice.expected_tokens / 5.0:.2f}x, and every smaller tree checked "
        f"({', '.join(map(str, ladder))} nodes) below 1x too: it runs the root alone (plain decoding, 1x): the choice "
        "rode noise in the latency curve")
    # a solver's tree with no smaller tree on its ladder (a tryout read "(none nodes)")
    kept.metadata.extra["checked_trees"] = kept.metadata.extra["checked_trees"][:1]
    w = check_warning(kept)
    assert ", and no smaller tree was left to check: it runs the root alone" in w and "none" not in w


def test_check_plans_checks_each_plan_on_its_own_prompts_and_collects_the_warnings(monkeypatch):
    import sequoia_opt.profiling.steps as steps_mod
    from sequoia_opt.profiling.steps import StepCheck

    plans = [plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                          max_depth=5, max_branching=3, name=name) for name in ("first", "second")]
    n = plans[0].tree.size
    seen: list[tuple[int, object]] = []

    def fake(target, make_drafter, tree, context, *, prompts=None, **kw):
        seen.append((tree.size, prompts))
        # the first plan's chosen step costs 3 plain steps (its ladder's chain 1.1), the second's holds
        ratio = {n: 3.0, 2: 1.1}.get(tree.size, 2.0) if prompts == [[1, 2]] else 1.0
        return StepCheck(tree.size, 10.0, 10.0 * ratio, 24, on="prompts")

    monkeypatch.setattr(steps_mod, "check_chosen_step", fake)
    first, second = plans
    warnings = check_plans(plans, None, [None, None], [[[1, 2]], None])
    assert plans[0] is not first and plans[0].tree.size == 2  # replaced in place by the ladder's chain
    assert plans[1] is second and plans[1].tree.size == n
    assert seen[0] == (n, [[1, 2]]) and seen[-1] == (n, None)  # each plan on its own prompts
    assert len(warnings) == 1 and warnings[0].startswith("self:3: the solver's")
    with pytest.raises(ValueError, match="2 plans, 2 drafters and 1 prompt sets"):
        check_plans(plans, None, [None, None], [None])


def test_the_demo_says_which_predictions_were_checked(monkeypatch):
    from sequoia_opt.jobs.demo import checked_note

    plans = [plan_drafter("self:3", "per-level", _acc("self:3", "per-level"), _curve("self:3", "per-level"),
                          max_depth=5, max_branching=3, name=name) for name in ("a", "b")]
    assert checked_note(plans) is None  # nothing checked yet
    solver = plans[0].metadata.predicted_speedup
    _fake_check(monkeypatch, lambda size: 1.2)
    check_plans(plans[:1], None, [None], [None])
    note = checked_note(plans)
    assert note == ("pred. speedup of each drafter's tree is its step timed again after the choice (self:3 "
                    f"{plans[0].metadata.predicted_speedup:.2f}x, the solver said {solver:.2f}x); the baselines' and "
                    "the GPU-like tree's are read off the latency curve, unchecked")


def test_recorded_prompts_path_finds_the_shipped_set_from_another_checkout(tmp_path, monkeypatch):
    from sequoia_opt.prompts import demo_prompts_path, recorded_prompts_path

    own = tmp_path / "mine.jsonl"
    own.write_text('{"prompt": "x"}\n')
    monkeypatch.chdir(tmp_path)
    assert recorded_prompts_path(str(own)) == own
    assert recorded_prompts_path("mine.jsonl") == Path("mine.jsonl")
    # a profile written in another checkout records its path there: the shipped set of that name is used
    assert recorded_prompts_path("/elsewhere/sequoia_opt/data/prompts/profile.jsonl") == demo_prompts_path("profile")
    assert recorded_prompts_path("sequoia_opt/data/prompts/chat.jsonl") == demo_prompts_path("chat")
    assert recorded_prompts_path("/elsewhere/data/prompts/traffic.jsonl") is None  # the user's file is not here
    # a user's own file that shares a shipped set's name is theirs, not the shipped set
    assert recorded_prompts_path("/home/me/project/data/prompts/eval.jsonl") is None
    assert recorded_prompts_path(None) is None and recorded_prompts_path("") is None


@pytest.mark.parametrize("acc, curve, message", [
    (("lookup:1-3", "one-pass"), ("self:3", "per-level"), "acceptance profile 'acc-lookup:1-3' measured drafter "
     "'lookup:1-3', not 'self:3'"),
    (("self:3", "per-level"), ("self:4", "per-level"), "latency profile 'lat-self:4' timed drafter 'self:4', not "
     "'self:3'"),
    (("self:3", "one-pass"), ("self:3", "per-level"), "acceptance profile 'acc-self:3' measured a one-pass drafter"),
    (("self:3", "per-level"), ("self:3", "one-pass"), "latency profile 'lat-self:3' charges a one-pass drafter"),
    (("self:3", "per-level"), (None, "per-level"), "timed no drafter (its draft cost is recorded as 0 ms)"),
])
def test_profiles_of_another_drafter_are_refused(acc, curve, message):
    with pytest.raises(ProfileError) as err:
        check_drafter_profiles("self:3", "per-level", _acc(*acc), _curve(*curve))
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ProfileError):
        plan_drafter("self:3", "per-level", _acc(*acc), _curve(*curve))


def test_compare_drafters_one_plain_baseline_and_a_row_per_drafter(models):
    target, draft, prompts = models
    V = target.config.vocab_size
    plans = [plan_drafter("draft", "per-level", _acc("draft", "per-level"), _curve("draft", "per-level"),
                          max_depth=3, max_branching=2),
             plan_drafter("lookup:1-3", "one-pass", _acc("lookup:1-3", "one-pass", (30, 10, 60)),
                          _curve("lookup:1-3", "one-pass", 0.01), max_depth=3, max_branching=2)]
    extra = [TreeEntry("chain", Tree.chain(2))]
    cmp = compare_drafters(target, plans, [draft, lambda: PromptLookupDrafter(V)], prompts, max_new_tokens=12,
                           extra_entries=extra, draft=draft, warmup=False)
    run = cmp.run
    assert [s.tree for s in run.summaries] == ["plain", "draft", "lookup:1-3", "chain"]
    assert cmp.greedy_ok and [r.drafter for r in cmp.rows] == ["draft", "lookup:1-3"]
    for row, plan in zip(cmp.rows, plans):
        s = next(x for x in run.summaries if x.tree == plan.name)
        assert row.equals_plain is True and row.mismatches == 0
        assert (row.nodes, row.depth, row.level_widths) == (plan.tree.size, plan.tree.tree_depth,
                                                            list(plan.tree.level_widths))
        assert row.tokens_per_step == s.tokens_per_step and row.speedup == s.speedup
        # the solver's steady state over the run's generations of 12 tokens (solver.generation): a tree that can
        # emit several tokens a step overshoots the end of each
        # (exact from the file's node rates: the renewal limit N / (N + P E[O]) is close at 12 tokens, not equal)
        over = plan.metadata.extra["end_overshoot_tokens"]
        assert over > 0 and s.predicted_speedup_steady == pytest.approx(plan.choice.speedup)
        factor = s.predicted_tokens_per_step / s.predicted_tokens_per_step_steady
        assert row.predicted_speedup == s.predicted_speedup
        assert factor == pytest.approx(s.new_tokens / (s.new_tokens + len(prompts) * over), rel=0.03) and factor < 1
        # the speedup prices the steps cut at each answer's end at the cut tree's cost (depth_step_ms): cheaper
        # than whole steps, so its factor lies between the tokens/step one and 1
        assert len(plan.metadata.extra["depth_step_ms"]) == plan.tree.tree_depth + 1
        priced = answer_factor(plan.tree, plan.metadata, [12] * len(prompts), priced=True)
        assert s.predicted_speedup == pytest.approx(s.predicted_speedup_steady * priced)
        assert factor < priced < 1
    assert run.to_dict()["drafters"][1]["drafter"] == "lookup:1-3"
    assert drafter_rows(plans, run) == cmp.rows
    with pytest.raises(ValueError, match="2 drafter plans but 1 drafts"):
        compare_drafters(target, plans, [draft], prompts, max_new_tokens=4)


# ------------------------------------------------------------------------------------------------ the CLI
SPECS = ("DRAFT", "lookup", "self:1")  # DRAFT: the tiny pair's draft checkpoint


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A tiny pair and every drafter's profiles, written by ``treeopt profile`` at its default paths (in a
    working directory of its own)."""
    root = tmp_path_factory.mktemp("compare")
    target, draft, prompts = make_pair(root)
    old = os.getcwd()
    os.chdir(root)
    try:
        for spec in SPECS:
            d = str(draft) if spec == "DRAFT" else spec
            r = invoke("profile", "latency", "--target", target, "--draft", d, "--context", "16", "--max-tokens", "8",
                       "--max-draft-tokens", "8", "--max-repeats", "5", "--rounds", "1")
            assert r.exit_code == 0, r.output
            r = invoke("profile", "acceptance", "--target", target, "--draft", d, "--prompts", prompts, "-k", "3",
                       "--depth", "3", "--max-new-tokens", "16", "--num-prompts", "3")
            assert r.exit_code == 0, r.output
    finally:
        os.chdir(old)
    return root, target, draft, prompts


@pytest.fixture
def in_root(profiled, monkeypatch):
    monkeypatch.chdir(profiled[0])
    return profiled


def _paths(root: Path, spec: DrafterSpec) -> tuple[Path, Path]:
    return (root / default_acceptance_path("target", spec),
            root / default_latency_path("target", spec, device_slug("cpu")))


def test_compare_drafters_end_to_end_with_the_profiles_the_cli_wrote(in_root):
    root, target, draft, prompts = in_root
    res = root / "res"
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", draft, "--draft", "lookup", "--draft",
               "self:1", "--prompts", prompts, "--num-prompts", "3", "--max-new-tokens", "12", "--max-depth", "4",
               "--max-branching", "3", "--results-dir", res, "--json", "--no-check-step")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True and doc["settings"]["step_checks"] == {}  # the solver's trees, unchecked
    rows = doc["drafters"]
    assert [row["drafter"] for row in rows] == ["draft", "lookup:1-3", "self:1"]
    assert [row["cost_model"] for row in rows] == ["per-level", "one-pass", "per-level"]
    assert all(row["equals_plain"] is True and row["mismatches"] == 0 for row in rows)
    assert [s["tree"] for s in doc["summaries"]] == ["plain", "draft", "lookup:1-3", "self:1"]
    assert all(s["new_tokens"] == 3 * 12 for s in doc["summaries"])  # one baseline, the same prompts for all
    for row, spec in zip(rows, (pipeline.parse_drafter_spec(str(draft)), parse_drafter_spec("lookup"),
                                parse_drafter_spec("self:1"))):
        a, lat = _paths(root, spec)
        acc, curve = load_acceptance(a), load_latency(lat)
        assert acc.measured["draft"] == row["drafter"] == curve.model["draft"]
        want = choose(acc.acceptance, curve, curve.max_target_tokens(), 4, 3)  # budget default: largest measured
        assert doc["settings"]["trees"][row["tree"]] == want.tree.choices()
        assert (row["nodes"], row["level_widths"]) == (want.tree.size, list(want.tree.level_widths))
        # the solver's steady state, and over the run's 3 generations of 12 tokens (solver.generation): the row
        # is the run's (a generation that ends on EOS, or inside a step, moves it off the steady state)
        summary = next(x for x in doc["summaries"] if x["tree"] == row["tree"])
        assert summary["predicted_tokens_per_step_steady"] == pytest.approx(want.expected_tokens)
        assert row["predicted_tokens_per_step"] == summary["predicted_tokens_per_step"]
        assert summary["predicted_speedup_steady"] == pytest.approx(want.speedup)
        assert row["predicted_speedup"] == summary["predicted_speedup"]
        if row["nodes"] > 1:  # a tree that can emit more than one token a step overshoots each generation's end
            assert summary["predicted_speedup"] < summary["predicted_speedup_steady"]
        assert row["c1_over_t1"] == pytest.approx(curve.draft_ms(1) / curve.target_ms(1))
        s = next(x for x in doc["summaries"] if x["tree"] == row["tree"])
        assert row["tokens_per_step"] == s["tokens_per_step"] and row["speedup"] == s["speedup"]
        assert s["drafter"] == row["drafter"]
        assert doc["settings"]["profiles"][row["drafter"]] == {"acceptance": str(a.relative_to(root)),
                                                              "latency": str(lat.relative_to(root))}
    assert Path(doc["json"]).is_file() and json.loads(Path(doc["json"]).read_text())["drafters"] == rows
    csv_lines = Path(doc["csv"]).read_text().splitlines()
    assert len(csv_lines) == 1 + 4 * 3  # plain + three drafters, three prompts each

    # the table: one row per drafter
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", "lookup", "--draft", "self:1", "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "6", "--results-dir", res)
    assert r.exit_code == 0, r.output
    table = r.stdout[r.stdout.index("drafters side by side"):r.stdout.index("trees against plain decoding")]
    lines = [ln for ln in table.splitlines() if "lookup:1-3" in ln or "self:1" in ln]
    assert len(lines) == 2 and all(ln.rstrip().endswith("yes │") for ln in lines)
    assert "one-pass" in lines[0] and "per-level" in lines[1]
    # one prompt: its interval is over the steps, and the title says so (it said "over prompts")
    flat = " ".join(r.stdout.replace("│", " ").split())
    assert "95% CI: the measured mean's, over the steps of the one prompt" in flat and "over prompts" not in flat


def test_a_default_profile_of_another_checkpoint_of_the_same_name_is_neither_used_nor_replaced(in_root, tmp_path):
    """Profiles are filed by checkpoint name: another run's ``draft`` folder (other weights) finds the first one's
    profiles at its default paths; they record their weights, so ``run --compare-drafters`` refuses them and
    ``profile acceptance`` does not write over them (exit 2, one line, the file unchanged); a copy of the same
    weights elsewhere still uses them."""
    import shutil

    from sequoia_opt.jobs.entries import plan_drafters
    from sequoia_opt.model.hf import save_hf_checkpoint

    root, target, draft, prompts = in_root
    other = tmp_path / "run-b" / Path(draft).name
    save_hf_checkpoint(noisy_copy(random_model(0), 0.3, 7), byte_tokenizer(), other)
    a_path, _ = _paths(root, parse_drafter_spec(str(draft)))
    before = a_path.read_text()
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", other, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res")
    assert r.exit_code == 2
    flat = " ".join(r.output.split())
    assert f"the acceptance profile at {a_path.relative_to(root)} is not of drafter draft in use: its draft weights at " \
           f"{Path(draft).resolve()}" in flat and "-o PATH and pass -a PATH" in flat
    assert not (tmp_path / "res").exists()
    r = invoke("profile", "acceptance", "--target", target, "--draft", other, "--prompts", prompts, "-k", "3",
               "--depth", "3", "--max-new-tokens", "8", "--num-prompts", "1")
    assert r.exit_code == 2
    assert f"holds the profile of the draft at {Path(draft).resolve()}" in " ".join(r.output.split())
    assert a_path.read_text() == before
    copy = tmp_path / "copy" / Path(draft).name
    shutil.copytree(draft, copy)
    plans, paths = plan_drafters([parse_drafter_spec(str(copy))], None, None, target=target, device="cpu",
                                 temperature=0.0, top_p=1.0, budget=None, max_depth=4, max_branching=3)
    assert paths[0][0] == Path(a_path.relative_to(root)) and plans[0].label == "draft"


def test_compare_drafters_checks_each_chosen_step_on_its_profiles_prompts(in_root):
    from sequoia_opt.profiles import save_acceptance, save_latency

    root, target, draft, prompts = in_root
    # profiles under which lookup's best tree is more than its root (the measured ones of the tiny pair may say
    # plain decoding), recording the prompt file they were measured on, as profile acceptance does
    acc = _acc("lookup:1-3", "one-pass", counts=(80, 10, 5, 5))
    curve = _curve("lookup:1-3", "one-pass", c=0.2)
    lat = save_latency(root / "syn" / "lat.yaml", curve)
    want = choose(acc.acceptance, curve, curve.max_target_tokens(), 4, 3)
    assert want.tree.size > 2

    def run_recording(recorded: str, new_tokens: int) -> dict:
        """run --compare-drafters with the acceptance profile recording ``recorded`` as its prompts."""
        acc.measured["prompts"] = recorded
        a = save_acceptance(root / "syn" / f"acc-{len(list((root / 'syn').glob('acc-*')))}.yaml", acc)
        r = invoke("run", "--compare-drafters", "--target", target, "--draft", "lookup", "-a", a, "-l", lat,
                   "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", new_tokens, "--max-depth", "4",
                   "--max-branching", "3", "--results-dir", root / "res-checked", "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    doc = run_recording(str(prompts), 8)
    (row,) = doc["drafters"]
    c = doc["settings"]["step_checks"][row["tree"]]
    assert c["step_check"]["on"] == "prompts" and c["step_check"]["ratio"] > 0
    assert c["checked_trees"][0]["nodes"] == want.tree.size
    assert c["checked_trees"][0]["solver_speedup"] == pytest.approx(want.speedup, rel=1e-5)
    kept = max(c["checked_trees"], key=lambda t: (round(t["checked_speedup"], 6), -t["nodes"]))
    # the solver's figure of the tree kept: the chosen tree's, or the ladder tree's when a smaller one checked faster
    assert c["solver_predicted_speedup"] == pytest.approx(kept["solver_speedup"], rel=1e-5)
    if "rechosen_from" in c:
        assert c["rechosen_from"] == c["checked_trees"][0] and kept["nodes"] < want.tree.size
    assert row["nodes"] == kept["nodes"] and row["predicted_speedup"] <= kept["checked_speedup"] + 1e-9
    # the solver's tree runs unless a smaller one checked faster, and then the results say which it replaced
    assert (doc["settings"]["trees"][row["tree"]] == want.tree.choices()) == ("rechosen_from" not in c)
    n_prompts = len(load_prompts(prompts, limit=4))  # the first CHECK_PROMPTS of the profile's own prompt file
    assert f"lookup:1-3: the chosen tree's step was timed again on {n_prompts} prompts of {prompts}" in doc["notes"]

    # a profile whose prompt file is not on this machine: checked on a random context, and the note says so
    doc = run_recording("/elsewhere/traffic.jsonl", 4)
    assert doc["settings"]["step_checks"][doc["drafters"][0]["tree"]]["step_check"]["on"] != "prompts"
    assert any("timed again on a random context" in n and "/elsewhere/traffic.jsonl" in n for n in doc["notes"])

    # a recorded prompt file that is here but does not load: the same, with the reason, and the run goes on
    bad = root / "syn" / "broken.jsonl"
    bad.write_text("{not json\n")
    doc = run_recording(str(bad), 4)
    assert any("timed again on a random context" in n and f"{bad} do not load here" in n for n in doc["notes"])


@pytest.mark.parametrize("flag", ["--check-step", "--no-check-step"])
def test_check_step_without_compare_drafters_is_refused(in_root, flag):
    root, target, draft, prompts = in_root
    tree = root / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = invoke("run", "--target", target, "--draft", "lookup", "--tree", tree, "--prompts", prompts, flag,
               "--results-dir", root / "bad-check")
    assert r.exit_code == 2, r.output
    assert "--check-step/--no-check-step applies only with --compare-drafters" in r.output
    assert len(error_lines(r.output)) == 1 and not (root / "bad-check").exists()


def test_compare_drafters_explicit_profiles_pair_in_order(in_root):
    root, target, draft, prompts = in_root
    self_acc, self_lat = _paths(root, parse_drafter_spec("self:1"))
    look_acc, look_lat = _paths(root, parse_drafter_spec("lookup"))
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", "self:1", "--draft", "lookup",
               "-a", self_acc, "-a", look_acc, "-l", self_lat, "-l", look_lat, "--budget", "6", "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "6", "--results-dir", root / "res2", "--json",
               "--no-check-step")  # the solver's trees: the step check may keep the root alone on a busy machine
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [row["drafter"] for row in doc["drafters"]] == ["self:1", "lookup:1-3"]
    for row, (a, lat) in zip(doc["drafters"], ((self_acc, self_lat), (look_acc, look_lat))):
        want = choose(load_acceptance(a).acceptance, load_latency(lat), 6, 10, 8)  # -n 6, defaults -d 10 -b 8
        assert doc["settings"]["trees"][row["tree"]] == want.tree.choices() and row["nodes"] <= 6


@pytest.mark.parametrize("args, message", [
    (["--draft", "lookup", "--draft", "self:1", "-a", "SELF_ACC"],
     "pairs every --draft with one --acceptance, in order: got 2 --draft and 1 --acceptance"),
    (["--draft", "lookup", "-l", "SELF_LAT", "-l", "LOOK_LAT"],
     "pairs every --draft with one --latency, in order: got 1 --draft and 2 --latency"),
    (["--draft", "self:1", "-a", "LOOK_ACC", "-l", "SELF_LAT"],
     "measured drafter 'lookup:1-3', not 'self:1' (the drafter it is paired with)"),
    (["--draft", "self:1", "-a", "SELF_ACC", "-l", "LOOK_LAT"], "timed drafter 'lookup:1-3', not 'self:1'"),
    (["--draft", "lookup:2-4"], "no acceptance profile of drafter lookup:2-4 at "
     "profiles/target__lookup-2-4/acceptance-greedy.yaml: write it with treeopt profile acceptance --target"),
    (["--draft", "lookup:2-4", "-a", "LOOK_ACC"], "no latency profile of drafter lookup:2-4 at "),
    # an int8 run read the float32 curve profiled under the same name (a tryout): it looks for its own
    (["--draft", "lookup", "--weights", "int8"], "/target__lookup-1-3-int8-latency.yaml: write it with treeopt profile "
     "latency --target"),
    (["--draft", "lookup", "--draft", "lookup:1-3"], "each drafter runs once"),
    (["--draft", "self:2"], "L must be in 1..1"),
    ([], "mismatched tokenizers: target target (257 tokens"),  # the default drafters: the bundled draft first
    (["--draft", "lookup", "--budget", "99"], "budget 99 exceeds the largest target token count 8"),
    (["--draft", "lookup", "--tree", "TREE"], "--compare-drafters runs each drafter's own best tree, solved from its "
     "profiles: drop --tree"),
    (["--draft", "lookup", "--compare"], "--compare and --compare-drafters are separate modes"),
    (["--draft", "lookup", "--max-depth", "0"], "--max-depth must be at least 1, got 0"),
    # dynamic settings were dropped without a word (exit 0, no dynamic row)
    (["--draft", "lookup", "--dynamic", "eagle:steps=2,topk=2,budget=4"], "--compare-drafters runs each drafter's own "
     "static tree: --dynamic / --calibration run one drafter's settings with its --tree files"),
    (["--draft", "lookup", "--calibration", "TREE"], "--compare-drafters runs each drafter's own static tree"),
])
def test_compare_drafters_bad_inputs_exit_2_before_weights_load(in_root, monkeypatch, args, message):
    root, target, draft, prompts = in_root
    self_acc, self_lat = _paths(root, parse_drafter_spec("self:1"))
    look_acc, look_lat = _paths(root, parse_drafter_spec("lookup"))
    tree = root / "t.yaml"
    save_tree(tree, Tree.chain(2))
    subst = {"SELF_ACC": self_acc, "SELF_LAT": self_lat, "LOOK_ACC": look_acc, "LOOK_LAT": look_lat, "TREE": tree}

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the inputs were checked")

    monkeypatch.setattr(pipeline, "load_checkpoint", no_weights)
    res = root / "bad-res"
    r = invoke("run", "--compare-drafters", "--target", target, "--prompts", prompts, "--results-dir", res,
               *[subst.get(a, a) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(error_lines(r.output)) == 1
    assert not res.exists()
    if message.startswith("no acceptance profile"):  # the command it names profiles the run's prompts (a tryout's
        assert f"--prompts {prompts}" in " ".join(r.output.split())  # tiny model could not take the demo's)
    if "-int8-" in message:  # the command it names times the curve in the run's precision
        assert " ".join(r.output.split()).endswith("--draft lookup:1-3 --weights int8 (or pass -l PATH)")


@pytest.mark.parametrize("args, message", [
    ([], "--tree is required: the tree file(s) to run (or --compare-drafters"),
    (["--tree", "TREE", "--draft", "lookup", "--draft", "self:1"], "--draft was given 2 times: one drafter runs the "
     "--tree files; to compare drafters, each with its own best tree, add --compare-drafters"),
    (["--tree", "TREE", "--budget", "5"], "--budget limits the trees --compare-drafters solves"),
    (["--tree", "TREE", "--compare", "-a", "LOOK_ACC", "-a", "SELF_ACC"], "--compare takes one --acceptance"),
])
def test_run_without_compare_drafters_keeps_its_rules(in_root, monkeypatch, args, message):
    root, target, draft, prompts = in_root
    tree = root / "t.yaml"
    save_tree(tree, Tree.chain(2))
    subst = {"TREE": tree, "LOOK_ACC": _paths(root, parse_drafter_spec("lookup"))[0],
             "SELF_ACC": _paths(root, parse_drafter_spec("self:1"))[0]}
    monkeypatch.setattr(pipeline, "load_checkpoint", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    res = root / "bad-res"
    r = invoke("run", "--target", target, "--prompts", prompts, "--results-dir", res, *[subst.get(a, a) for a in args])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(error_lines(r.output)) == 1
    assert not res.exists()


def test_load_drafters_loads_the_target_and_a_checkpoint_once(in_root, monkeypatch):
    root, target, draft, prompts = in_root
    loaded = []
    real = pipeline.load_checkpoint

    def counting(path, **kw):
        loaded.append(Path(path).name)
        return real(path, **kw)

    monkeypatch.setattr(pipeline, "load_checkpoint", counting)
    pairs = pipeline.load_drafters(target, [str(draft), "lookup", "self:1", f"model:{draft}"], device=torch.device("cpu"),
                                   dtype=torch.float32)
    assert loaded == ["target", "draft"]
    assert [p.draft_name for p in pairs] == ["draft", "lookup:1-3", "self:1", "draft"]
    assert [p.cost_model for p in pairs] == ["per-level", "one-pass", "per-level", "per-level"]
    assert all(p.target is pairs[0].target for p in pairs) and pairs[0].draft is pairs[3].draft
    assert isinstance(pairs[1].new_drafter(), PromptLookupDrafter)
    assert isinstance(pairs[2].new_drafter(), LayerSkipDrafter) and pairs[2].new_drafter() is not pairs[2].new_drafter()
    assert np.isclose(pairs[0].vocab_size, 257)


def test_a_prompt_the_context_cannot_hold_is_refused_naming_its_file_before_any_step_check(tmp_path, monkeypatch):
    """run --compare-drafters said 'prompt 2 of 2 ...' without the file, after the step check had timed trees."""
    import sys as _sys

    _sys.path.insert(0, str(Path(__file__).parent))
    from tiny_pair import make_pair

    import sequoia_opt.profiling.steps as steps_mod

    target, draft, prompts = make_pair(tmp_path)
    lat, acc = tmp_path / "lat.yaml", tmp_path / "acc.yaml"
    for args in (["profile", "latency", "--target", target, "--draft", draft, "--context", "16", "--max-tokens", "6",
                  "--max-repeats", "3", "--rounds", "1", "-o", lat],
                 ["profile", "acceptance", "--target", target, "--draft", draft, "--prompts", prompts,
                  "--max-new-tokens", "6", "--num-prompts", "2", "-o", acc]):
        assert runner.invoke(app, [str(a) for a in args]).exit_code == 0
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "ab"}) + "\n" + json.dumps({"prompt": "x" * 700}) + "\n")
    monkeypatch.setattr(steps_mod, "check_chosen_step", lambda *a, **k: pytest.fail("a step check ran"))
    r = runner.invoke(app, [str(a) for a in ["run", "--compare-drafters", "--target", target, "--draft", draft, "-a",
                                             acc, "-l", lat, "--prompts", long, "--max-new-tokens", "8",
                                             "--results-dir", tmp_path / "res"]])
    assert r.exit_code == 2 and f"{long}:2: prompt 2 of 2 (" in " ".join(r.output.split())  # path:line


def test_a_missing_profile_of_the_bundled_head_names_it_in_the_command(tmp_path, monkeypatch):
    """--draft eagle3 (the shipped head: no path given) was left out of the command a missing profile names, as
    the bundled draft model is, so 'treeopt profile acceptance' as printed profiled the draft model instead."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["run", "--compare-drafters", "--draft", "eagle3", "--draft", "lookup"])
    assert r.exit_code == 2 and "write it with treeopt profile acceptance --draft eagle3:" in r.output, r.output
    r = runner.invoke(app, ["run", "--compare-drafters"])  # the bundled draft model: no --draft to name
    assert r.exit_code == 2 and "write it with treeopt profile acceptance (or pass -a PATH)" in r.output, r.output


def test_a_seed_at_the_top_of_its_range_runs_every_prompt(models):
    """--seed 2^64 - 1 with two prompts raised 'Overflow when unpacking long long' at the second (seed + 1): prompt
    i's seed wraps into manual_seed's range."""
    from sequoia_opt.decoding.sampling import prompt_seed
    from sequoia_opt.jobs.run import TreeEntry, run_trees

    assert (prompt_seed(2**64 - 1, 0), prompt_seed(2**64 - 1, 1), prompt_seed(-(2**63), 2)) == (2**64 - 1, 0,
                                                                                                 -(2**63) + 2)
    target, draft, prompts = models
    entry = [TreeEntry("t", Tree.from_choices([[0], [1], [0, 0]]))]
    top = run_trees(target, draft, entry, prompts[:2], max_new_tokens=6, temperature=0.8, seed=2**64 - 1,
                    warmup=False, backend="torch")
    assert [r.new_tokens for r in top.rows] == [6, 6, 6, 6]
