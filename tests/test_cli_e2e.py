"""profile -> solve -> run -> plot through the CLI (typer's CliRunner) on a tiny HF-checkpoint pair."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import make_pair, other_tokenizer, random_model  # noqa: E402

from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.profiles import LatencyCurve, load_acceptance, load_latency, save_latency  # noqa: E402
from sequoia_opt.tree import Tree, load_tree, save_tree  # noqa: E402

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    target, draft, prompts = make_pair(root)
    return root, target, draft, prompts


def test_profile_solve_run_plot_end_to_end(workdir):
    root, target, draft, prompts = workdir
    lat, acc, tree, res, plots = (root / "lat.yaml", root / "acc.yaml", root / "tree.yaml", root / "results",
                                  root / "plots")
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "16",
               "--max-tokens", "12", "--max-draft-tokens", "6", "--max-repeats", "5", "-o", lat, "--json")
    assert r.exit_code == 0, r.output
    curve = load_latency(lat)
    assert list(curve.target_tokens(16)) == list(range(1, 13))
    assert curve.max_draft_tokens() == 6 and curve.step_overhead_ms > 0
    assert json.loads(r.stdout)["output"] == str(lat)
    assert "(3 rounds, each n timed alternately with n = 1)" in curve.source

    r = invoke("profile", "acceptance", "--target", target, "--draft", draft, "--prompts", prompts,
               "--width", "4", "--depth", "3", "--max-new-tokens", "24", "-o", acc, "--json")
    assert r.exit_code == 0, r.output
    prof = load_acceptance(acc)
    assert prof.width == 4 and prof.counts is not None and prof.counts.sum() == prof.num_samples
    assert prof.measured["mode"] == "greedy" and prof.measured["num_prompts"] == 6
    assert prof.measured["device"] == curve.device["name"]  # one name per device (was "cpu" here, a CPU model there)
    assert 0 < prof.acceptance.sum() <= 1
    # the trials are kept per prompt (6 prompts, depths 1..3) and add up to the pooled counts
    assert prof.prompt_counts.shape == (6, 3, 5)
    assert list(prof.prompt_counts.sum(axis=(0, 1))) == list(prof.counts)
    out = json.loads(r.stdout)
    need = out["prompts_needed"]
    assert need["interval_width"] == 0.05 and need["p_1"] >= 2
    # the note says which p_1 interval is the narrower as its own figures have it (it said the token one, always)
    note = next(n for n in out["notes"] if n.startswith("p_1 between prompts"))
    blo, bhi, tlo, thi = map(float, re.match(r"p_1 between prompts: ([\d.]+) to ([\d.]+) over 6 prompts \(the token "
                                             r"interval ([\d.]+) to ([\d.]+) is ", note).groups())
    assert ("is narrower" in note) == (thi - tlo < bhi - blo) and ("is wider here" in note) == (thi - tlo >= bhi - blo)

    r = invoke("solve", "-a", acc, "-l", lat, "--budget", "12", "--max-depth", "5", "--run-prompts", "3", "-o", tree,
               "--json")
    assert r.exit_code == 0, r.output
    t, meta = load_tree(tree)
    assert 1 <= t.size <= 12 and meta.latency_profile == curve.id and meta.acceptance_profile == prof.id
    assert meta.expected_tokens_per_step == pytest.approx(t.expected_tokens(prof.acceptance))
    spread = meta.extra["tokens_per_step_spread"]  # the prediction's spread between the profile's 6 prompts
    assert spread["point"] == pytest.approx(meta.expected_tokens_per_step) and spread["prompts"] == 6
    assert spread["new_prompts"] == 3
    lo, hi = spread["prediction_interval"]
    mlo, mhi = spread["mean_interval"]
    assert lo <= mlo <= meta.expected_tokens_per_step <= mhi <= hi  # a new set varies more than the mean

    chain = root / "chain.yaml"
    save_tree(chain, Tree.chain(3))
    r = invoke("run", "--tree", tree, "--tree", chain, "--target", target, "--draft", draft, "--prompts", prompts,
               "--max-new-tokens", "16", "--num-prompts", "3", "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    names = [s["tree"] for s in doc["summaries"]]
    assert names == ["plain", "tree", "chain"]
    assert all(s["new_tokens"] == 3 * 16 for s in doc["summaries"])
    assert Path(doc["json"]).is_file() and Path(doc["csv"]).is_file()
    csv_lines = Path(doc["csv"]).read_text().splitlines()
    assert csv_lines[0].startswith("tree,prompt_index") and len(csv_lines) == 1 + 3 * 3
    assert doc["summaries"][1]["predicted_tokens_per_step"] == pytest.approx(meta.expected_tokens_per_step)
    # the run shows the tree file's prediction interval for its own 3 prompts (solve sized it for 3 too)
    assert doc["summaries"][1]["predicted_interval"] == pytest.approx([lo, hi])
    inside = lo <= doc["summaries"][1]["tokens_per_step"] <= hi
    assert doc["summaries"][1]["inside_prediction"] is inside
    assert doc["summaries"][2]["predicted_interval"] is None  # the chain's file records no prediction
    assert meta.extra["profiled_temperature"] == 0.0 and not any("temperature" in w for w in doc["warnings"])
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--max-new-tokens", "8", "--num-prompts", "2", "--temperature", "1.0", "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output  # sampling with a tree solved from greedy acceptance: said, not refused
    assert ("tree 'tree' was solved from profiles measured with temperature 0.0, but this run uses 1.0: its "
            "predicted figures describe that setting") in json.loads(r.stdout)["warnings"]
    import torch

    timed = meta.extra["profiled_threads"]
    assert timed == curve.device["threads"]
    other = 1 if timed != 1 else 2
    try:  # a run on other CPU threads than the curve was timed with is told so
        r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
                   "--max-new-tokens", "4", "--num-prompts", "1", "--threads", str(other), "--results-dir", res,
                   "--json")
    finally:
        torch.set_num_threads(timed)
    assert r.exit_code == 0, r.output
    assert (f"tree 'tree' was solved from profiles measured with threads {timed!r}, but this run uses {other!r}: "
            "its predicted figures describe that setting") in json.loads(r.stdout)["warnings"]

    r = invoke("plot", "--latency", lat, "--acceptance", acc, "--run", doc["json"], "--tree", tree,
               "-o", plots, "--json")
    assert r.exit_code == 0, r.output
    written = json.loads(r.stdout)["written"]
    assert {Path(w).name for w in written} == {"latency.png", "acceptance.png", "speedup_vs_budget.png", "tree.png"}
    assert all(Path(w).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for w in written)


def test_plot_refuses_a_picture_file_name_for_its_folder(tmp_path):
    """`plot -o fig.png` made a folder named fig.png holding the four PNGs: a file name is refused in one line."""
    r = invoke("plot", "--acceptance", EXAMPLE_ACCEPTANCE, "-o", tmp_path / "fig.png")
    assert r.exit_code == 2 and "names a picture file; plot writes its PNGs into a folder" in r.output, r.output
    assert not (tmp_path / "fig.png").exists()
    r = invoke("plot", "--acceptance", EXAMPLE_ACCEPTANCE, "-o", tmp_path / "figs")
    assert r.exit_code == 0 and (tmp_path / "figs" / "acceptance.png").is_file(), r.output


def test_run_compare_adds_best_chain_and_kary(workdir, tmp_path):
    root, target, draft, prompts = workdir
    acc = tmp_path / "acc.yaml"
    assert invoke("profile", "acceptance", "--target", target, "--draft", draft, "--prompts", prompts, "--width", "3",
                  "--depth", "2", "--max-new-tokens", "8", "--num-prompts", "2", "-o", acc).exit_code == 0
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.from_choices([[0], [1], [0, 0]]))
    r = invoke("run", "--tree", tree, "--compare", "-a", acc, "--target", target, "--draft", draft, "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "8", "--results-dir", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    names = [s["tree"] for s in doc["summaries"]]
    assert names[:2] == ["plain", "t"]
    assert any(n.startswith("chain") for n in names)
    # the best k-ary tree within 4 nodes, depth 2, is t itself: it runs once, as t
    assert not any(n.startswith("k-ary") for n in names)
    assert "--compare: the best k-ary k=2 depth=2 is tree 't' itself; it runs once, under that name" in doc["notes"]
    assert not any(w.startswith("--compare:") for w in doc["warnings"])
    # a profile of another drafter scored the baselines without a word (only --adapt checked its profiles)
    other = tmp_path / "other.yaml"
    d = yaml.safe_load(acc.read_text())
    d["measured"]["draft"] = "another-draft"
    d["measured"].pop("weights", None)  # with the same weights' fingerprint it would be the same drafter, renamed
    other.write_text(yaml.safe_dump(d))
    r = invoke("run", "--tree", tree, "--compare", "-a", other, "--target", target, "--draft", draft, "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "8", "--results-dir", tmp_path, "--json",
               "--no-adapt")
    assert r.exit_code == 0, r.output
    assert any(w.startswith("--compare: profile") and "was measured with draft 'another-draft', but this run uses"
               in w for w in json.loads(r.stdout)["warnings"])


def test_profile_latency_default_context_fits_a_short_context_model(workdir, tmp_path):
    """A model of 160 positions was refused by the default --context 256, in a line naming a flag never given;
    the default is now the most the models and the timed loop fit. A --context given is still the user's."""
    import shutil

    from sequoia_opt.cli.profile_latency import DEFAULT_CONTEXT
    from sequoia_opt.profiling.steps import loop_positions

    root, target, draft, prompts = workdir
    short = []
    for src in (target, draft):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["max_position_embeddings"] = 160
        (dst / "config.json").write_text(json.dumps(cfg))
        short.append(dst)
    lat = tmp_path / "lat.yaml"
    args = ("profile", "latency", "--target", short[0], "--draft", short[1], "--max-tokens", "12",
            "--max-draft-tokens", "6", "--max-repeats", "3", "--rounds", "1", "-o", lat)
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    fit = min(160 - 12, 160 - loop_positions(0, 12))
    assert 1 <= fit < DEFAULT_CONTEXT and load_latency(lat).contexts == [fit]
    assert f"--context {fit}: the default {DEFAULT_CONTEXT} does not fit the context of the models" in r.output
    r = invoke(*args, "--context", "256")
    assert r.exit_code == 2 and "--context 256 + 12 tokens exceeds the target model's context of 160" in r.output
    r = invoke(*args[:-2], "--max-tokens", "200", "-o", lat)  # no default fits: the line names what to lower
    assert r.exit_code == 2 and "context of 160 tokens leaves no context to time trees of up to 200 tokens at: " \
        "lower --max-tokens" in r.output, r.output


