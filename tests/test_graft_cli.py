"""Two drafters through the CLI (issue 16) on a tiny HF-checkpoint pair: ``treeopt profile graft`` writes the
five profiles at the paths the other commands read, ``treeopt solve --pair-acceptance`` writes a grafted
``treeopt-tree/2`` tree, ``treeopt profile scheduler`` trains (or refuses, exit 1) a scheduler, and ``treeopt
run`` runs a grafted tree (with its scheduler) or ``--merge`` with greedy output equal to plain decoding and a
per-drafter table. Bad input is one line, exit 2, before any weights load; a drafter failing mid-run is one
line, exit 1, and no results file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair, other_tokenizer, random_model  # noqa: E402

import sequoia_opt.jobs.load as pipeline  # noqa: E402
from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.drafting.policies import LogisticScheduler, load_scheduler, save_scheduler  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.jobs.load import (default_acceptance_path, default_latency_path,  # noqa: E402
                                  default_pair_acceptance_path, parse_drafter_spec)
from sequoia_opt.profiles import (LatencyCurve, load_acceptance, load_latency, load_pair_acceptance,  # noqa: E402
                                  save_latency)
from sequoia_opt.device import device_slug  # noqa: E402
from sequoia_opt.tree import DrafterTree, Tree, TreeMetadata, load_drafter_tree, save_drafter_tree, save_tree  # noqa: E402

runner = CliRunner()
LIGHT, STRONG = "lookup:1-3", "draft"  # the labels of --draft lookup and the tiny pair's draft/ checkpoint
# a grafted plan: the light's spine [0] [0, 0] and sibling [1]; the strong grafts [2] (with its child [2, 0])
# at the root and [0, 1] next to the light's [0, 0]
PLAN = Tree.from_choices([[0], [1], [2], [0, 0], [0, 1], [2, 0]])
STRONG_NODES = {(2,), (0, 1), (2, 0)}
LABELS = [0] + [int(tuple(c) in STRONG_NODES) for c in PLAN.choices()]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_line_error(r, code: int, message: str) -> None:
    assert r.exit_code == code, r.output
    assert message in r.output, r.output
    # a warning line beside the error is the loaders' implausible-curve note on the tiny profiles this file measures
    # on a shared machine (timing noise), not part of the error
    errors = [ln for ln in r.output.splitlines() if not ln.startswith("warning: ")]
    assert len(errors) == 1 and r.output.endswith("\n") and "Traceback" not in r.output, r.output


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The tiny pair, ``profile graft`` run once (light: prompt lookup, strong: the draft checkpoint) in a
    working directory of its own, a grafted plan naming the two drafters, and light latency curves that make
    the scheduler's classes known in advance."""
    root = tmp_path_factory.mktemp("graft")
    target, draft, prompts = make_pair(root)
    old = os.getcwd()
    os.chdir(root)
    try:
        r = invoke("profile", "graft", "--target", target, "--draft", "lookup", "--draft", draft, "--prompts", prompts,
                   "--num-prompts", "3", "--max-new-tokens", "16", "-k", "3", "-A", "1", "-B", "2", "--depth", "3",
                   "--max-tokens", "16", "--context", "16", "--rounds", "1", "--max-repeats", "3", "--json")
    finally:
        os.chdir(old)
    plan = root / "plan.yaml"
    save_drafter_tree(plan, DrafterTree(PLAN, LABELS, (LIGHT, STRONG)), TreeMetadata(
        expected_tokens_per_step=2.0, extra={"light_part_expected_tokens_per_step": 1.5}))

    def light_curve(name: str, target_ms: dict[int, float]) -> Path:
        curve = LatencyCurve.synthetic(target_ms, {w: 0.01 for w in (1, 16)}, step_overhead_ms=1.0, context=16,
                                       id=name, cost_model="one-pass")
        curve.model["draft"] = LIGHT
        return save_latency(root / f"{name}.yaml", curve)

    # a device whose target forward takes 10 s: the strong drafter's call costs next to nothing, so it pays
    # exactly on the steps where it adds an accepted node (and not where it adds none): two classes
    slow = light_curve("slow-target", {1: 10_000.0, 16: 10_001.0})
    # a target whose forward jumps past the light-only tree's 4 nodes: the full tree never pays (one class)
    steep = light_curve("steep-target", {1: 1.0, 4: 1.0, 8: 100_000.0, 16: 200_000.0})
    return {"root": root, "target": target, "draft": draft, "prompts": prompts, "profile": r, "plan": plan,
            "slow": slow, "steep": steep}


