"""Feature heads through the CLI (typer's CliRunner) on the tiny HF-checkpoint pair: bad heads refused in one line
before any weight loads; profile latency / acceptance / calibration, solve, run, run --dynamic and
--compare-drafters with ``--draft eagle3:PATH`` and ``--draft medusa:PATH``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from feature_heads import eagle3_config, eagle3_tensors, write_eagle, write_eagle3, write_head, write_medusa  # noqa: E402
from tiny_pair import make_pair  # noqa: E402

import sequoia_opt.jobs.load as pipeline  # noqa: E402
from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.drafting.registry import DRAFTERS, parse_drafter_spec  # noqa: E402
from sequoia_opt.errors import TreeoptError  # noqa: E402
from sequoia_opt.profiles import load_acceptance, load_latency  # noqa: E402
from sequoia_opt.tree import load_tree  # noqa: E402

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads-cli")
    # 4 layers: EAGLE-3 fuses 3 distinct layers of 0..2; seed 4: no prompt ends early and the random heads are
    # accepted often enough to leave a tree
    target, draft, prompts = make_pair(root, layers=4, seed=4)
    ids = sorted(torch.randperm(257, generator=torch.Generator().manual_seed(1))[:160].tolist())
    heads = {"eagle3": write_eagle3(root / "e3", draft_ids=ids, ids=(0, 1, 2)),
             "eagle": write_eagle(root / "e1"), "medusa": write_medusa(root / "md", heads=3)}
    return root, target, draft, prompts, heads


def test_the_kinds_parse_and_name_their_engine_methods(workdir, tmp_path):
    root, target, draft, prompts, heads = workdir
    spec = parse_drafter_spec(f"eagle3:{heads['eagle3']}")
    assert (spec.kind, spec.path, spec.label, spec.cost_model) == ("eagle3", heads["eagle3"], "eagle3:e3", "per-level")
    assert spec.spec == f"eagle3:{heads['eagle3']}" and parse_drafter_spec(spec.spec) == spec
    assert parse_drafter_spec(f"medusa:{heads['medusa']}").cost_model == "one-pass"
    assert DRAFTERS["eagle3"].engine_methods == {"vllm": "eagle3", "sglang": "EAGLE3", "tensorrt-llm": "Eagle3",
                                                 "llama.cpp": "draft-eagle3"}
    assert DRAFTERS["eagle"].engine_methods == {"vllm": "eagle", "sglang": "EAGLE"}
    assert DRAFTERS["medusa"].engine_methods == {"vllm": "medusa", "tensorrt-llm": "Medusa"}
    for text, message in [("eagle:", "names no checkpoint: write eagle:PATH"),
                          ("medusa", "names no checkpoint: write medusa:PATH"),
                          (f"eagle3:{tmp_path / 'nowhere'}",
                           "nowhere does not exist \\(the checkpoint folder of eagle3:PATH\\)")]:
        with pytest.raises(TreeoptError, match=message):
            parse_drafter_spec(text)
    (tmp_path / "tree.yaml").write_text("format: treeopt-tree/1\n")  # a file where the head's folder goes
    for kind in ("eagle3", "eagle", "medusa"):
        with pytest.raises(TreeoptError, match=f"tree.yaml is a file; {kind}:PATH takes the head's checkpoint folder"):
            parse_drafter_spec(f"{kind}:{tmp_path / 'tree.yaml'}")


def _bad_heads(root: Path) -> list[tuple[str, str]]:
    """(--draft text, message fragment) of heads the loader refuses."""
    ids = list(range(100))
    t = eagle3_tensors(draft_ids=ids)
    out = []
    write_head(root / "vocab", eagle3_config(Vd=100, vocab_size=32000, ids=(0, 1, 2)), t)
    out.append((f"eagle3:{root / 'vocab'}", "config.json: vocab_size = 32000"))
    write_head(root / "arch", eagle3_config(Vd=100, ids=(0, 1, 2), architectures=["DeepseekV3ForCausalLM"]), t)
    out.append((f"eagle3:{root / 'arch'}", "config.json: architectures = ['DeepseekV3ForCausalLM'] is not an EAGLE-3"))
    write_head(root / "noids", eagle3_config(Vd=100, eagle_config={}), t)
    out.append((f"eagle3:{root / 'noids'}", "eagle_aux_hidden_state_layer_ids is missing"))
    write_head(root / "layers", eagle3_config(Vd=100, ids=(1, 15, 27)), t)
    out.append((f"eagle3:{root / 'layers'}", "must be 3 layer indices in 0..2 (the target has 4 layers"))
    bad = dict(t, d2t=t["d2t"] + 400)
    write_head(root / "d2t", eagle3_config(Vd=100, ids=(0, 1, 2)), bad)
    out.append((f"eagle3:{root / 'd2t'}", "d2t[0] = 400 maps draft token 0 to target id 400, outside the target"))
    write_eagle(root / "hidden", hidden_size=128)
    out.append((f"eagle:{root / 'hidden'}", "config.json: hidden_size = 128 but the target's hidden size is 64"))
    write_medusa(root / "mv", V=1000)
    out.append((f"medusa:{root / 'mv'}", "has shape (1000, 64) but the target's vocabulary x hidden size"))
    return out


@pytest.mark.parametrize("command", ["latency", "acceptance", "run"])
def test_bad_heads_exit_2_in_one_line_before_weights_load(workdir, tmp_path, monkeypatch, command):
    root, target, draft, prompts, heads = workdir

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the head was checked")

    monkeypatch.setattr(pipeline, "load_checkpoint", no_weights)
    monkeypatch.setattr("sequoia_opt.model.loaders.load_checkpoint", no_weights)
    for spec, message in _bad_heads(tmp_path):
        if command == "run":
            tree = tmp_path / "t.yaml"
            from sequoia_opt.tree import Tree, save_tree

            save_tree(tree, Tree.chain(2))
            args = ["run", "--tree", tree, "--results-dir", tmp_path / "res", "--prompts", prompts]
        else:
            args = ["profile", command, "-o", tmp_path / "out.yaml"] + (["--prompts", prompts]
                                                                         if command == "acceptance" else [])
        r = invoke(*args, "--target", target, "--draft", spec)
        assert r.exit_code == 2, r.output
        assert message in r.output and r.output.count("\n") == 1, r.output
        folder = spec.partition(":")[2]
        assert folder in r.output
        assert not (tmp_path / "out.yaml").exists() and not (tmp_path / "res").exists()


@pytest.mark.parametrize("kind, cost_model", [("eagle3", "per-level"), ("medusa", "one-pass")])
def test_profile_solve_run_with_a_feature_head(workdir, tmp_path, kind, cost_model):
    root, target, draft, prompts, heads = workdir
    spec = f"{kind}:{heads[kind]}"
    label = parse_drafter_spec(spec).label
    lat, acc, tree, res = tmp_path / "lat.yaml", tmp_path / "acc.yaml", tmp_path / "tree.yaml", tmp_path / "res"
    r = invoke("profile", "latency", "--target", target, "--draft", spec, "--context", "16", "--max-tokens", "8",
               "--max-repeats", "5", "--rounds", "1", "-o", lat)
    assert r.exit_code == 0, r.output
    curve = load_latency(lat)
    assert curve.cost_model == cost_model and curve.model["draft"] == label
    assert all(curve.draft_ms(w) > 0 for w in (1, 4, 8))
    r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", prompts, "-k", "3",
               "--depth", "3", "--max-new-tokens", "16", "-o", acc)
    assert r.exit_code == 0, r.output
    prof = load_acceptance(acc)
    assert prof.measured["draft"] == label and prof.measured["draft_cost_model"] == cost_model
    assert prof.num_samples > 0 and 0 <= prof.acceptance.sum() <= 1
    r = invoke("solve", "-a", acc, "-l", lat, "--budget", "8", "--max-depth", "3", "--max-branching", "3", "-o", tree)
    assert r.exit_code == 0, r.output
    t, meta = load_tree(tree)
    assert meta.extra["profiled_draft"] == label and meta.extra["profiled_draft_cost_model"] == cost_model
    r = invoke("run", "--tree", tree, "--target", target, "--draft", spec, "--prompts", prompts,
               "--max-new-tokens", "12", "--num-prompts", "3", "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True and doc["settings"]["draft"] == label
    assert [s["mismatches"] for s in doc["summaries"]] == [0, 0]
    assert [s["new_tokens"] for s in doc["summaries"]] == [3 * 12] * 2, doc["summaries"]


@pytest.mark.parametrize("kind,cost_model", [("eagle3", "per-level"), ("medusa", "one-pass"), ("self", "per-level")])
def test_tune_measures_a_drafter_without_a_draft_model_end_to_end(workdir, tmp_path, kind, cost_model):
    """tune --engine treeopt timed T(b, n) with the drafter's loaded checkpoint as if it were a draft model: a
    feature head crashed (its loaded weights are no model), self layer-skip was priced at 0 ms (then warned
    about the file it had just written). c(b, w) is now timed on the drafter's cost probe at every batch size."""
    from sequoia_opt.profiles.batch import load_batch_latency

    root, target, draft, prompts, heads = workdir
    spec = "self:1" if kind == "self" else f"{kind}:{heads[kind]}"
    prof_dir = tmp_path / "profiles"
    r = invoke("tune", "--engine", "treeopt", "--target", target, "--draft", spec, "--prompts", prompts,
               "--batches", "1,2", "--rounds", "1", "--num-prompts", "2", "--max-new-tokens", "8", "--max-draft", "3",
               "--context", "16", "--refine", "0", "--profiles-dir", prof_dir, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert not [w for w in doc["warnings"] if "0 ms" in w], doc["warnings"]
    saved = doc["profiles"]["latency"].removeprefix("measured: ").split(" (")[0]
    prof = load_batch_latency(saved)
    assert prof.batches == [1, 2]
    for b in (1, 2):
        curve = prof.curve(b)
        assert curve.cost_model == cost_model and curve.model["draft"] == parse_drafter_spec(spec).label
        assert all(curve.draft_ms(w, 16) > 0 for w in (1, 2))
    assert [int(r["batch_range"][0]) for r in doc["schedule"]["ranges"]][0] == 1
    # the acceptance tune measured records Medusa's depth limit (3 heads), as profile acceptance's does
    acc = load_acceptance(doc["profiles"]["acceptance"].removeprefix("measured: ").split(" (")[0])
    assert acc.depth_limit == (3 if kind == "medusa" else None)


def test_calibration_dynamic_run_and_compare_drafters_with_an_eagle3_head(workdir, tmp_path):
    root, target, draft, prompts, heads = workdir
    spec = f"eagle3:{heads['eagle3']}"
    cal, lat = tmp_path / "cal.yaml", tmp_path / "lat.yaml"
    r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", prompts, "--calibration",
               "--calibration-steps", "2", "--calibration-topk", "2", "--max-new-tokens", "10", "-o", cal)
    assert r.exit_code == 0, r.output
    r = invoke("profile", "latency", "--target", target, "--draft", spec, "--context", "16", "--max-tokens", "8",
               "--max-repeats", "3", "--rounds", "1", "-o", lat)
    assert r.exit_code == 0, r.output
    r = invoke("run", "--dynamic", "eagle:steps=2,topk=2,budget=4", "--calibration", cal, "-l", lat, "--target",
               target, "--draft", spec, "--prompts", prompts, "--num-prompts", "2", "--max-new-tokens", "8",
               "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    assert {s["tree"]: s["mismatches"] for s in doc["summaries"]} == {"plain": 0, "eagle:s2-k2-n4": 0}
    # the head beside the bundled-style draft model: each with its own profiles, side by side
    lat2, acc2, acc = tmp_path / "lat2.yaml", tmp_path / "acc2.yaml", tmp_path / "acc.yaml"
    for s_, a_, l_ in ((spec, acc, None), (str(draft), acc2, lat2)):
        r = invoke("profile", "acceptance", "--target", target, "--draft", s_, "--prompts", prompts, "-k", "2",
                   "--depth", "2", "--max-new-tokens", "10", "-o", a_)
        assert r.exit_code == 0, r.output
        if l_ is not None:
            r = invoke("profile", "latency", "--target", target, "--draft", s_, "--context", "16", "--max-tokens",
                       "8", "--max-repeats", "3", "--rounds", "1", "-o", l_)
            assert r.exit_code == 0, r.output
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", spec, "--draft", draft, "-a", acc, "-a",
               acc2, "-l", lat, "-l", lat2, "--budget", "6", "--max-depth", "3", "--prompts", prompts,
               "--num-prompts", "2", "--max-new-tokens", "8", "--results-dir", tmp_path / "cmp", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    drafted = {s.get("drafter") for s in doc["summaries"]} - {None}
    assert {"eagle3:e3", "draft"} <= drafted, doc["summaries"]
    # the engine exports name the head's method: a static tree for vLLM / SGLang / TensorRT-LLM, the best dynamic
    # setting for SGLang (EAGLE3, not EAGLE-1/2's EAGLE)
    # (no -l: the random head's tree at budget 6, not the hardware's choice, which may speculate nothing)
    r = invoke("solve", "-a", acc, "--budget", "6", "--max-depth", "3", "--format", "vllm")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["method"] == "eagle3"
    r = invoke("solve", "-a", acc, "--budget", "6", "--max-depth", "3", "--format", "sglang")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["cli_flags"].startswith("--speculative-algorithm EAGLE3 --speculative-draft-model-path "
                                                        "<your EAGLE-3 head> --speculative-num-steps")
    r = invoke("solve", "--dynamic", cal, "-l", lat, "--format", "sglang")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["speculative_algorithm"] == "EAGLE3"
    r = invoke("solve", "-a", acc2, "--budget", "6", "--max-depth", "3", "--format", "vllm")
    assert r.exit_code == 0, r.output
    assert "method" not in json.loads(r.stdout)  # a draft model: the user names the method


def test_engine_exports_name_a_feature_heads_method_and_refuse_what_the_engine_lacks():
    from sequoia_opt.drafting.registry import head_engine_methods
    from sequoia_opt.dynamic import DynamicSetting
    from sequoia_opt.exports import ExportError, export, export_dynamic
    from sequoia_opt.tree import Tree

    assert head_engine_methods("eagle3:treeopt-smollm2-eagle3") == DRAFTERS["eagle3"].engine_methods
    assert head_engine_methods("medusa:md")["vllm"] == "medusa"
    assert [head_engine_methods(x) for x in ("draft", "lookup:1-3", "self:6", None)] == [None] * 4
    tree = Tree.from_choices([[0], [1], [0, 0]])
    e3, md, e1 = (head_engine_methods(f"{k}:x") for k in ("eagle3", "medusa", "eagle"))
    assert json.loads(export(tree, "vllm", methods=e3).text)["method"] == "eagle3"
    assert not export(tree, "vllm", methods=e3).warnings[1:]
    assert any("proposes a chain" in w for w in export(tree, "vllm", methods=md).warnings)
    assert json.loads(export(tree, "sglang", methods=e1).text)["speculative_algorithm"] == "EAGLE"
    # SGLang's EAGLE3 / EAGLE load the head from --speculative-draft-model-path: the export names it (a stand-in)
    doc = json.loads(export(tree, "sglang", methods=e3).text)
    assert doc["cli_flags"] == ("--speculative-algorithm EAGLE3 --speculative-draft-model-path <your EAGLE-3 head> "
                                "--speculative-num-steps 2 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4")
    assert doc["speculative_draft_model_path"] == "<your EAGLE-3 head>"
    assert any("--speculative-draft-model-path" in w for w in export(tree, "sglang", methods=e3).warnings)
    assert "speculative_draft_model_path" not in json.loads(export(tree, "sglang").text)  # no head: the user's flags
    dyn = json.loads(export_dynamic(DynamicSetting("eagle", 3, 2, 6), "sglang", methods=e3).text)
    assert dyn["cli_flags"] == ("--speculative-algorithm EAGLE3 --speculative-draft-model-path <your EAGLE-3 head> "
                                "--speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 6")
    assert any("sglang has no speculative method" in w for w in export(tree, "sglang", methods=md).warnings)
    assert "EagleDecodingConfig" in export(tree, "tensorrt-llm", methods=e3).notes[0]
    assert "Medusa heads" in export(tree, "tensorrt-llm", methods=md).notes[0]
    assert any("tensorrt-llm has no speculative method" in w for w in export(tree, "tensorrt-llm", methods=e1).warnings)
    s = DynamicSetting("eagle", 3, 2, 6)
    assert json.loads(export_dynamic(s, "sglang", methods=e1).text)["speculative_algorithm"] == "EAGLE"
    for methods, engine in ((md, "sglang"), (md, "tensorrt-llm"), (e1, "tensorrt-llm")):
        with pytest.raises(ExportError, match=f"{engine} has no dynamic tree for this drafter"):
            export_dynamic(s, engine, methods=methods)


@pytest.mark.parametrize("order", ["strong", "light"])
def test_profile_graft_solve_and_run_with_an_eagle3_head(workdir, tmp_path, monkeypatch, order):
    """The head as the strong drafter grafting onto prompt lookup, or as the light drafter under the draft model:
    profile graft, solve --pair-acceptance, run the grafted plan (greedy output equal to plain decoding)."""
    root, target, draft, prompts, heads = workdir
    head = f"eagle3:{heads['eagle3']}"
    light, strong = ("lookup", head) if order == "strong" else (head, str(draft))
    monkeypatch.chdir(tmp_path)
    r = invoke("profile", "graft", "--target", target, "--draft", light, "--draft", strong, "--prompts", prompts,
               "--num-prompts", "2", "--max-new-tokens", "12", "-k", "2", "-A", "1", "-B", "1", "--depth", "2",
               "--max-tokens", "8", "--context", "16", "--rounds", "1", "--max-repeats", "3", "--json")
    assert r.exit_code == 0, r.output
    files = json.loads(r.stdout)["files"]
    plan = tmp_path / "plan.yaml"
    r = invoke("solve", "--pair-acceptance", files["pair_acceptance"], "-a", files["light_acceptance"], "-a",
               files["strong_acceptance"], "-l", files["light_latency"], "-l", files["strong_latency"],
               "--max-depth", "2", "-o", plan)
    assert r.exit_code == 0, r.output
    r = invoke("run", "--target", target, "--draft", light, "--draft", strong, "--tree", plan, "--prompts", prompts,
               "--num-prompts", "2", "--max-new-tokens", "10", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True and all(s["mismatches"] == 0 for s in doc["summaries"])
    labels = [parse_drafter_spec(x).label for x in (light, strong)]
    assert [row["drafter"] for row in doc["per_drafter"]] == labels


def test_a_medusa_calibration_records_no_deeper_than_its_heads_and_solves(workdir, tmp_path):
    """Recorded with the default --calibration-steps 5, 3 Medusa heads' calibration said 'recording: 5 levels' over
    trees 3 levels deep, and solve --dynamic refused the file it had just written. It records the heads' 3 levels,
    says so, and the profile is read back."""
    root, target, draft, prompts, heads = workdir
    spec, cal = f"medusa:{heads['medusa']}", tmp_path / "cal.yaml"
    r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", prompts, "--calibration",
               "--calibration-topk", "2", "--max-new-tokens", "8", "-o", cal, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["measured"]["recording"] == {"steps": 3, "topk": 2}
    assert ("recorded 3 levels, not the 5 of --calibration-steps: medusa:md proposes no deeper than depth 3, so the "
            "dynamic settings it can run stop there") in doc["notes"]
    from sequoia_opt.profiles.calibration import load_calibration

    assert load_calibration(cal).recording == {"steps": 3, "topk": 2}


def test_a_tree_deeper_than_the_medusa_heads_is_said_not_cut_silently(workdir, tmp_path):
    """A depth-7 chain with 3 Medusa heads ran cut to depth 3 every step while its table showed depth 7 and the
    whole tree's prediction; a dynamic setting of 6 steps likewise. Both are warned of."""
    from sequoia_opt.tree import Tree, TreeMetadata, save_tree

    root, target, draft, prompts, heads = workdir
    chain = save_tree(tmp_path / "chain8.yaml", Tree.chain(8), TreeMetadata())
    r = invoke("run", "--target", target, "--draft", f"medusa:{heads['medusa']}", "--tree", chain, "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "6", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert ("tree 'chain8' is 7 levels deep and medusa:md proposes no deeper than depth 3: every step is cut to 3 "
            "levels, and the prediction made for the whole tree does not hold (solve it with --max-depth 3)"
            ) in doc["warnings"]
    assert doc["greedy_ok"] is True
    r = invoke("run", "--target", target, "--draft", f"medusa:{heads['medusa']}", "--dynamic",
               "eagle:steps=6,topk=2,budget=8", "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "6",
               "--results-dir", tmp_path / "res2", "--json")
    assert r.exit_code == 0, r.output
    assert any(w.startswith("tree 'eagle:s6-k2-n8' is 6 levels deep and medusa:md proposes no deeper than depth 3")
               for w in json.loads(r.stdout)["warnings"])


def test_compare_drafters_warns_of_a_tree_deeper_than_the_medusa_heads(workdir, tmp_path):
    """run --compare-drafters solved a depth-10 tree for 3 Medusa heads from a profile that made depth pay, ran it
    cut to 3 every step, and said nothing (a tryout); --tree and --dynamic already warned."""
    root, target, draft, prompts, heads = workdir
    spec, lat, acc = f"medusa:{heads['medusa']}", tmp_path / "lat.yaml", tmp_path / "acc.yaml"
    r = invoke("profile", "latency", "--target", target, "--draft", spec, "--context", "16", "--max-tokens", "12",
               "--max-repeats", "3", "--rounds", "1", "-o", lat)
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(lat.read_text())
    for c in doc["curves"]:  # a free draft and a flat T(n): the deepest chain pays
        c["draft"]["draft_forward_ms"] = [0.001] * len(c["draft"]["draft_forward_ms"])
        c["target"]["target_forward_ms"] = [10.0 + 0.001 * i for i in range(len(c["target"]["target_forward_ms"]))]
        c.pop("loop", None)
    lat.write_text(yaml.safe_dump(doc))
    acc.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "id": "md", "measured": {
        "target": "target", "draft": "medusa:md", "mode": "greedy", "temperature": 0.0, "width": 2},
        "acceptance": [0.9, 0.05], "counts": [900, 50, 50]}))
    r = invoke("run", "--compare-drafters", "--target", target, "--draft", spec, "-a", acc, "-l", lat, "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "8", "--max-depth", "8", "--no-check-step",
               "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert any("proposes no deeper than depth 3: every step is cut to 3 levels" in w for w in out["warnings"]), \
        out["warnings"]


def test_a_head_with_no_trial_on_1_token_prompts_is_told_why_not_sent_to_shorter_prompts(workdir, tmp_path):
    """1-token prompts and --max-new-tokens 1: a feature head has no target hidden state before the prompt's only
    token, so its one step per prompt is root-only. The refusal said the measurement tree 'fits at no position
    (the drafter's context is 512 tokens; the shortest prompt is 1 tokens): use shorter prompts' (its context is
    not the cause, and the prompts cannot be shorter); it now names the cause and the way out."""
    root, target, draft, prompts, heads = workdir
    one = tmp_path / "one.jsonl"
    one.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    for kind in ("eagle3", "medusa"):
        spec = f"{kind}:{heads[kind]}"
        r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", one, "-k", "2",
                   "--depth", "2", "--max-new-tokens", "1", "-o", tmp_path / "acc.yaml")
        assert r.exit_code == 2 and not (tmp_path / "acc.yaml").exists(), r.output
        assert r.output.strip().splitlines()[-1] == (
            "error: no acceptance trial in 2 steps: the feature head drafted nothing at any of them (the shortest "
            "prompt is 1 tokens, and a feature head drafts from a prompt's second token on: the target has given it "
            "no hidden state before): use longer prompts or more --max-new-tokens"), r.output
        r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", one, "-k", "2",
                   "--depth", "2", "--max-new-tokens", "3", "-o", tmp_path / "acc.yaml")
        assert r.exit_code == 0, r.output
        assert load_acceptance(tmp_path / "acc.yaml").num_samples > 0
        (tmp_path / "acc.yaml").unlink()


