"""solve --dynamic, run --dynamic and profile acceptance --calibration through the CLI (typer's CliRunner), on
synthetic calibration and latency profiles and the tiny HF-checkpoint pair."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair  # noqa: E402

from sequoia_opt.profiles.calibration import CalibrationProfile, RecordedStep, load_calibration, save_calibration  # noqa: E402
from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.dynamic import DynamicSetting  # noqa: E402
from sequoia_opt.exports import DYNAMIC_FORMAT, load_dynamic_setting  # noqa: E402
from sequoia_opt.profiles import LatencyCurve, save_latency  # noqa: E402
from sequoia_opt.solver.dynamic import predict_setting  # noqa: E402

runner = CliRunner()
NAN = math.nan


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_line_error(r, *fragments):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def _recorded(i: int) -> RecordedStep:
    """A recording of steps 2, topk 2 (both depth-1 nodes expanded), its acceptances varied a little by i."""
    a = 0.05 * (i % 3)
    return RecordedStep(np.array([-1, 0, 0, 1, 1, 2, 2]), np.array([1, 0.7, 0.2, 0.6, 0.3, 0.5, 0.4]),
                        np.array([0, 0, 1, 0, 1, 0, 1]), np.array([1, 0.8 - a, 0.1, 0.5 + a, 0.3, 0.6, 0.2]),
                        np.array([1.0, 0.9, 1.1, NAN, NAN, NAN, NAN]))


def _calibration(path: Path, target: str = "target", draft: str = "draft", steps: int = 2, topk: int = 2) -> Path:
    prof = CalibrationProfile("tiny_calibration", {"target": target, "draft": draft, "temperature": 0.0,
                                                   "recording": {"steps": steps, "topk": topk}},
                              [_recorded(i) for i in range(12)])
    return save_calibration(path, prof)


def _latency(path: Path, target: str = "target", draft: str = "draft") -> Path:
    curve = LatencyCurve.synthetic({1: 10.0, 2: 10.5, 4: 11.0, 8: 13.0}, {1: 1.0, 2: 1.2, 4: 1.5},
                                   step_overhead_ms=0.5, id="tiny_latency")
    return save_latency(path, replace(curve, model={"target": target, "draft": draft}))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyn")
    return _calibration(root / "cal.yaml"), _latency(root / "lat.yaml")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dyn-pair")
    target, draft, prompts = make_pair(root)
    assert (target.name, draft.name) == ("target", "draft")  # the names profiles of this pair carry
    return root, target, draft, prompts


# ---------------------------------------------------------------------------------------------- solve --dynamic
def test_solve_dynamic_prints_the_table_and_writes_the_chosen_setting(files, tmp_path):
    cal, lat = files
    out = tmp_path / "dyn.yaml"
    r = invoke("solve", "--dynamic", cal, "-l", lat, "-o", out)
    assert r.exit_code == 0, r.output
    assert "dynamic settings" in r.stdout and "eagle" in r.stdout and "best-first" in r.stdout
    setting, doc = load_dynamic_setting(out)
    assert doc["format"] == DYNAMIC_FORMAT
    assert doc["provenance"] == {"calibration_profile": "tiny_calibration", "latency_profile": "tiny_latency",
                                 "target": "target", "draft": "draft", "temperature": 0.0}
    assert setting.steps <= 2 and setting.topk <= 2 and setting.budget <= 8
    # the file's prediction is the predictor's for that setting
    from sequoia_opt.profiles.calibration import load_calibration
    from sequoia_opt.profiles import load_latency

    p = predict_setting(load_calibration(cal), setting, load_latency(lat))
    assert doc["predicted"]["tokens_per_step"] == pytest.approx(p.tokens_per_step, abs=1e-6)
    assert doc["predicted"]["speedup"] == pytest.approx(p.speedup, abs=1e-6)

    r = invoke("solve", "--dynamic", cal, "-l", lat, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["chosen"]["setting"] == setting.to_dict()
    tps = [row["tokens_per_s"] for row in data["rows"]]
    assert tps == sorted(tps, reverse=True) and data["chosen"]["tokens_per_s"] == tps[0]
    assert {row["setting"]["policy"] for row in data["rows"]} == {"eagle", "entropy", "best-first"}


def test_solve_dynamic_sglang_to_stdout_is_the_json_alone(files):
    cal, lat = files
    r = invoke("solve", "--dynamic", cal, "-l", lat, "--policy", "eagle", "--format", "sglang")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # the report went to stderr
    assert "dynamic settings" in r.stderr
    r2 = invoke("solve", "--dynamic", cal, "-l", lat, "--policy", "eagle", "--json")
    chosen = DynamicSetting.from_dict(json.loads(r2.stdout)["chosen"]["setting"])
    assert chosen.policy == "eagle"
    assert (doc["speculative_num_steps"], doc["speculative_eagle_topk"], doc["speculative_num_draft_tokens"]) == (
        chosen.steps, chosen.topk, chosen.budget)
    assert doc["cli_flags"].endswith(f"--speculative-num-draft-tokens {chosen.budget}")


def test_solve_dynamic_refuses_profiles_of_another_pair(files, tmp_path):
    _, lat = files
    other = _calibration(tmp_path / "other.yaml", target="some-70b")
    r = invoke("solve", "--dynamic", other, "-l", lat)
    _one_line_error(r, "'some-70b'", "'target'", "another pair")


def test_solve_dynamic_clamps_a_budget_past_the_latency_profile_with_a_note(files, tmp_path):
    _, lat = files
    # a recording of 3 levels of top-3 (22 nodes: the root's 3 children, their 9, 3 of those expanded again):
    # settings of up to 22 nodes could be scored
    parent = [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 7, 7, 7]
    rank = [0] + [0, 1, 2] * 7
    prob = [1.0] + [0.6, 0.25, 0.1] * 7
    accept = [1.0] + [0.7, 0.2, 0.05] * 7
    ent = [1.0, 0.9, 1.1, 1.2, 0.8, 0.8, NAN, 0.8, NAN, NAN, NAN, NAN, NAN] + [NAN] * 9
    steps = [RecordedStep(np.array(parent), np.array(prob), np.array(rank), np.array(accept), np.array(ent))] * 12
    cal = save_calibration(tmp_path / "wide.yaml", CalibrationProfile(
        "tiny_calibration", {"target": "target", "draft": "draft", "temperature": 0.0,
                             "recording": {"steps": 3, "topk": 3}}, steps))
    r = invoke("solve", "--dynamic", cal, "-l", lat, "--budget", "20", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert ("--budget 20 is past the latency profile's largest measured token count 8: clamped to 8 (T(n) is never "
            "extrapolated)") in doc["notes"]
    assert max(row["setting"]["budget"] for row in doc["rows"]) == 8
    assert not any("left out" in n for n in doc["notes"])  # clamped before the grid: nothing to leave out
    r = invoke("solve", "--dynamic", cal, "-l", lat, "--budget", "20")  # the table shows the note too
    assert r.exit_code == 0 and "clamped to 8" in r.output


@pytest.mark.parametrize("args, fragments", [
    (["--policy", "bogus"], ["unknown --policy bogus", "eagle, entropy, best-first"]),
    (["--policy", ""], ["--policy names no rule"]),
    (["--format", "vllm"], ["--dynamic writes yaml, json, sglang, tensorrt-llm, not 'vllm'"]),
    (["--format", "bogus"], ["--dynamic writes yaml, json, sglang, tensorrt-llm, not 'bogus'"]),
    (["--policy", "entropy", "--format", "sglang"], ["sglang runs the eagle rule only"]),
])
def test_solve_dynamic_bad_options(files, args, fragments):
    cal, lat = files
    _one_line_error(invoke("solve", "--dynamic", cal, "-l", lat, *args), *fragments)


def test_solve_policy_without_dynamic_and_dynamic_without_latency(files):
    cal, _ = files
    _one_line_error(invoke("solve", "--policy", "eagle", "-a", cal), "add --dynamic")
    _one_line_error(invoke("solve", "--dynamic", cal), "needs one --latency profile")


# ---------------------------------------------------------------------------------------------- run --dynamic
def test_run_refuses_bad_dynamic_options_before_loading_models(files, tmp_path):
    cal, lat = files
    missing = tmp_path / "no-such-model"  # a model path that does not exist: the options fail first
    _one_line_error(invoke("run", "--dynamic", "bogus:1", "--target", missing, "--results-dir", tmp_path / "res"),
                    "cannot read dynamic setting 'bogus:1'")
    _one_line_error(invoke("run", "--dynamic", "eagle:steps=2,topk=2", "--target", missing), "lacks budget")
    _one_line_error(invoke("run", "--tree", cal, "--calibration", cal, "--target", missing),
                    "--calibration predicts --dynamic settings")
    _one_line_error(invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", cal,
                           "--target", missing), "add -l")
    _one_line_error(invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--compare", "--target", missing),
                    "--compare sizes its baselines by the --tree files")
    assert not (tmp_path / "res").exists()


def test_solve_dynamic_warns_when_the_calibration_is_too_small(files, tmp_path):
    _, lat = files
    few = save_calibration(tmp_path / "few.yaml", CalibrationProfile(
        "few", {"target": "target", "draft": "draft", "temperature": 0.0}, [_recorded(0)]))
    r = invoke("solve", "--dynamic", few, "-l", lat, "--json")
    assert r.exit_code == 0, r.output
    assert any("bin(s) with enough reached candidates: its predictions are not meaningful" in w
               for w in json.loads(r.stdout)["warnings"])


def test_solve_dynamic_warns_when_no_setting_beats_plain_decoding(files, tmp_path):
    cal, _ = files
    slow = LatencyCurve.synthetic({1: 10.0, 2: 10.5, 4: 11.0, 8: 13.0}, {1: 20.0, 2: 24.0, 4: 30.0},
                                  step_overhead_ms=0.5, id="slow_draft")
    lat = save_latency(tmp_path / "slow.yaml", replace(slow, model={"target": "target", "draft": "draft"}))
    r = invoke("solve", "--dynamic", cal, "-l", lat, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["chosen"]["speedup"] < 1.0
    assert any(w.startswith("no dynamic setting beats plain decoding on this latency curve (the best, ")
               and "serve without speculation" in w for w in data["warnings"])
    fast = invoke("solve", "--dynamic", cal, "-l", files[1], "--json")  # a cheap draft: speculation pays, no warning
    assert not any("beats plain decoding" in w for w in json.loads(fast.stdout)["warnings"])


def test_run_dynamic_on_the_tiny_pair(workdir, files, tmp_path):
    root, target, draft, prompts = workdir
    cal, lat = files
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", cal, "-l", lat,
               "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "2",
               "--max-new-tokens", "8", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    rows = {s["tree"]: s for s in doc["summaries"]}
    assert list(rows) == ["plain", "eagle:s2-k2-n4"]
    row = rows["eagle:s2-k2-n4"]
    assert row["mismatches"] == 0 and row["new_tokens"] == 2 * 8
    from sequoia_opt.profiles.calibration import load_calibration
    from sequoia_opt.profiles import load_latency

    pred = predict_setting(load_calibration(cal), DynamicSetting("eagle", 2, 2, 4), load_latency(lat), max_steps=200)
    # the calibration predicts the steady state; for 8-token answers run scales it as a chain of the setting's
    # 2 levels whose one rate gives that G (the predictor records no step-length distribution)
    from sequoia_opt.jobs.run import answer_factor
    from sequoia_opt.tree import TreeMetadata

    f = answer_factor(None, TreeMetadata(expected_tokens_per_step=pred.tokens_per_step), [8, 8], depth=2)
    assert row["predicted_tokens_per_step_steady"] == pytest.approx(pred.tokens_per_step)
    assert row["predicted_tokens_per_step"] == pytest.approx(pred.tokens_per_step * f) and f < 1
    saved = json.loads(Path(doc["json"]).read_text())
    assert any(s["tree"] == "eagle:s2-k2-n4" and s["mismatches"] == 0 for s in saved["summaries"])
    # a calibration of another decoding mode is a warning, as a tree's profiles of another mode are (was a note)
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", cal, "-l", lat,
               "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "1",
               "--max-new-tokens", "4", "--temperature", "0.8", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    said = "was recorded in greedy mode, this run decodes in sampling at temperature 0.8 mode"
    assert any(said in w for w in doc["warnings"]) and not any(said in n for n in doc["notes"])

    # a treeopt-dynamic/1 file runs with the prediction it carries
    setting_file = tmp_path / "best.yaml"
    assert invoke("solve", "--dynamic", cal, "-l", lat, "--policy", "best-first", "-o", setting_file).exit_code == 0
    setting, sdoc = load_dynamic_setting(setting_file)
    r = invoke("run", "--dynamic", setting_file, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "6", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    row = next(s for s in json.loads(r.stdout)["summaries"] if s["tree"] == setting.label)
    assert row["mismatches"] == 0
    assert row["predicted_tokens_per_step_steady"] == pytest.approx(sdoc["predicted"]["tokens_per_step"])
    assert row["predicted_tokens_per_step"] < row["predicted_tokens_per_step_steady"]  # for 6-token answers
    # the file's prediction is greedy's (its calibration's mode, recorded since): a sampled run is warned, as
    # with --calibration (a tryout's sampled run showed the greedy prediction without a word)
    assert sdoc["provenance"]["temperature"] == 0.0
    r = invoke("run", "--dynamic", setting_file, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--temperature", "0.9", "--results-dir",
               tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    assert any(f"{setting.label}: its file was solved from a calibration recorded in greedy mode, this run decodes in "
               "sampling at temperature 0.9 mode" in w for w in json.loads(r.stdout)["warnings"])


def test_run_dynamic_refuses_a_calibration_of_another_pair(workdir, files, tmp_path):
    root, target, draft, prompts = workdir
    _, lat = files
    other = _calibration(tmp_path / "other.yaml", draft="some-draft")
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", other, "-l", lat,
               "--target", target, "--draft", draft, "--prompts", prompts, "--results-dir", tmp_path / "res")
    _one_line_error(r, "'some-draft'", "'draft'")
    assert not (tmp_path / "res").exists()


def test_run_dynamic_refuses_a_setting_that_could_never_draft_in_the_context(workdir, tmp_path):
    """steps=600 on a 512-token target held every step to its root (tokens/step 1.000, no word): the candidate
    tree can never fit. Now one error line (once the target's context is known), before any decoding."""
    root, target, draft, prompts = workdir
    for setting, grows in (("eagle:steps=600,topk=1,budget=8", "601 nodes over 600 levels"),
                           ("best-first:steps=600,topk=2,budget=8", "over 600 levels")):
        r = invoke("run", "--dynamic", setting, "--target", target, "--draft", draft, "--prompts", prompts,
                   "--results-dir", tmp_path / "res")
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]  # (a kernel-tuning note may precede)
        assert r.exit_code == 2 and len(errors) == 1 and grows in errors[0], r.output
        assert "the target's context holds 512 tokens: it could draft at no step" in errors[0]
    assert not (tmp_path / "res").exists()
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--dynamic", "eagle:budget=4,topk=2,steps=2",
               "--target", target, "--draft", draft, "--prompts", prompts, "--results-dir", tmp_path / "res")
    _one_line_error(r, "--dynamic eagle:s2-k2-n4 is given twice")  # two result rows of one name
    assert not (tmp_path / "res").exists()