def _files(env) -> dict[str, Path]:
    light, strong = parse_drafter_spec("lookup"), parse_drafter_spec(str(env["draft"]))
    slug = device_slug("cpu")
    return {"light_latency": default_latency_path("target", light, slug),
            "strong_latency": default_latency_path("target", strong, slug),
            "light_acceptance": default_acceptance_path("target", light),
            "strong_acceptance": default_acceptance_path("target", strong),
            "pair_acceptance": default_pair_acceptance_path("target", light, strong)}


@pytest.fixture
def no_weights(monkeypatch):
    """Any checkpoint load fails the test: the input must be refused before weights load (so before any
    forward)."""
    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the inputs were checked")

    monkeypatch.setattr(pipeline, "load_checkpoint", refuse)


# ------------------------------------------------------------------------------------------------ profile graft
def test_profile_graft_writes_five_profiles_where_the_other_commands_read_them(env):
    r = env["profile"]
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    files = _files(env)
    assert files["pair_acceptance"] == Path("profiles/target__lookup-1-3+draft/acceptance-pair-greedy.yaml")
    assert doc["files"] == {k: str(v) for k, v in files.items()}
    # the scheduler's next command trains on the prompts just profiled (it named none: the demo's)
    assert f"--prompts {env['prompts']} --num-prompts 3" in doc["next"][1]
    root = env["root"]
    for role, label, cost_model in (("light", LIGHT, "one-pass"), ("strong", STRONG, "per-level")):
        curve = load_latency(root / files[f"{role}_latency"])
        assert curve.model["draft"] == label and curve.cost_model == cost_model
        assert curve.max_target_tokens() == 16 and curve.contexts[0] == 16
        acc = load_acceptance(root / files[f"{role}_acceptance"])
        assert acc.measured["draft"] == label and acc.measured["draft_cost_model"] == cost_model
        assert acc.width == 3 and acc.num_samples > 0
    pair = load_pair_acceptance(root / files["pair_acceptance"])
    assert pair.drafters == (LIGHT, STRONG) and pair.cost_models == ("one-pass", "per-level")
    assert (pair.light_width, pair.strong_width) == (1, 2) and max(pair.counts_by_depth) <= 3
    # the summary carries the conditional vector (light 0, strong 0, strong 1, none per depth row)
    rows = doc["conditional"]
    assert rows and set(rows[0]) == {"depth", "trials", "light 0", "strong 0", "strong 1", "none"}
    assert sum(rows[0][k] for k in ("light 0", "strong 0", "strong 1", "none")) == pytest.approx(1.0)
    assert [d["drafter"] for d in doc["drafters"]] == [LIGHT, STRONG]