def test_run_compare_and_adapt_read_the_default_profiles(workdir, tmp_path, monkeypatch):
    """-a / -l's help says "default: where treeopt profile writes it"; only --compare-drafters read it, so --compare
    and --adapt after a plain `treeopt profile acceptance` were refused as if nothing had been measured."""
    root, target, draft, prompts = workdir
    monkeypatch.chdir(tmp_path)
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.from_choices([[0], [1], [0, 0]]))
    run = ("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "1",
           "--max-new-tokens", "8", "--results-dir", tmp_path / "res", "--json")
    r = invoke(*run, "--compare")  # nothing profiled yet: the default path and the command that writes it
    assert r.exit_code == 2
    assert "--compare needs -a, the acceptance profile: none given and none at profiles" in r.output
    assert "where treeopt profile acceptance --target" in r.output, r.output
    r = invoke(*run, "--compare", "--temperature", "0.5")  # the command given writes the file the run looks for
    assert r.exit_code == 2 and "acceptance-sampling-t0.5-p1.yaml, where treeopt profile acceptance" in r.output
    assert f"--temperature 0.5 --top-p 1 --prompts {prompts} writes it" in r.output, r.output
    r = invoke("profile", "acceptance", "--target", target, "--draft", draft, "--prompts", prompts, "--width", "3",
               "--depth", "2", "--max-new-tokens", "8", "--num-prompts", "2", "--json")
    assert r.exit_code == 0, r.output
    written = Path(json.loads(r.stdout)["output"])
    r = invoke(*run, "--compare")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert f"--compare: -a {written} (where treeopt profile acceptance writes it; pass -a for another)" in doc["notes"]
    assert any(s["tree"].startswith("chain") for s in doc["summaries"])  # the baselines ran from it
    assert not any(s["tree"].endswith("(adaptive)") for s in doc["summaries"])  # a default is not -a -l given
    r = invoke(*run, "--adapt")  # the latency profile is not there: named, with its command
    assert r.exit_code == 2 and "--adapt needs -l, the latency profile: none given and none at profiles" in r.output