def test_a_head_shorter_than_the_target_is_named_when_it_loads(workdir, tmp_path):
    """A head whose config.json says max_position_embeddings 20 on a target of more drafted nothing past position
    20: run's tokens/step fell (1.90 -> 1.16 on the demo pair) with no word. Loading it says so, naming the file
    and the field; a head as long as the target says nothing."""
    root, target, draft, prompts, heads = workdir
    short = write_eagle3(tmp_path / "short", draft_ids=sorted(torch.randperm(257, generator=torch.Generator()
                                                                            .manual_seed(1))[:160].tolist()),
                         ids=(0, 1, 2), max_position_embeddings=20)
    said: list[str] = []
    pipeline.load_pair(target, f"eagle3:{short}", device=torch.device("cpu"), dtype=torch.float32, log=said.append)
    from sequoia_opt.model.loaders import load_model_config

    ctx = load_model_config(target).max_position_embeddings
    assert f"{short / 'config.json'}: max_position_embeddings = 20, shorter than the target's {ctx}: the head " \
           "drafts nothing past position 20 (those steps decode plainly)" in said
    said.clear()
    pipeline.load_pair(target, f"eagle3:{heads['eagle3']}", device=torch.device("cpu"), dtype=torch.float32,
                       log=said.append)
    assert not any("max_position_embeddings" in s for s in said)