def test_run_compare_drafters_finds_the_profiles_profile_graft_wrote(env, tmp_path, monkeypatch):
    monkeypatch.chdir(env["root"])
    r = invoke("run", "--compare-drafters", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"],
               "--prompts", env["prompts"], "--num-prompts", "1", "--max-new-tokens", "6", "--max-depth", "3",
               "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    f = _files(env)
    assert doc["settings"]["profiles"] == {
        LIGHT: {"acceptance": str(f["light_acceptance"]), "latency": str(f["light_latency"])},
        STRONG: {"acceptance": str(f["strong_acceptance"]), "latency": str(f["strong_latency"])}}


def test_profile_graft_writes_nothing_when_a_write_or_a_measurement_fails(env, tmp_path, monkeypatch):
    import sequoia_opt.jobs.graft as grafting
    import sequoia_opt.profiles as profiles
    from sequoia_opt.errors import DecodingError, OutputError
    from sequoia_opt.jobs.graft import GraftProfiles

    root, files = env["root"], _files(env)
    measured = GraftProfiles(
        LIGHT, STRONG, "one-pass", "per-level", load_latency(root / files["light_latency"]),
        load_latency(root / files["strong_latency"]), load_acceptance(root / files["light_acceptance"]),
        load_acceptance(root / files["strong_acceptance"]), load_pair_acceptance(root / files["pair_acceptance"]))
    monkeypatch.setattr(grafting, "profile_graft", lambda *a, **k: measured)  # the measurements, instantly

    def full_disk(path, profile):
        raise OutputError(f"cannot write {path}: no space left on device")

    monkeypatch.setattr(profiles, "save_pair_acceptance", full_disk)  # the fifth and last file
    out = tmp_path / "out"
    args = ["profile", "graft", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--prompts",
            env["prompts"], "--num-prompts", "1", "--out-dir", out]
    _one_line_error(invoke(*args), 2, "no space left on device")
    assert not [p for p in out.rglob("*") if p.is_file()]  # the four written before it were removed

    def broken(*a, **k):
        raise DecodingError("prompt 0 (40 tokens): does not fit the target's context")

    monkeypatch.setattr(grafting, "profile_graft", broken)
    _one_line_error(invoke(*args), 2, "does not fit the target's context")
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


def test_profile_graft_bad_drafters_exit_2_before_weights_load(env, tmp_path, no_weights):
    other = tmp_path / "other"  # another tokenizer (a padded embedding alone is fitted: test_padded_vocab.py)
    save_hf_checkpoint(random_model(3), other_tokenizer(), other)
    base = ["profile", "graft", "--target", env["target"], "--prompts", env["prompts"], "--out-dir", tmp_path / "p"]
    _one_line_error(invoke(*base, "--draft", "lookup"), 2, "takes exactly two --draft, the light drafter then the "
                    "strong one (got 1)")
    _one_line_error(invoke(*base, "--draft", "lookup", "--draft", "lookup:1-3"), 2, "is given twice")
    _one_line_error(invoke(*base, "--draft", env["draft"], "--draft", other), 2,
                    "mismatched tokenizers: target target (257 tokens")
    assert not (tmp_path / "p").exists()


# ------------------------------------------------------------------------------------------------ solve
def test_solve_writes_a_grafted_tree_with_the_baselines(env, tmp_path, monkeypatch):
    monkeypatch.chdir(env["root"])
    f = _files(env)
    out = tmp_path / "graft.yaml"
    r = invoke("solve", "--pair-acceptance", f["pair_acceptance"], "-a", f["light_acceptance"], "-a",
               f["strong_acceptance"], "-l", f["light_latency"], "-l", f["strong_latency"], "--max-depth", "3",
               "-o", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    dtree, meta = load_drafter_tree(out)
    assert dtree.names == (LIGHT, STRONG) and out.read_text().startswith("format: treeopt-tree/2")
    assert meta.extra["pair_acceptance_profile"] == load_pair_acceptance(f["pair_acceptance"]).id
    assert meta.extra["drafters"] == [LIGHT, STRONG] and meta.extra["budget_limit"] == 16  # the curves' largest
    assert meta.expected_tokens_per_step == pytest.approx(doc["choice"]["expected_tokens_per_step"])
    assert meta.predicted_speedup == pytest.approx(doc["choice"]["speedup"])
    assert doc["choice"]["plan"] in ("graft", "light only", "strong only") and dtree.size <= 16
    assert [b["name"] for b in doc["baselines"]] == ["light alone", "strong alone", "specinfer merge"]
    # the weights its profiles measured (lookup has none): run compares them with the checkpoints it loads
    from sequoia_opt.jobs.load import weights_record, parse_drafter_spec

    pw = meta.extra["profiled_weights"]
    assert set(pw) == {"target", "strong"}
    assert pw == {"target": weights_record(Path(env["target"]), None)["target"],
                  "strong": weights_record(Path(env["target"]), parse_drafter_spec(env["draft"]))["draft"]}
    meta.extra["profiled_weights"]["strong"]["fingerprint"] = "another-checkpoint"
    save_drafter_tree(tmp_path / "other.yaml", dtree, meta)
    # the sampling settings its profiles were measured at (a grafted tree recorded none: run never warned)
    assert (meta.extra["profiled_temperature"], meta.extra["profiled_top_p"]) == (0.0, 1.0)
    r = invoke("run", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--tree",
               tmp_path / "other.yaml", "--prompts", env["prompts"], "--num-prompts", "1", "--max-new-tokens", "4",
               "--results-dir", tmp_path / "res", "--temperature", "0.7", "--json")
    assert r.exit_code == 0, r.output
    said = [w for w in json.loads(r.stdout)["warnings"] if "other weights" in w]
    assert len(said) == 1 and "its strong drafter weights (fingerprint another-checkpoint)" in said[0], said
    assert any("measured with temperature 0.0, but this run uses 0.7" in w for w in json.loads(r.stdout)["warnings"])
    note = next(n for n in doc["notes"] if n.startswith(("grafting pays here", "grafting does not pay")))
    # what the tree written holds, as it is (a root-only tree was called "that drafter's nodes alone")
    assert note.startswith("grafting pays here") == (doc["choice"]["plan"] == "graft")
    assert ("the root alone: plain decoding" in note) == (dtree.size == 1 and doc["choice"]["plan"] != "graft")
    # the table: the chosen tree and the three baselines
    r = invoke("solve", "--pair-acceptance", f["pair_acceptance"], "-a", f["light_acceptance"], "-a",
               f["strong_acceptance"], "-l", f["light_latency"], "-l", f["strong_latency"], "--max-depth", "3")
    assert r.exit_code == 0, r.output
    table = r.stdout[r.stdout.index("grafted tree against the baselines"):]
    assert all(name in table for name in ("chosen", "light alone", "strong alone", "specinfer merge"))


def test_the_advice_for_a_tree_deeper_than_the_pair_rows_names_what_is_missing(env, monkeypatch):
    """After `profile graft --depth 3` on 2 prompts solve said 'measured to depth 1 ... profile a deeper spine':
    the spines had reached depth 3, with too few trials for rows of their own there."""
    import dataclasses

    import numpy as np

    from sequoia_opt.cli.solve import deeper_measurement_advice

    monkeypatch.chdir(env["root"])
    measured = load_pair_acceptance(_files(env)["pair_acceptance"])
    n = measured.light_width + measured.strong_width + 1
    sparse = dataclasses.replace(measured, counts_by_depth={1: np.full(n, 40), 2: np.full(n, 2), 3: np.full(n, 1)})
    assert sparse.depth_counts().shape[0] == 2  # depth 1 its own row; 2 and 3 pooled
    assert deeper_measurement_advice(sparse, 3) == (
        "more trials per depth (treeopt profile graft --num-prompts / --max-new-tokens: a depth keeps its own row "
        "from 30 trials; the spines reached depth 3)")
    assert deeper_measurement_advice(sparse, 4) == "a deeper spine (treeopt profile graft --depth)"


@pytest.mark.parametrize("plan", ["graft", "merge"])
def test_solve_plan_writes_a_tree_holding_both_drafters(env, tmp_path, monkeypatch, plan):
    """--plan graft / merge: the tree a scheduler needs (both drafters' nodes), whatever wins called every step.
    The pair profile is the measured one with its counts rewritten so that the strong drafter's first grafted
    candidate is accepted at 40 % of the trials (the tiny pair's own strong drafter adds nothing)."""
    import dataclasses

    import numpy as np

    from sequoia_opt.jobs.compare import plan_drafter
    from sequoia_opt.profiles import load_acceptance, load_latency, save_pair_acceptance

    monkeypatch.chdir(env["root"])
    f = _files(env)
    measured = load_pair_acceptance(f["pair_acceptance"])
    A, B = measured.light_width, measured.strong_width
    counts = {d: np.array([30] * A + [40] + [0] * (B - 1) + [30]) for d in (1, 2, 3)}
    pair_file = tmp_path / "pair.yaml"
    save_pair_acceptance(pair_file, dataclasses.replace(measured, counts_by_depth=counts))
    out = tmp_path / "graft.yaml"
    r = invoke("solve", "--pair-acceptance", pair_file, "-a", f["light_acceptance"], "-a", f["strong_acceptance"],
               "-l", f["light_latency"], "-l", f["strong_latency"], "--max-depth", "3", "--plan", plan, "-o", out,
               "--json")
    if plan == "merge":  # the merge is scored only when the light tree's root has the A children the pair measured
        la, sa = load_acceptance(f["light_acceptance"]), load_acceptance(f["strong_acceptance"])
        ll, sl = load_latency(f["light_latency"]), load_latency(f["strong_latency"])
        lt = plan_drafter(LIGHT, "one-pass", la, ll, budget=16, max_depth=3).tree
        st = plan_drafter(STRONG, "per-level", sa, sl, budget=16, max_depth=3).tree
        if not (lt.tree_depth and st.tree_depth and len(lt.children[0]) == A):
            assert r.exit_code == 2 and "no tree holding both drafters' nodes" in r.stderr and not out.exists()
            return
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    dtree, meta = load_drafter_tree(out)
    assert set(dtree.drafter[1:]) == {0, 1}  # both drafters' nodes
    assert doc["choice"]["plan"] == f"{plan} (--plan)" and meta.extra["graft_plan"] == plan
    assert meta.expected_tokens_per_step == pytest.approx(doc["choice"]["expected_tokens_per_step"])
    assert meta.expected_tokens_per_step > 1.0
    assert any(n.startswith(f"--plan {plan}:") for n in doc["notes"])


def test_solve_plan_needs_pair_acceptance(env, monkeypatch):
    monkeypatch.chdir(env["root"])
    f = _files(env)
    r = invoke("solve", "-a", f["light_acceptance"], "--plan", "graft")
    assert r.exit_code == 2 and "add --pair-acceptance" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--pair-acceptance", "PAIR", "-a", "SACC", "-a", "LACC", "-l", "LLAT", "-l", "SLAT"],
     "measured drafter 'draft', not 'lookup:1-3'"),
    (["--pair-acceptance", "PAIR", "-a", "LACC", "-a", "SACC", "-l", "SLAT", "-l", "LLAT"],
     "timed drafter 'draft', not 'lookup:1-3'"),
    (["--pair-acceptance", "PAIR", "-a", "LACC", "-l", "LLAT"], "pass two -a and two -l, the light drafter's then "
     "the strong one's (got 1 -a and 1 -l)"),
    (["-a", "LACC", "-a", "SACC", "-l", "LLAT"], "--acceptance was given 2 times"),
    (["--pair-acceptance", "PAIR", "-a", "LACC", "-a", "SACC", "-l", "LLAT", "-l", "SLAT", "--format", "vllm"],
     "treeopt-tree/2 YAML only"),
    (["--pair-acceptance", "PAIR", "-a", "LACC", "-a", "SACC", "-l", "LLAT", "-l", "SLAT", "--budget", "64"],
     "budget 64 exceeds the largest target token count 16"),
])
def test_solve_refuses_mismatched_profiles(env, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(env["root"])
    f = _files(env)
    subst = {"PAIR": f["pair_acceptance"], "LACC": f["light_acceptance"], "SACC": f["strong_acceptance"],
             "LLAT": f["light_latency"], "SLAT": f["strong_latency"]}
    out = tmp_path / "graft.yaml"
    r = invoke("solve", *[subst.get(a, a) for a in args], "-o", out)
    assert r.exit_code == 2, r.output
    # one error line; the fixture's profiles are timed for real (one round on a tiny model), so a noisy draft
    # curve may add the loader's "implausible draft curve" warning line, which is the tool doing its job
    errors = [ln for ln in r.stderr.strip().splitlines() if not ln.startswith("warning:")]
    assert len(errors) == 1 and message in errors[0], r.output
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ scheduler
def test_profile_scheduler_trains_and_run_uses_it(env, tmp_path, monkeypatch):
    monkeypatch.chdir(env["root"])
    r = invoke("profile", "scheduler", "--target", env["target"], "--tree", env["plan"], "--draft", "lookup",
               "--draft", env["draft"], "-l", env["slow"], "--prompts", env["prompts"], "--num-prompts", "6",
               "--max-new-tokens", "24", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    out = Path("profiles/target__lookup-1-3+draft/scheduler-greedy.yaml")  # the pair profile's folder
    assert doc["output"] == str(out)
    sched = load_scheduler(out, pair={"target": "target", "light": LIGHT, "strong": STRONG})
    assert sched.card["samples"] == doc["samples"] >= 20 and sched.card["latency_profile"] == "slow-target"
    assert 0 < sched.card["predicted"]["call_rate"] <= 1
    assert sched.card["predicted"]["tree_choices"] == PLAN.choices()

    # the grafted tree with that scheduler: greedy output equals plain decoding, a row per drafter
    res = tmp_path / "res"
    r = invoke("run", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--tree", env["plan"],
               "--scheduler", out, "--prompts", env["prompts"], "--num-prompts", "2", "--max-new-tokens", "16",
               "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True and [s["mismatches"] for s in doc["summaries"]] == [0, 0]
    s = doc["summaries"][1]
    assert s["tree"] == "plan (scheduled)" and s["size"] == PLAN.size
    # the card's steady state; for 16-token answers, less (a chain of the plan's depth stands for its steps)
    assert s["predicted_tokens_per_step_steady"] == pytest.approx(sched.card["predicted"]["tokens_per_step"])
    assert 1.0 <= s["predicted_tokens_per_step"] < s["predicted_tokens_per_step_steady"]
    assert [d["name"] for d in s["drafters"]] == [LIGHT, STRONG]
    assert [row["drafter"] for row in doc["per_drafter"]] == [LIGHT, STRONG]
    light, strong = doc["per_drafter"]
    # the light drafter runs every step but a root-only one (the last of an answer with one token left)
    assert s["steps"] - 2 <= light["calls"] <= s["steps"] and light["call rate"] == 1.0
    assert 0 <= strong["calls"] <= s["steps"] and strong["accepted nodes"] >= 0
    assert doc["settings"]["multi_drafter"]["scheduler"] == str(out)
    assert json.loads(Path(doc["json"]).read_text())["summaries"][1]["drafters"] == s["drafters"]

    # sampling: the same tree and scheduler run (exactness under sampling is tests/test_graft_policy.py's)
    r = invoke("run", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--tree", env["plan"],
               "--scheduler", out, "--prompts", env["prompts"], "--num-prompts", "1", "--max-new-tokens", "8",
               "--temperature", "0.8", "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is None and doc["settings"]["temperature"] == 0.8
    assert [row["drafter"] for row in doc["per_drafter"]] == [LIGHT, STRONG]


def test_profile_scheduler_exits_1_when_the_strong_drafter_never_pays(env, tmp_path):
    out = tmp_path / "sched.yaml"
    r = invoke("profile", "scheduler", "--target", env["target"], "--tree", env["plan"], "--draft", "lookup",
               "--draft", env["draft"], "-l", env["steep"], "--prompts", env["prompts"], "--num-prompts", "3",
               "--max-new-tokens", "16", "-o", out)
    assert r.exit_code == 1, r.output
    assert "pays at no step" in r.stderr and "ship the 'never' scheduler" in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]  # after one progress line
    assert len(errors) == 1 and errors[0].endswith("(no scheduler was written)") and "Traceback" not in r.output
    assert not out.exists()


def test_profile_scheduler_refuses_the_strong_drafters_latency_profile(env, tmp_path, no_weights, monkeypatch):
    monkeypatch.chdir(env["root"])
    _one_line_error(invoke("profile", "scheduler", "--target", env["target"], "--tree", env["plan"], "--draft",
                           "lookup", "--draft", env["draft"], "-l", _files(env)["strong_latency"], "-o",
                           tmp_path / "s.yaml"), 2, "timed drafter 'draft', not the light drafter 'lookup:1-3'")


# ------------------------------------------------------------------------------------------------ run
def test_run_merge_runs_each_drafters_own_tree_merged(env, tmp_path):
    light_tree, strong_tree = tmp_path / "light.yaml", tmp_path / "strong.yaml"
    save_tree(light_tree, Tree.chain(3), TreeMetadata(extra={"profiled_draft": LIGHT}))
    save_tree(strong_tree, Tree.from_choices([[0], [1], [0, 0]]), TreeMetadata(extra={"profiled_draft": STRONG}))
    r = invoke("run", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--merge", "--tree",
               light_tree, "--tree", strong_tree, "--prompts", env["prompts"], "--num-prompts", "1",
               "--max-new-tokens", "12", "--results-dir", tmp_path / "res")
    assert r.exit_code == 0, r.output
    trees = r.stdout[r.stdout.index("trees against plain decoding"):r.stdout.index("drafters of each tree")]
    assert "specinfer merge" in trees and trees.rstrip().splitlines()[-2].rstrip().endswith("yes │")
    per = r.stdout[r.stdout.index("drafters of each tree"):]
    assert LIGHT in per and STRONG in per
    assert "warning" not in r.output  # each tree was solved for the drafter it is paired with


def _bad_trees(env, tmp_path) -> dict[str, Path]:
    out = {}
    out["other_names"] = save_drafter_tree(tmp_path / "other.yaml", DrafterTree(PLAN, LABELS, (LIGHT, "self:1")))
    out["swapped"] = save_drafter_tree(tmp_path / "swapped.yaml", DrafterTree(PLAN, LABELS, (STRONG, LIGHT)))
    # node [1, 0] is the light drafter's, under the strong drafter's [1]
    under = Tree.from_choices([[0], [1], [1, 0]])
    out["light_under_strong"] = save_drafter_tree(tmp_path / "under.yaml", DrafterTree(under, (0, 0, 1, 0),
                                                                                      (LIGHT, STRONG)))
    out["vocab"] = save_drafter_tree(tmp_path / "vocab.yaml", DrafterTree(PLAN, LABELS, (STRONG, "other")))
    out["one"] = save_tree(tmp_path / "one.yaml", Tree.chain(3))
    sched = LogisticScheduler([1.0, 0.0, 0.0, 0.0], 0.0, pair={"target": "target", "light": LIGHT,
                                                               "strong": "smollm2-360m"})
    out["sched"] = save_scheduler(tmp_path / "sched.yaml", sched)
    other = tmp_path / "other"
    save_hf_checkpoint(random_model(3), other_tokenizer(), other)
    out["other_ckpt"] = other
    return out


@pytest.mark.parametrize("args, message", [
    (["--draft", "DRAFT", "--draft", "OTHER_CKPT", "--tree", "VOCAB"],
     "mismatched tokenizers: target target (257 tokens"),
    (["--draft", "lookup", "--draft", "DRAFT", "--tree", "PLAN", "--scheduler", "SCHED"],
     "was trained for strong 'smollm2-360m', not 'draft'"),
    (["--draft", "lookup", "--draft", "DRAFT", "--tree", "OTHER_NAMES"],
     "was solved for light 'lookup:1-3' and strong 'self:1', but --draft gives 'lookup:1-3' then 'draft'"),
    (["--draft", "lookup", "--draft", "DRAFT", "--tree", "SWAPPED"],
     "was solved for light 'draft' and strong 'lookup:1-3'"),
    (["--draft", "lookup", "--draft", "DRAFT", "--tree", "LIGHT_UNDER_STRONG"],
     "is a light node under a strong node"),
    (["--draft", "lookup", "--draft", "DRAFT", "--merge", "--tree", "ONE"],
     "--merge runs one --tree per --draft, in order: got 2 --draft and 1 --tree"),
    (["--draft", "lookup", "--draft", "DRAFT", "--merge", "--tree", "ONE", "--tree", "PLAN"],
     "--merge takes each drafter's own tree (treeopt-tree/1)"),
    (["--draft", "lookup", "--draft", "DRAFT", "--tree", "ONE"],
     "--draft was given 2 times: one drafter runs the --tree files; to compare drafters, each with its own best "
     "tree, add --compare-drafters; to run two drafters in one tree, give a treeopt-tree/2 tree naming them"),
    (["--draft", "lookup", "--tree", "PLAN"], "names 2 drafters (lookup:1-3, draft): run it with one --draft per "
     "drafter"),
    (["--draft", "lookup", "--tree", "ONE", "--scheduler", "SCHED"], "--scheduler decides when a grafted tree"),
])
def test_run_bad_multi_drafter_input_exits_2_before_weights_load(env, tmp_path, no_weights, args, message):
    bad = _bad_trees(env, tmp_path)
    subst = {"DRAFT": env["draft"], "PLAN": env["plan"], **{k.upper(): v for k, v in bad.items()}}
    res = tmp_path / "res"
    r = invoke("run", "--target", env["target"], "--prompts", env["prompts"], "--results-dir", res,
               *[subst.get(a, a) for a in args])
    _one_line_error(r, 2, message)
    assert not res.exists()


@pytest.mark.parametrize("content, message", [
    (None, "cannot read tree file"),
    ("", "the file is empty"),
    ("format: treeopt-tree/2\ndrafters: [a\n", "not valid YAML (line 3, column 1: "),
    ("format: treeopt-tree/2\ndrafters: [lookup:1-3, draft]\nnodes:\n  - {parent: -1, rank: 0}\n"
     "  - {parent: 0, rank: 0, drafter: 7}\n", "node 1: drafter index 7 is out of range"),
])
@pytest.mark.parametrize("drafts", [1, 2])
def test_run_reports_a_missing_or_broken_tree_file_not_the_draft_count(env, tmp_path, no_weights, content, message,
                                                                      drafts):
    """With two --draft, a tree file that is missing or does not parse used to be reported as "--draft was given 2
    times" (it was taken for a one-drafter tree); with one --draft, a /2 file with a bad drafter index as "a
    multi-drafter tree ... use load_drafter_tree". The reader's own reason comes first."""
    bad = tmp_path / "bad.yaml"
    if content is not None:
        bad.write_text(content)
    res = tmp_path / "res"
    r = invoke("run", "--target", env["target"], "--prompts", env["prompts"], "--results-dir", res,
               "--draft", "lookup", *(["--draft", env["draft"]] if drafts == 2 else []), "--tree", bad)
    _one_line_error(r, 2, message)
    assert "--draft was given" not in r.output and not res.exists()


def test_a_drafter_failing_mid_run_is_one_line_exit_1_and_no_results(env, tmp_path, monkeypatch):
    from sequoia_opt.drafting.drafters.model import ModelDrafter

    real, calls = ModelDrafter.score_nodes, []

    def crashing(self, *a, **k):  # the strong drafter (a model) fails on its fourth call
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(self, *a, **k)

    monkeypatch.setattr(ModelDrafter, "score_nodes", crashing)
    res = tmp_path / "res"
    res.mkdir()
    (res / "earlier-run.json").write_text("{}")
    r = invoke("run", "--target", env["target"], "--draft", "lookup", "--draft", env["draft"], "--tree", env["plan"],
               "--prompts", env["prompts"], "--num-prompts", "2", "--max-new-tokens", "16", "--results-dir", res)
    assert r.exit_code == 1, r.output
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]  # progress lines may precede it
    assert errors == ["error: the run stopped: RuntimeError: CUDA error: an illegal memory access was encountered "
                      "(no results were written)"] and "Traceback" not in r.output
    assert len(calls) == 4
    assert sorted(p.name for p in res.iterdir()) == ["earlier-run.json"]