@pytest.mark.parametrize("content, message", [
    ("", "holds no prompts"),
    ('{"prompt": "ok"}\n{not json}\n', ":2: not valid JSON"),
    ('{"text_missing": 1}\n', "needs a 'prompt' (or 'text') string with something besides whitespace, or "
                               "'messages'"),
    ('{"prompt": "   "}\n', "with something besides whitespace, or 'messages' (got '   ': whitespace only)"),
])
def test_run_refuses_bad_prompt_files(workdir, tmp_path, content, message):
    root, target, draft, _ = workdir
    bad = tmp_path / "p.jsonl"
    bad.write_text(content)
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", bad,
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 2
    assert message in r.output
    assert not (tmp_path / "res").exists()


def test_run_refuses_a_tree_wider_than_the_vocabulary(workdir, tmp_path):
    root, target, draft, prompts = workdir
    tree = tmp_path / "wide.yaml"
    save_tree(tree, Tree.from_choices([[i] for i in range(300)]))  # the tiny vocabulary has 257 tokens
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 2 and "300 children" in r.output
    assert not (tmp_path / "res").exists()


def test_run_clips_a_tree_deeper_than_the_context(workdir, tmp_path):
    root, target, draft, prompts = workdir
    tree = tmp_path / "deep.yaml"
    save_tree(tree, Tree.chain(600))  # the tiny models have 512 positions: each step uses the levels that fit
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output  # was refused ("depth 599"), though plain decoding serves the request
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True
    assert ("tree 'deep' has 600 nodes and the target's context holds 512 tokens: every step clips it to the levels "
            "that fit, it is never verified whole, and its prediction does not hold") in " ".join(doc["warnings"])
    deep = next(s for s in doc["summaries"] if s["tree"] == "deep")
    assert deep["size"] == 600 and deep["mismatches"] == 0


def test_run_refuses_mismatched_tokenizers(workdir, tmp_path):
    root, target, _, prompts = workdir
    other = tmp_path / "other"
    save_hf_checkpoint(random_model(3), other_tokenizer(), other)
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", other, "--prompts", prompts,
               "--results-dir", tmp_path / "res")
    assert r.exit_code == 2 and "mismatched tokenizers: target target (257 tokens" in r.output


def test_run_refuses_a_missing_tree_file(workdir, tmp_path):
    root, target, draft, prompts = workdir
    r = invoke("run", "--tree", tmp_path / "nope.yaml", "--target", target, "--draft", draft)
    assert r.exit_code == 2 and "nope.yaml" in r.output