@pytest.mark.parametrize("kind", ["eagle3", "eagle", "medusa"])
def test_a_head_given_as_a_draft_model_names_its_kind(workdir, tmp_path, kind):
    """--draft PATH with PATH a feature head failed on a tokenizer.json the head never has (or on layers a draft
    model has): the line now names the head's kind and the spelling that loads it."""
    root, target, draft, prompts, heads = workdir
    r = invoke("profile", "acceptance", "--target", target, "--draft", heads[kind], "--prompts", prompts,
               "-o", tmp_path / "acc.yaml")
    assert r.exit_code == 2 and (f"--draft {heads[kind]} holds a feature head ({kind}), not a draft model: pass "
                                 f"--draft {kind}:{heads[kind]}") in r.output, r.output
    assert not (tmp_path / "acc.yaml").exists()


def test_solve_caps_a_medusa_profiles_tree_at_its_heads(workdir, tmp_path):
    """solve over a 3-head Medusa profile gave a depth-4 tree and exported it to vLLM as num_speculative_tokens 5:
    depths the heads never propose. The profile records the heads' depth limit; solve caps the tree there, saying
    so; another drafter's profile is not capped."""
    from sequoia_opt.tree import load_tree

    root, target, draft, prompts, heads = workdir
    acc = tmp_path / "acc.yaml"
    r = invoke("profile", "acceptance", "--target", target, "--draft", f"medusa:{heads['medusa']}", "--prompts",
               prompts, "-k", "2", "--depth", "3", "--max-new-tokens", "8", "-o", acc)
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(acc.read_text())
    assert doc["measured"]["draft_depth_limit"] == 3
    doc["acceptance"] = [0.9, 0.05]  # heads good enough that the unconstrained tree goes deeper than 3
    doc["measured"].pop("weights", None)
    for key in ("counts", "counts_by_prompt", "acceptance_by_depth"):
        doc.pop(key, None)
    acc.write_text(yaml.safe_dump(doc))
    tree = tmp_path / "t.yaml"
    r = invoke("solve", "-a", acc, "--budget", "8", "--max-depth", "6", "-o", tree, "--json")
    assert r.exit_code == 0, r.output
    assert load_tree(tree)[0].tree_depth == 3
    assert any(n.startswith("max depth 3 (asked 6): profile") for n in json.loads(r.stdout)["notes"])
    doc["measured"].pop("draft_depth_limit")
    acc.write_text(yaml.safe_dump(doc))
    r = invoke("solve", "-a", acc, "--budget", "8", "--max-depth", "6", "-o", tree)
    assert r.exit_code == 0 and load_tree(tree)[0].tree_depth > 3