# ---------------------------------------------------------------------------------------------- profile --calibration
def test_profile_acceptance_calibration_writes_a_loadable_profile(workdir, files, tmp_path):
    root, target, draft, prompts = workdir
    _, lat = files
    out = tmp_path / "cal.yaml"
    r = invoke("profile", "acceptance", "--calibration", "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "2", "--max-new-tokens", "8", "--calibration-steps", "2", "--calibration-topk", "2",
               "-o", out, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["output"] == str(out)
    prof = load_calibration(out)
    assert (prof.measured["target"], prof.measured["draft"]) == ("target", "draft")
    assert prof.recording == {"steps": 2, "topk": 2} and prof.measured["num_prompts"] == 2
    assert prof.steps and all(s.n == 1 + 2 + 2 * 2 for s in prof.steps)
    assert all(set(s.accept.tolist()) <= {0.0, 1.0} for s in prof.steps)  # greedy
    doc = yaml.safe_load(out.read_text())
    assert doc["candidates"] == 6 * len(prof.steps) == sum(b["count"] for b in doc["bins"])
    # the measured profile feeds solve --dynamic with this pair's latency profile
    r = invoke("solve", "--dynamic", out, "-l", lat, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["chosen"]["setting"]["steps"] <= 2


@pytest.mark.parametrize("args, fragment", [
    (["--calibration", "--calibration-steps", "0"], "--calibration-steps and --calibration-topk must be at least 1"),
    (["--calibration", "--calibration-topk", "0"], "--calibration-steps and --calibration-topk must be at least 1"),
    (["--calibration", "--draft", "lookup"], "lookup:1-3 has no draft probabilities"),
    (["--calibration-steps", "3"], "add --calibration"),
    (["--calibration", "--calibration-steps", "30", "--calibration-topk", "50"], "has 72551 nodes"),
    (["--calibration", "--width", "4"], "the calibration's recording tree is --calibration-topk"),
    # taken, and the calibration printed no prompts-needed line for it (exit 0)
    (["--calibration", "--interval-width", "0.1"], "drop --interval-width"),
])
def test_profile_calibration_bad_options(workdir, tmp_path, args, fragment):
    root, target, draft, prompts = workdir
    out = tmp_path / "cal.yaml"
    extra = [] if "--draft" in args else ["--draft", draft]
    r = invoke("profile", "acceptance", "--target", target, *extra, "--prompts", prompts, "-o", out, *args)
    _one_line_error(r, fragment)
    assert not out.exists()


def test_solve_dynamic_scores_the_static_tree_as_solve_does(files, tmp_path):
    """A profile whose positional check failed: solve values trees per depth; solve --dynamic's static row
    did with the pooled vector (G 1.227 against 1.242 on the demo's prose profiles, one tree, two speedups).
    Both now find the same tree and give it the same G and speedup."""
    cal, lat = files
    acc = tmp_path / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: runs\nmeasured: {mode: greedy, positional_consistent: false}\n"
                   "acceptance: [0.5, 0.1, 0.05]\nacceptance_by_depth:\n  1: [0.3, 0.1, 0.05]\n"
                   "  2: [0.8, 0.05, 0.02]\n")
    r = invoke("solve", "-a", acc, "-l", lat, "--budget", "8", "--json")
    assert r.exit_code == 0, r.output
    solved = json.loads(r.stdout)
    r = invoke("solve", "--dynamic", cal, "-a", acc, "-l", lat, "--json")
    assert r.exit_code == 0, r.output
    static = json.loads(r.stdout)["static"]
    assert solved["acceptance_model"] == static["acceptance_model"] == "by-depth"
    assert static["choices"] == solved["tree"]["choices"]
    assert static["expected_tokens_per_step"] == pytest.approx(solved["choice"]["expected_tokens_per_step"], rel=1e-12)
    assert static["speedup"] == pytest.approx(solved["choice"]["speedup"], rel=1e-12)
    # and not the pooled vector's figure
    from sequoia_opt.solver import expected_tokens_by_depth
    from sequoia_opt.tree import Tree

    t = Tree.from_choices(static["choices"])
    assert static["expected_tokens_per_step"] == pytest.approx(
        expected_tokens_by_depth(t, [[0.3, 0.1, 0.05], [0.8, 0.05, 0.02]]))
    assert t.size > 2 and abs(t.expected_tokens([0.5, 0.1, 0.05]) - static["expected_tokens_per_step"]) > 1e-3


def test_run_dynamic_drops_a_setting_past_the_latency_profile_with_a_note(workdir, files, tmp_path):
    """As solve --dynamic leaves it out: the run goes on with the settings the profile can score (the whole
    run was refused before); with none left, one line and exit 2."""
    root, target, draft, prompts = workdir
    cal, lat = files  # the latency profile measured the target up to 8 tokens
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--dynamic", "best-first:steps=2,topk=2,budget=12",
               "--calibration", cal, "-l", lat, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["tree"] for s in doc["summaries"]] == ["plain", "eagle:s2-k2-n4"]
    assert ("best-first:s2-k2-n12 not run: its budget 12 is past the largest target token count 8 latency profile "
            "'tiny_latency' measured (T(n) and c(w) are never extrapolated: profile more tokens, or lower its budget "
            "/ topk)") in doc["notes"]
    r = invoke("run", "--dynamic", "best-first:steps=2,topk=2,budget=12", "--calibration", cal, "-l", lat,
               "--target", tmp_path / "no-model", "--results-dir", tmp_path / "res2")
    _one_line_error(r, "no --dynamic setting is left to run: best-first:s2-k2-n12 not run: its budget 12")
    assert not (tmp_path / "res2").exists()