def test_profile_latency_bad_inputs(workdir, tmp_path):
    root, target, draft, _ = workdir
    out = tmp_path / "lat.yaml"
    for args, msg in ((["--context", "a,b"], "comma-separated"), (["--context", "8,,16"], "(an empty item)"),
                      (["--dtype", "int3"], "unknown dtype"),
                      (["--max-tokens", "0"], "at least 1"), (["--random-weights"], "needs --arch"),
                      (["--random-weights", "--arch", "llama-9000"], "unknown model preset")):
        r = invoke("profile", "latency", "--target", target, "--draft", draft, "-o", out, *args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output
        assert not out.exists()


def test_random_weight_shapes_of_two_vocabularies_are_refused_before_tuning(tmp_path, monkeypatch):
    """docs/profile.md's example paired llama-2-7b (32000 tokens) with the tiny preset (256): refused after a
    minute of CPU kernel tuning; now before any model is built."""
    import sequoia_opt.model.loaders as loaders

    def no_tuning(*a, **k):
        raise AssertionError("tuned before the shapes were checked")

    monkeypatch.setattr(loaders, "tune_loaded_model", no_tuning)
    out = tmp_path / "lat.yaml"
    r = invoke("profile", "latency", "--random-weights", "--arch", "llama-68m", "--draft-arch", "tiny", "-o", out)
    assert r.exit_code == 2 and not out.exists()
    assert "--draft-arch tiny has a vocabulary of 256 tokens but --arch llama-68m has 32000" in " ".join(r.output.split())


def test_profile_latency_random_weights_preset(tmp_path):
    out = tmp_path / "lat.yaml"
    r = invoke("profile", "latency", "--random-weights", "--arch", "tiny", "--draft-arch", "tiny", "--context", "8",
               "--max-tokens", "4", "--max-draft-tokens", "2", "--max-repeats", "5", "--rounds", "1", "--unpaired",
               "-o", out)
    assert r.exit_code == 0, r.output
    curve = load_latency(out)
    assert curve.model["random_weights"] is True
    assert curve.source.startswith("measured by treeopt profile latency (1 round) with RANDOM weights")
    att = curve.device["attention"]  # the backend that ran, per model (a CPU: the reference, nothing refused)
    assert att["requested"] == "auto" and att["target"]["backend"] == att["draft"]["backend"] == "torch"
    assert att["target"]["calls"]["torch"] >= 2 * 4 * 5 and att["target"]["refused"] == {}
    assert "cuda_graphs" not in curve.device
    # paired (the default) on a one-entry grid: nothing to pair, and the profile does not claim it was
    r = invoke("profile", "latency", "--random-weights", "--arch", "tiny", "--draft-arch", "tiny", "--context", "8",
               "--max-tokens", "1", "--max-draft-tokens", "1", "--max-repeats", "2", "--rounds", "1", "-o", out)
    assert r.exit_code == 0, r.output
    assert load_latency(out).source.startswith("measured by treeopt profile latency (1 round) with RANDOM")
    assert "RANDOM" in r.output


def test_random_weight_shapes_get_a_default_file_named_by_their_presets(tmp_path, monkeypatch):
    """Without -o the file was 'tiny__tiny (random weights)-latency.yaml': the draft's part kept the label's
    suffix (the target's did not), a path of spaces and parentheses that an unquoted -l broke on."""
    monkeypatch.chdir(tmp_path)
    r = invoke("profile", "latency", "--random-weights", "--arch", "tiny", "--draft-arch", "tiny", "--context", "8",
               "--max-tokens", "1", "--max-draft-tokens", "1", "--max-repeats", "2", "--rounds", "1", "--no-loop")
    assert r.exit_code == 0, r.output
    assert [p.name for p in (tmp_path / "profiles").rglob("*.yaml")] == ["tiny__tiny-latency.yaml"]


def test_profile_latency_random_weights_takes_a_quantized_checkpoints_config(tmp_path):
    """--arch config.json with --random-weights times a shape: an AWQ / GPTQ checkpoint's config.json gives its
    architecture (no weights are read; --weights int4 times int4 linears), as before the loader refused a
    quantization_config for the weights it cannot read."""
    import json

    from sequoia_opt.model.config import ModelConfig
    from sequoia_opt.model.hf import hf_config_dict

    cfg = hf_config_dict(ModelConfig.preset("tiny"))
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128}
    arch = tmp_path / "config.json"
    arch.write_text(json.dumps(cfg))
    out = tmp_path / "lat.yaml"
    r = invoke("profile", "latency", "--random-weights", "--arch", arch, "--context", "8", "--max-tokens", "2",
               "--max-repeats", "2", "--rounds", "1", "--unpaired", "-o", out)
    assert r.exit_code == 0, r.output
    assert load_latency(out).model["random_weights"] is True


EXAMPLE_ACCEPTANCE = Path(__file__).parents[1] / "profiles" / "example" / "acceptance.yaml"


def test_solve_refuses_a_vector_of_another_length(tmp_path):
    out = tmp_path / "t.yaml"
    r = invoke("solve", "-a", EXAMPLE_ACCEPTANCE, "--width", "3", "-o", out)
    assert r.exit_code == 2 and "--width 3" in r.output
    assert not out.exists()
    r = invoke("solve", "-a", EXAMPLE_ACCEPTANCE, "--budget", "8", "--max-depth", "3", "-o", out)
    assert r.exit_code == 0 and out.exists()


def test_run_warns_when_the_tree_was_solved_for_another_device_or_pair(workdir, tmp_path):
    from sequoia_opt.tree import TreeMetadata

    root, target, draft, prompts = workdir
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2), TreeMetadata(extra={"profiled_device": "NVIDIA H200", "profiled_dtype": "bfloat16",
                                                       "profiled_target": "target", "profiled_draft": "draft"}))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts, "--num-prompts", "1",
               "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    warnings = json.loads(r.stdout)["warnings"]
    assert any("NVIDIA H200" in w for w in warnings) and any("bfloat16" in w for w in warnings)
    assert len(warnings) == 2  # device and dtype differ; the pair (target, draft) matches


@pytest.mark.parametrize("args, message", [
    (["--backend", "foo"], "unknown attention backend"),
    (["--backend", "cuda"], "needs CUDA tensors"),
    (["--temperature", "nan"], "temperature must be"),
    (["--top-p", "1.5"], "top_p must be"),
    (["--num-prompts", "0"], "at least 1"),
])
def test_run_refuses_bad_options_before_loading_models(workdir, tmp_path, args, message):
    root, target, draft, prompts = workdir
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--results-dir", tmp_path / "res", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output
    assert not (tmp_path / "res").exists()