def test_run_on_llamacpp_refuses_a_head_before_reading_its_tree(workdir, tmp_path):
    """run --engine llama.cpp --draft eagle3 with a tree that is no chain complained of the tree first: the user
    fixed the tree, then learned llama.cpp here cannot run a feature head at all."""
    tree = tmp_path / "t.yaml"
    tree.write_text("choices: [[0], [1]]\n")
    r = invoke("run", "--engine", "llama.cpp", "--draft", "eagle3", "--tree", tree)
    assert r.exit_code == 2 and "a feature head reads the target's hidden states, which llama.cpp's binding" in r.output


def test_tune_for_a_gpu_engine_refuses_a_head_folder_given_as_a_draft_model(workdir, tmp_path):
    """tune --engine vllm --draft HEAD_FOLDER (no kind) exported '"method": "draft_model"' with the head as the
    draft model; run and profile refused it, naming the kind."""
    root, target, draft, prompts, heads = workdir
    table = tmp_path / "t.csv"
    table.write_text("batch,tokens,target_ms\n" + "".join(f"1,{n},{10 + n}\n" for n in range(1, 6)))
    acc = tmp_path / "a.yaml"
    acc.write_text(yaml.safe_dump({"format": "treeopt-acceptance/1", "id": "a", "acceptance": [0.6, 0.1]}))
    r = invoke("tune", "--engine", "vllm", "-l", table, "-a", acc, "--draft", heads["medusa"], "-o", tmp_path / "x")
    assert r.exit_code == 2 and f"pass --draft medusa:{heads['medusa']}" in r.output, r.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("case", ["safetensors", "bin", "bin with a tokenizer", "eagle3", "eagle3 bare config"])