def test_run_dynamic_says_when_a_setting_reaches_past_the_calibration_recording(workdir, files, tmp_path):
    """The recording is steps 2, topk 2: a setting of 4 steps and topk 3 is predicted with the nodes past it counted
    as leaves (a tryout's prediction fell outside the measured interval without a word; solve --dynamic shows the
    coverage): a note says so, and the JSON keeps the coverage."""
    root, target, draft, prompts = workdir
    cal, lat = files
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--dynamic", "eagle:steps=4,topk=3,budget=8",
               "--calibration", cal, "-l", lat, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    past = [n for n in notes if "expands nodes the calibration recording did not" in n]
    assert len(past) == 1 and past[0].startswith("eagle:s4-k3-n8 expands nodes the calibration recording did not in ")
    from sequoia_opt.profiles import load_latency
    from sequoia_opt.profiles.calibration import load_calibration

    inside = predict_setting(load_calibration(cal), DynamicSetting("eagle", 2, 2, 4), load_latency(lat), max_steps=200)
    assert inside.coverage == 1.0


def test_step_memory_of_a_dynamic_setting():
    """EAGLE at topk 128 over 8 steps keeps 114,817 candidates: the (n, n) ancestor matrix and its device copy
    are 26.4 GB; the draft distributions of its 128-node frontier over 49,152 tokens 75 MB."""
    from sequoia_opt.dynamic import check_step_memory, max_candidates, step_memory_bytes

    big = DynamicSetting("eagle", 8, 128, 64)
    assert max_candidates(big) == 1 + 128 + 7 * 128 * 128 == 114_817
    assert step_memory_bytes(big, 49_152) == 2 * 114_817**2 + 12 * 128 * 49_152
    small = DynamicSetting("best-first", 4, 4, 16)
    assert step_memory_bytes(small, 49_152) == 2 * 16**2 + 12 * 15 * 49_152
    check_step_memory(small, 49_152, 2**30)
    with pytest.raises(ValueError, match=r"^eagle:s8-k128-n64: one step needs about 24\.6 GiB \(114,817 candidate "
                                         r"nodes: a 114,817 x 114,817 ancestor matrix, and draft distributions over "
                                         r"49,152 tokens\), more than the 16\.0 GiB free on cpu: lower topk or steps$"):
        check_step_memory(big, 49_152, 16 * 2**30, "cpu")