def test_run_gives_duplicate_tree_names_distinct_rows(workdir, tmp_path):
    root, target, draft, prompts = workdir
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(2))
    r = invoke("run", "--tree", tree, "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    assert [s["tree"] for s in json.loads(r.stdout)["summaries"]] == ["plain", "t", "t#2"]


def test_profile_latency_few_repeats_and_too_long_context(workdir, tmp_path):
    root, target, draft, _ = workdir
    out = tmp_path / "lat.yaml"
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
               "--max-draft-tokens", "2", "--max-repeats", "2", "-o", out)
    assert r.exit_code == 0, r.output
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "100000", "-o", tmp_path / "x.yaml")
    assert r.exit_code == 2 and "exceeds" in r.output and not (tmp_path / "x.yaml").exists()
    r = invoke("profile", "latency", "--target", target, "--arch", "tiny", "-o", tmp_path / "y.yaml")
    assert r.exit_code == 2 and "--random-weights" in r.output


def test_solve_output_errors_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file" / "t.yaml", tmp_path, "/dev/null"):
        r = invoke("solve", "-a", EXAMPLE_ACCEPTANCE, "--budget", "4", "--max-depth", "2", "-o", out)
        assert r.exit_code == 2, (out, r.output)
        assert "cannot write" in r.output and "Traceback" not in r.output
    binary = tmp_path / "acc.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    r = invoke("solve", "-a", binary)
    assert r.exit_code == 2 and "not a UTF-8 text file" in r.output


def test_progress_is_one_line_per_stage_when_output_is_not_a_terminal(workdir, tmp_path):
    root, target, draft, _ = workdir
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
               "--max-draft-tokens", "2", "--max-repeats", "1", "--rounds", "1", "-o", tmp_path / "lat.yaml")
    assert r.exit_code == 0, r.output
    stages = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert len(stages) == 3, r.stderr  # one line as each stage starts, not one per measured point
    assert re.fullmatch(r"\[ *\d+\.\d s\] target forward \(1/2\)", stages[0]), stages
    assert re.fullmatch(r"\[ *\d+\.\d s\] draft forward \(1/2\)", stages[1]), stages
    assert re.fullmatch(r"\[ *\d+\.\d s\] loop step \(static\) \(1/1\)", stages[2]), stages  # --loop (issue 31)


def test_run_compare_says_when_the_latency_profile_limits_the_baselines(workdir, tmp_path):
    root, target, draft, prompts = workdir
    acc, lat, tree = tmp_path / "acc.yaml", tmp_path / "lat.yaml", tmp_path / "big.yaml"
    acc.write_text("format: treeopt-acceptance/1\nacceptance: [0.6, 0.2, 0.1]\n")
    save_latency(lat, LatencyCurve.synthetic({1: 10.0, 4: 11.0, 8: 12.0}, {1: 1.0, 8: 1.5}, id="short"))
    save_tree(tree, Tree.from_choices([[0], [1], [2]] + [[i, j] for i in range(3) for j in range(3)]
                                      + [[0, 0, j] for j in range(8)]))  # 21 nodes
    r = invoke("run", "--tree", tree, "--compare", "-a", acc, "-l", lat, "--target", target, "--draft", draft,
               "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path,
               "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["baseline_notes"] == [
        "--compare baselines limited to 8 nodes (asked: 21, the largest tree): latency profile 'short' was "
        "measured up to 8 target tokens; profile more tokens (treeopt profile latency --max-tokens 21) to compare "
        "at the trees' size"]
    assert doc["baseline_notes"][0] in doc["notes"]
    sizes = {s["tree"]: s["size"] for s in doc["summaries"]}
    # the tree itself and its adaptive run (-a and -l: on by default since issue 31) start at 21 nodes
    assert sizes["big"] == sizes["big (adaptive)"] == 21
    assert all(n <= 8 for name, n in sizes.items() if not name.startswith(("plain", "big")))


def test_run_says_what_it_did_with_settings_it_could_not_follow(workdir, tmp_path):
    root, target, draft, prompts = workdir
    tree = tmp_path / "t.yaml"
    save_tree(tree, Tree.chain(3))
    n = sum(1 for line in Path(prompts).read_text().splitlines() if line.strip())
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
               "--num-prompts", n + 5, "--top-p", "0.9", "--max-new-tokens", "2", "--results-dir", tmp_path, "--json")
    assert r.exit_code == 0, r.output
    notes = json.loads(r.stdout)["notes"]
    assert f"--num-prompts {n + 5}: {prompts} holds {n} prompts; all of them were used" in notes
    assert "--top-p 0.9 applies to sampling only: greedy decoding (--temperature 0) ignores it" in notes
    r = invoke("run", "--tree", tree, "-l", tmp_path / "missing.yaml", "--target", target, "--draft", draft)
    assert r.exit_code == 2 and "add --compare" in r.output  # was: the file was never read, exit 0