def test_an_eagle_head_in_llamas_architecture_given_as_a_draft_model_names_its_kind(workdir, tmp_path, case):
    """EAGLE heads often say architectures LlamaForCausalLM, as draft models do; given as --draft PATH one failed on
    its missing tokenizer.json, on 'PyTorch .bin checkpoints are not loaded' (EAGLE-1's published heads are
    pytorch_model.bin), and an EAGLE-3 head was named 'eagle'. Its tensor names (the safetensors header, or the
    .bin's pickled structure) or EAGLE-3's config keys name the kind."""
    root, target, draft, prompts, heads = workdir
    if case.startswith("eagle3"):
        head = write_eagle3(tmp_path / "e3", architectures=["LlamaForCausalLM"])
        if case == "eagle3 bare config":  # no EAGLE-3 config key: the weights' midlayer / d2t name it
            cfg = json.loads((head / "config.json").read_text())
            del cfg["draft_vocab_size"], cfg["eagle_config"]
            (head / "config.json").write_text(json.dumps(cfg))
        kind = "eagle3"
    else:
        head = write_eagle(tmp_path / "e1", weights="model.safetensors" if case == "safetensors" else
                           "pytorch_model.bin", architectures=["LlamaForCausalLM"])
        if case == "bin with a tokenizer":
            (head / "tokenizer.json").write_text((Path(draft) / "tokenizer.json").read_text())
        kind = "eagle"
    r = invoke("profile", "acceptance", "--target", target, "--draft", head, "--prompts", prompts)
    assert r.exit_code == 2 and f"holds a feature head ({kind}), not a draft model: pass --draft {kind}:{head}" \
        in r.output, r.output
    if case == "eagle3":  # the spelling the line gives loads it (the EAGLE-3 loader refused LlamaForCausalLM)
        r = invoke("profile", "acceptance", "--target", target, "--draft", f"{kind}:{head}", "--prompts", prompts,
                   "-k", "2", "--depth", "2", "--max-new-tokens", "4", "--num-prompts", "1", "-o", tmp_path / "a.yaml")
        assert r.exit_code == 0 and (tmp_path / "a.yaml").is_file(), r.output