def test_run_refuses_a_dynamic_setting_past_the_free_memory_before_loading_models(workdir, tmp_path, monkeypatch):
    """Only topk past the vocabulary was refused; a setting whose step needs more than the free memory ran
    until it ran out of it. The target's config gives the vocabulary (257 tokens here); nothing loads."""
    import sequoia_opt.device as device_mod

    root, target, draft, prompts = workdir
    monkeypatch.setattr(device_mod, "free_memory_bytes", lambda device: 64 * 2**20)  # 64 MiB free
    loads = []
    import sequoia_opt.jobs.load as pipeline

    monkeypatch.setattr(pipeline, "load_pair", lambda *a, **k: loads.append(1))
    r = invoke("run", "--dynamic", "eagle:steps=3,topk=64,budget=32", "--target", target, "--draft", draft,
               "--prompts", prompts, "--results-dir", tmp_path / "res")
    _one_line_error(r, "eagle:s3-k64-n32: one step needs about 130.2 MiB (8,257 candidate nodes: a 8,257 x 8,257 "
                       "ancestor matrix, and draft distributions over 257 tokens), more than the 64.0 MiB free on cpu")
    assert loads == [] and not (tmp_path / "res").exists()


def test_solve_dynamic_static_tree_follows_the_options_of_solve(files, tmp_path):
    """solve --dynamic -a dropped --acceptance-model, --max-branching and --width (its static row solved by-depth at
    branching 32 whatever was asked, against a profile of any width), and took --compare and --plan, which it has
    nothing to do with, printing the same table: each now shapes the static tree as solve's, or is refused."""
    cal, lat = files
    acc = tmp_path / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: runs\nmeasured: {mode: greedy, positional_consistent: false}\n"
                   "acceptance: [0.5, 0.1, 0.05]\nacceptance_by_depth:\n  1: [0.3, 0.1, 0.05]\n"
                   "  2: [0.8, 0.05, 0.02]\n")
    for args in (["--acceptance-model", "positional"], ["--max-branching", "1"]):
        r = invoke("solve", "-a", acc, "-l", lat, "--budget", "8", "--json", *args)
        assert r.exit_code == 0, r.output
        solved = json.loads(r.stdout)
        r = invoke("solve", "--dynamic", cal, "-a", acc, "-l", lat, "--json", *args)
        assert r.exit_code == 0, r.output
        static = json.loads(r.stdout)["static"]
        assert static["acceptance_model"] == solved["acceptance_model"]
        assert static["choices"] == solved["tree"]["choices"]
        assert static["speedup"] == pytest.approx(solved["choice"]["speedup"], rel=1e-12)
    assert static["acceptance_model"] == "by-depth" and len(static["choices"]) > 1
    assert all(c[-1] == 0 for c in static["choices"])  # --max-branching 1: a chain
    r = invoke("solve", "--dynamic", cal, "-a", acc, "-l", lat, "--json", "--acceptance-model", "positional")
    assert json.loads(r.stdout)["static"]["acceptance_model"] == "positional"
    _one_line_error(invoke("solve", "--dynamic", cal, "-a", acc, "-l", lat, "--width", "8"),
                    "has 3 entries but --width 8 was asked for")
    _one_line_error(invoke("solve", "--dynamic", cal, "-a", acc, "-l", lat, "--acceptance-model", "bogus"),
                    "unknown --acceptance-model 'bogus'")
    for args in (["--compare"], ["--plan", "graft"]):
        _one_line_error(invoke("solve", "--dynamic", cal, "-l", lat, *args), f"drop {args[0]}")
    for args in (["--width", "3"], ["--max-branching", "2"], ["--acceptance-model", "positional"]):
        _one_line_error(invoke("solve", "--dynamic", cal, "-l", lat, *args), f"{args[0]} shape the static DP tree")