def test_json_output_still_reports_progress_on_stderr(workdir, tmp_path):
    root, target, draft, _ = workdir
    r = invoke("profile", "latency", "--target", target, "--draft", draft, "--context", "8", "--max-tokens", "2",
               "--max-draft-tokens", "2", "--max-repeats", "1", "--rounds", "1", "-o", tmp_path / "lat.yaml", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["output"] == str(tmp_path / "lat.yaml")  # stdout: the JSON document alone
    assert [ln.split("] ")[1] for ln in r.stderr.splitlines() if ln.startswith("[")] == [
        "target forward (1/2)", "draft forward (1/2)", "loop step (static) (1/1)"]  # --loop: issue 31


def test_profile_acceptance_names_width_when_it_exceeds_the_vocabulary(workdir, tmp_path):
    root, target, draft, prompts = workdir
    r = invoke("profile", "acceptance", "--target", target, "--draft", draft, "--prompts", prompts, "-k", "300",
               "-o", tmp_path / "acc.yaml")
    assert r.exit_code == 2
    assert "--width 300 asks for more candidates per node than the draft's vocabulary has tokens (257)" in r.output
    assert not (tmp_path / "acc.yaml").exists()


def test_two_runs_into_one_results_folder_keep_both_files(workdir, tmp_path):
    """Two `treeopt run` calls a moment apart (the old one-second run ids made them one id, the second's JSON
    and CSV replacing the first's): both runs' files stay, each JSON naming its own run."""
    root, target, draft, prompts = workdir
    tree, res = tmp_path / "t.yaml", tmp_path / "res"
    save_tree(tree, Tree.chain(2))
    docs = []
    for _ in range(2):
        r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts,
                   "--num-prompts", "1", "--max-new-tokens", "2", "--results-dir", res, "--json")
        assert r.exit_code == 0, r.output
        docs.append(json.loads(r.stdout))
    assert docs[0]["run_id"] != docs[1]["run_id"]
    assert sorted(p.name for p in res.iterdir()) == sorted(f"{d['run_id']}{ext}" for d in docs
                                                         for ext in (".json", ".csv"))
    assert [json.loads(Path(d["json"]).read_text())["run_id"] for d in docs] == [d["run_id"] for d in docs]


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_run_refuses_a_results_dir_it_cannot_write_before_reading_anything(tmp_path, where):
    """The results folder is checked first: with a --target that does not exist, the error is still the
    results folder's (nothing is loaded or run before a results folder that cannot take the files fails)."""
    (tmp_path / "f").write_text("x")
    res = tmp_path / "f" if where == "file" else tmp_path / "f" / "res"
    r = invoke("run", "--tree", tmp_path / "missing.yaml", "--target", tmp_path / "no-model", "--results-dir", res)
    assert r.exit_code == 2, r.output
    want = "it exists and is not a folder" if where == "file" else f"{tmp_path / 'f'} is not a folder"
    assert f"--results-dir {res}: {want}" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert (tmp_path / "f").read_text() == "x"


BY_DEPTH_ACCEPTANCE = """format: treeopt-acceptance/1
id: runs
measured: {mode: greedy, positional_consistent: false}
acceptance: [0.5, 0.1, 0.05]
acceptance_by_depth:
  1: [0.2, 0.1, 0.05]
  2: [0.8, 0.05, 0.02]
  3: [0.9, 0.03, 0.01]
"""