def test_a_draft_model_is_not_taken_for_a_head(workdir, tmp_path):
    """The tensor-name test reads a real draft model's weights and finds no head in them."""
    from sequoia_opt.drafting.registry import _head_kind_in_weights

    root, target, draft, prompts, heads = workdir
    assert _head_kind_in_weights(Path(draft)) is None
    assert _head_kind_in_weights(Path(heads["eagle"])) == "eagle"  # the fixture's EAGLE-1 head: pytorch_model.bin
    import shutil

    beside = shutil.copytree(heads["eagle"], tmp_path / "e1-junk")
    (beside / "broken.safetensors").write_bytes(b"not a safetensors file")  # read alone: the .bin still names it
    assert _head_kind_in_weights(beside) == "eagle"


def test_compare_drafters_and_plot_stop_at_a_medusa_profiles_depth(workdir, tmp_path):
    """run --compare-drafters solved a depth-8 tree for 3 Medusa heads (then warned that every step is cut to 3)
    and plot drew its speedup curve at depth 10: both stop at the profile's depth limit now, as solve does."""
    from sequoia_opt.jobs.compare import plan_drafter
    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve

    curve = LatencyCurve.synthetic({n: 10.0 + 0.05 * n for n in range(1, 33)}, {w: 0.01 for w in range(1, 33)},
                                   cost_model="one-pass")
    deep = np.array([0.9, 0.05])
    free = plan_drafter("medusa:md", "one-pass", AcceptanceProfile(id="a", acceptance=deep), curve, check=False)
    heads = plan_drafter("medusa:md", "one-pass", AcceptanceProfile(id="a", acceptance=deep,
                                                                   measured={"draft_depth_limit": 3}), curve,
                         check=False)
    assert free.choice.tree.tree_depth > 3 and heads.choice.tree.tree_depth == 3 and heads.max_depth == 3


def test_profile_latency_times_a_medusa_loop_past_the_4_ary_trees_depth(workdir, tmp_path):
    """With 3 Medusa heads the timed loop's probe trees (the 4-ary tree's first n nodes) went deeper than 3 past
    n = 85, every such step was clipped and left uncounted, and the profile refused itself at n = 96 ("outside the
    timed sizes 1..80") with the default --max-tokens 128. Probe trees now stay within the heads' depth."""
    from sequoia_opt.profiling.steps import probe_tree

    for n in (5, 85, 86, 128):
        t = probe_tree(n, max_depth=3)
        assert t.size == n and t.tree_depth <= 3
    assert probe_tree(86).tree_depth == 4  # no limit: the 4-ary tree as before
    root, target, draft, prompts, heads = workdir
    lat = tmp_path / "lat.yaml"
    r = invoke("profile", "latency", "--target", target, "--draft", f"medusa:{heads['medusa']}", "--context", "16",
               "--max-tokens", "96", "--max-draft-tokens", "8", "--max-repeats", "3", "--rounds", "1", "-o", lat)
    assert r.exit_code == 0, r.output
    assert load_latency(lat).step_target_ms(96, 16) > 0