def test_run_refuses_a_dynamic_tree_of_a_drafter_without_probabilities_by_its_name(workdir, tmp_path):
    """run --draft lookup --policy dynamic:... said "drafter 'draft' has no draft probabilities", naming a drafter
    the run did not have, after loading the models; --dynamic refused it after loading too. Both now name it, first."""
    _, _, _, prompts = workdir
    missing = tmp_path / "no-such-model"  # refused before any model is read
    for args in (["--policy", "dynamic:eagle:steps=2,topk=2,budget=4", "--tree", tmp_path / "t.yaml"],
                 ["--dynamic", "eagle:steps=2,topk=2,budget=4"]):
        if "--tree" in args:
            (tmp_path / "t.yaml").write_text("[[0], [0, 0]]\n")
        r = invoke("run", *args, "--draft", "lookup", "--target", missing, "--prompts", prompts,
                   "--results-dir", tmp_path / "res")
        _one_line_error(r, "drafter 'lookup:1-3' has no draft probabilities")
        assert "'draft'" not in r.stderr
    assert not (tmp_path / "res").exists()


def test_run_dynamic_says_when_the_calibration_sampled_at_another_top_p(workdir, files, tmp_path):
    """The nucleus cuts both models' distributions, so a sampled calibration predicts its own top-p only: run says
    so where both sample (the recorded top_p was never compared)."""
    from sequoia_opt.profiles.calibration import calibration_warnings

    root, target, draft, prompts = workdir
    _, lat = files
    f = _calibration(tmp_path / "cal.yaml")
    doc = yaml.safe_load(f.read_text())
    doc["measured"].update(temperature=1.0, top_p=0.5)
    f.write_text(yaml.safe_dump(doc))
    cal = load_calibration(f)
    said = ("calibration profile 'tiny_calibration' was recorded with top-p 0.5, this run samples with top-p 1")
    assert said in calibration_warnings(cal, temperature=1.0, top_p=1.0)
    assert not [w for w in calibration_warnings(cal, temperature=1.0, top_p=0.5) if "top-p" in w]
    assert not [w for w in calibration_warnings(cal, temperature=0.0, top_p=1.0) if "top-p" in w]  # mode's line
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", f, "-l", lat,
               "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "1",
               "--max-new-tokens", "4", "--temperature", "1.0", "--top-p", "1.0", "--results-dir", tmp_path / "res",
               "--json")
    assert r.exit_code == 0, r.output
    assert said in json.loads(r.stdout)["warnings"]