def test_run_compare_scores_every_tree_of_its_table_with_one_value_model(workdir, tmp_path):
    """A profile whose positional check failed: solve picks the per-depth model; run --compare scores the
    baselines with it too (they used the pooled vector: a chain of gamma = 1 at 1.5 where per depth gives 1.2),
    names it in the results, and a tree file scored under another model is re-scored with a note."""
    from sequoia_opt.profiles import load_acceptance
    from sequoia_opt.solver import expected_tokens_by_depth

    root, target, draft, prompts = workdir
    acc = tmp_path / "acc.yaml"
    acc.write_text(BY_DEPTH_ACCEPTANCE)
    rows = load_acceptance(acc).depth_rows()
    solved, other = tmp_path / "solved.yaml", tmp_path / "other.yaml"
    r = invoke("solve", "-a", acc, "--budget", "6", "--max-depth", "4", "-o", solved, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["acceptance_model"] == "by-depth"
    # a tree file scored under another model (the positional one): its G is not what by-depth gives
    r = invoke("solve", "-a", acc, "--budget", "3", "--max-depth", "2", "--acceptance-model", "positional", "-o", other)
    assert r.exit_code == 0, r.output
    r = invoke("run", "--tree", solved, "--tree", other, "--compare", "-a", acc, "--target", target, "--draft",
               draft, "--prompts", prompts, "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir",
               tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["settings"]["predicted_by"] == "by-depth acceptance of profile 'runs'"
    trees = doc["settings"]["trees"]
    names = [s["tree"] for s in doc["summaries"][1:]]
    assert any(n.startswith("chain") for n in names) and len(names) >= 3
    for s in doc["summaries"][1:]:
        want = expected_tokens_by_depth(Tree.from_choices(trees[s["tree"]]), rows)
        assert s["predicted_tokens_per_step_steady"] == pytest.approx(want, rel=1e-12), s["tree"]
    chain = next(s for s in doc["summaries"] if s["tree"].startswith("chain"))
    gamma = len(trees[chain["tree"]])
    p1 = [0.2, 0.8] + [0.9] * gamma  # p_1 per depth; depths past 3 use the last row
    assert chain["predicted_tokens_per_step_steady"] == pytest.approx(sum(np.prod(p1[:j]) for j in range(gamma + 1)))
    other_tree, other_meta = load_tree(other)
    g_other = expected_tokens_by_depth(other_tree, rows)
    assert abs(other_meta.expected_tokens_per_step - g_other) > 5e-4
    assert any(n.startswith(f"tree 'other': predicted {g_other:.3f} tokens/step under by-depth acceptance of "
                            f"profile 'runs' (its file: {other_meta.expected_tokens_per_step:.3f}, positional")
               for n in doc["notes"])


def test_run_compare_drops_a_baseline_that_is_the_tree_itself(workdir, tmp_path):
    """A chain of 3 nodes as the --tree, a profile under which the best chain is that chain: one row, one
    score."""
    root, target, draft, prompts = workdir
    acc, tree = tmp_path / "acc.yaml", tmp_path / "c3.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: steep\nacceptance: [0.9, 0.01]\n")
    save_tree(tree, Tree.chain(3))
    r = invoke("run", "--tree", tree, "--compare", "-a", acc, "--target", target, "--draft", draft, "--prompts",
               prompts, "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    names = [s["tree"] for s in doc["summaries"]]
    assert not any(n.startswith("chain") for n in names) and names[:2] == ["plain", "c3"]
    assert "--compare: the best chain gamma=2 is tree 'c3' itself; it runs once, under that name" in doc["notes"]
    c3 = doc["summaries"][1]
    assert c3["predicted_tokens_per_step_steady"] == pytest.approx(1 + 0.9 + 0.81)


def test_render_prints_brackets_as_written(capsys):
    """Paths and settings may hold [brackets] (``-o 'o/x[/y]z.json'``, ``[start, end, K]``): printed literally; rich
    read them as markup and crashed on an unmatched closing tag after the file was written, or dropped the text."""
    from rich.console import Console

    from sequoia_opt.cli.render import render
    from sequoia_opt.report import Report

    report = Report("plan [bold]x", summary={"output [/y]": "o/x[/y]z.json"},
                    tables=[("t [red]", ["name", "ranges [lo, hi]"], [["a[/]", "[1, 7]"]])],
                    notes=["wrote o/[bold]x.json"], warnings=["still takes [start, end, K] entries"])
    con = Console(width=200, force_terminal=False)
    render(report, False, console=con)
    out, err = capsys.readouterr()
    for text in ("plan [bold]x", "output [/y]", "o/x[/y]z.json", "t [red]", "ranges [lo, hi]", "a[/]", "[1, 7]",
                 "note: wrote o/[bold]x.json"):
        assert text in out, text
    assert "warning: still takes [start, end, K] entries" in err


def _short_context_draft(draft: Path, out: Path, context: int) -> Path:
    """A copy of ``draft`` whose config says its context is ``context`` tokens (weights unchanged)."""
    import shutil

    shutil.copytree(draft, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = context
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def test_a_draft_with_a_shorter_context_than_the_requests_is_refused_or_named(workdir, tmp_path):
    """A draft whose context ends before the prompts do drafts nothing there: profile acceptance wrote a profile
    of one trial (exit 0) and run showed 1.00 tokens/step without a word. Now: a draft that reads no prompt is
    refused before decoding (nothing written); one that covers part of the requests is profiled with a warning
    giving the share of steps that drafted nothing (kept in the profile), and run names the share of positions
    past the draft's context."""
    root, target, draft, prompts = workdir
    shortest = min(len(json.loads(ln)["prompt"]) for ln in Path(prompts).read_text().splitlines() if ln.strip())
    short = _short_context_draft(draft, tmp_path / "short", shortest - 8)
    out = tmp_path / "acc.yaml"
    r = invoke("profile", "acceptance", "--target", target, "--draft", short, "--prompts", prompts, "--width", "3",
               "--depth", "3", "--max-new-tokens", "40", "-o", out)
    assert r.exit_code == 2 and not out.exists(), r.output
    assert (f"no acceptance trial: the measurement tree (depth 3) fits at no position (the drafter's context is "
            f"{shortest - 8} tokens; the shortest prompt is ") in r.output
    r = invoke("profile", "acceptance", "--target", target, "--draft", short, "--prompts", prompts, "--chains",
               "--max-new-tokens", "20", "-o", out)  # teacher-forced chains: the same refusal
    assert r.exit_code == 2 and not out.exists() and f"--chains: the draft's context is {shortest - 8} tokens" in r.output
    mid = _short_context_draft(draft, tmp_path / "mid", 60)
    r = invoke("profile", "acceptance", "--target", target, "--draft", mid, "--prompts", prompts, "--chains",
               "--max-new-tokens", "20", "-o", tmp_path / "chains.yaml", "--json")
    assert r.exit_code == 0, r.output
    assert any(re.match(r"\d+ of \d+ positions \(\d+%\) lie past the draft's context \(60 tokens\)", w)
               for w in json.loads(r.stdout)["warnings"]), r.stdout
    r = invoke("profile", "acceptance", "--target", target, "--draft", mid, "--prompts", prompts, "--width", "3",
               "--depth", "3", "--max-new-tokens", "40", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    prof = load_acceptance(out)
    undrafted, steps = prof.measured["undrafted_steps"], prof.measured["steps"]
    assert 0.05 * steps <= undrafted < steps
    assert (f"{undrafted} of {steps} steps ({undrafted / steps:.0%}) drafted nothing: the measurement tree did not "
            "fit (the drafter's context is 60 tokens)") in " ".join(json.loads(r.stdout)["warnings"])
    tree = tmp_path / "chain.yaml"
    save_tree(tree, Tree.chain(3))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", mid, "--prompts", prompts, "--max-new-tokens", "40",
               "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    assert any(w.startswith("the draft's context is 60 tokens (max_position_embeddings), shorter than these requests")
               for w in json.loads(r.stdout)["warnings"])
    r = invoke("run", "--tree", tree, "--target", target, "--draft", draft, "--prompts", prompts, "--max-new-tokens", "8",
               "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0 and not any("draft's context" in w for w in json.loads(r.stdout)["warnings"]), r.output


def test_profiles_refuse_an_output_they_cannot_write_before_measuring(workdir, tmp_path, monkeypatch):
    """profile latency / acceptance -o onto a folder, '-' or under a file measured for minutes and then failed to
    save; now refused first, in one line, exit 2, nothing written."""
    root, target, draft, prompts = workdir
    (tmp_path / "afile").write_text("x")
    monkeypatch.chdir(tmp_path)
    for out, why in ((tmp_path, "it is a folder (give a file name in it)"), ("-", "give a file name"),
                     ("", "an output path is empty or '.' (the current folder): give a file name"),
                     (tmp_path / "afile" / "p.yaml", f"{tmp_path / 'afile'} is not a folder")):
        for cmd in (["latency", "--context", "16", "--max-tokens", "4"],
                    ["acceptance", "--prompts", prompts, "--width", "2", "--depth", "2", "--max-new-tokens", "4"]):
            r = invoke("profile", *cmd, "--target", target, "--draft", draft, "-o", out)
            assert r.exit_code == 2 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
            assert "Traceback" not in r.output and "%" not in r.output  # no progress bar: nothing measured
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    mine = tmp_path / "mine.jsonl"  # -o onto the --prompts file replaced the user's prompts with the profile
    mine.write_text('{"prompt": "def add(a, b):"}\n')
    r = invoke("profile", "acceptance", "--target", target, "--draft", draft, "--prompts", mine, "--max-new-tokens",
               "1", "-o", mine)
    assert r.exit_code == 2 and f"-o {mine} is the --prompts input" in r.output
    assert mine.read_text() == '{"prompt": "def add(a, b):"}\n'


def test_an_output_folder_that_takes_no_file_is_refused_before_measuring(tmp_path, monkeypatch):
    """Root passes os.access on /proc or a read-only mount: profile acceptance -o /proc/x.yaml measured for 20 s and
    then failed. The folder is probed by making (and removing) a file in it first."""
    import tempfile

    from sequoia_opt.cli.common import check_output
    from sequoia_opt.errors import OutputError

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=re.escape(f"cannot write {tmp_path / 'p.yaml'}: a file cannot be made in "
                                                    f"{tmp_path} (Read-only file system)")):
        check_output(tmp_path / "p.yaml", {})
    monkeypatch.undo()
    check_output(tmp_path / "p.yaml", {})  # a folder that takes files: no probe file is left behind
    assert list(tmp_path.iterdir()) == []


def test_a_results_folder_that_takes_no_file_is_refused_before_the_run(tmp_path, monkeypatch):
    """run --results-dir /proc/nope ran the whole generation, then failed writing its CSV (the measurements lost):
    the folder, or the one it would be made in, is probed first."""
    import tempfile

    from sequoia_opt.cli.common import _check_results_dir
    from sequoia_opt.errors import OutputError

    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")

    (tmp_path / "old").mkdir()
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(OutputError, match=re.escape(f"--results-dir {tmp_path / 'new' / 'run'}: cannot create it: a "
                                                    f"file cannot be made in {tmp_path} (Read-only file system)")):
        _check_results_dir(tmp_path / "new" / "run")
    with pytest.raises(OutputError, match=re.escape(f"--out-dir {tmp_path / 'old'}: a file cannot be made in "
                                                    f"{tmp_path / 'old'} (Read-only file system)")):
        _check_results_dir(tmp_path / "old", "--out-dir")
    monkeypatch.undo()
    _check_results_dir(tmp_path / "new" / "run")  # nothing made: the run makes its folder when it writes
    _check_results_dir(tmp_path / "old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"] and list((tmp_path / "old").iterdir()) == []


def test_a_prompt_too_long_for_the_context_is_refused_naming_its_file(workdir, tmp_path):
    """'prompt 1 of 1 (600 tokens): ...' did not say which file the prompt was in; then not which line."""
    root, target, draft, prompts = workdir
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"prompt": "x" * 700}) + "\n")  # the tiny pair's byte tokenizer: 700 tokens, context 512
    tree = save_tree(tmp_path / "t.yaml", Tree.from_choices([[0], [1]]))
    r = invoke("run", "--target", target, "--draft", draft, "--tree", tree, "--prompts", long, "--max-new-tokens",
               "8", "--results-dir", tmp_path / "res")
    assert r.exit_code == 2
    assert f"{long}:1: prompt 1 of 1 (" in " ".join(r.output.split())


def test_a_near_greedy_temperature_is_said_to_waste_the_trees_width():
    """A tryout sampled at --temperature 1e-9: the draft's softmax underflowed to one-hot, its siblings carried no
    mass and were accepted 0 of 40 times (1.71 tokens/step against 2.14 greedy), with no word why."""
    from sequoia_opt.cli.common import NEAR_GREEDY, setting_notes

    kw = dict(top_p=1.0, num_prompts=None, prompts_found=3, prompts_file="p.jsonl")
    (note,) = setting_notes(temperature=1e-9, **kw)
    assert note.startswith("--temperature 1e-09 is near greedy") and "--temperature 0 decodes greedily" in note
    assert setting_notes(temperature=NEAR_GREEDY, **kw) == setting_notes(temperature=0.7, **kw) == []
    assert setting_notes(temperature=0.0, **kw) == []


def test_an_unwritable_output_folder_says_whether_its_file_system_is_read_only(tmp_path, monkeypatch):
    """A tryout's read-only mount was blamed on permissions ('this user cannot write into ...')."""
    import os
    from types import SimpleNamespace

    from sequoia_opt.cli.common import check_output
    from sequoia_opt.errors import OutputError

    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=os.ST_RDONLY))
    with pytest.raises(OutputError, match=f"^cannot write {tmp_path / 'x.yaml'}: {tmp_path} is on a read-only file "
                                          "system$"):
        check_output(tmp_path / "x.yaml", {})
    monkeypatch.setattr(os, "statvfs", lambda p: SimpleNamespace(f_flag=0))
    with pytest.raises(OutputError, match=f"^cannot write {tmp_path / 'x.yaml'}: this user cannot write into "
                                          f"{tmp_path}$"):
        check_output(tmp_path / "x.yaml", {})
