"""Every drafter through the CLI: ``--draft PATH | self:L | lookup[:MIN-MAX]`` parsed and checked before any
weights load, then profile latency -> profile acceptance -> solve -> run on a tiny HF-checkpoint pair, with
profiles that name the drafter and its cost model and greedy output equal to plain decoding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from tiny_pair import byte_tokenizer, make_pair, other_tokenizer, random_model  # noqa: E402

import sequoia_opt.jobs.load as pipeline  # noqa: E402
from sequoia_opt.cli import app  # noqa: E402
from sequoia_opt.errors import CheckpointError, TreeoptError  # noqa: E402
from sequoia_opt.model.hf import save_hf_checkpoint  # noqa: E402
from sequoia_opt.jobs.load import DrafterSpec, check_drafter, drafter_slug, parse_drafter_spec  # noqa: E402
from sequoia_opt.profiles import load_acceptance, load_latency  # noqa: E402
from sequoia_opt.solver import choose  # noqa: E402
from sequoia_opt.tree import Tree, load_tree, save_tree  # noqa: E402

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    target, draft, prompts = make_pair(root)
    return root, target, draft, prompts


# ------------------------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize("text, kind, label, cost, extra", [
    ("self:3", "self", "self:3", "per-level", {"num_layers": 3}),
    (" SELF:12 ", "self", "self:12", "per-level", {"num_layers": 12}),
    ("lookup", "lookup", "lookup:1-3", "one-pass", {"lookup_min": 1, "lookup_max": 3}),
    ("lookup:5", "lookup", "lookup:1-5", "one-pass", {"lookup_min": 1, "lookup_max": 5}),
    ("lookup:2-4", "lookup", "lookup:2-4", "one-pass", {"lookup_min": 2, "lookup_max": 4}),
    ("lookup:2-2", "lookup", "lookup:2-2", "one-pass", {"lookup_min": 2, "lookup_max": 2}),
])
def test_parse_drafter_spec_keywords(text, kind, label, cost, extra):
    spec = parse_drafter_spec(text)
    assert spec.kind == kind and spec.label == label and spec.cost_model == cost
    for key, value in extra.items():
        assert getattr(spec, key) == value
    assert parse_drafter_spec(spec.spec) == spec  # the spec text gives the same drafter back


def test_parse_drafter_spec_paths(tmp_path):
    ckpt = tmp_path / "my-draft"
    ckpt.mkdir()
    assert parse_drafter_spec(str(ckpt)) == DrafterSpec("model", path=ckpt)
    assert parse_drafter_spec(f"model:{ckpt}") == DrafterSpec("model", path=ckpt)
    assert parse_drafter_spec(ckpt).label == "my-draft"
    default = parse_drafter_spec(None)
    assert default.kind == "model" and default.path is None and default.label == "treeopt-smollm2-draft"
    assert parse_drafter_spec("") == default
    # a folder literally named like a keyword is still reachable through model:PATH
    (tmp_path / "lookup").mkdir()
    assert parse_drafter_spec(f"model:{tmp_path / 'lookup'}").kind == "model"


def test_the_bundled_checkpoints_keep_their_names_read_from_a_clone_or_a_copy(tmp_path):
    """The bundled draft was named treeopt-smollm2-draft only at the installed path: read from a clone's
    sequoia_opt/data/draft (the README's --draft example) it was 'draft', and the profiles shipped for it were
    refused as another drafter's. A folder of the same name with the same weights is the bundled one; other
    weights, or another name, are not."""
    from sequoia_opt.drafting.registry import _bundled_eagle3
    from sequoia_opt.model.loaders import bundled_draft_path

    def linked(src, dst):  # the same files, at another path (a clone's copy)
        dst.mkdir(parents=True)
        for f in src.iterdir():
            (dst / f.name).symlink_to(f)
        return dst

    clone = tmp_path / "clone" / "sequoia_opt" / "data"
    draft, head = linked(bundled_draft_path(), clone / "draft"), linked(_bundled_eagle3(), clone / "eagle3")
    assert parse_drafter_spec(str(draft)).label == "treeopt-smollm2-draft"
    assert parse_drafter_spec(f"eagle3:{head}").label == "eagle3:treeopt-smollm2-eagle3"
    renamed = linked(bundled_draft_path(), tmp_path / "mine")
    assert parse_drafter_spec(str(renamed)).label == "mine"
    other = tmp_path / "other" / "draft"  # the same name, other weights
    other.mkdir(parents=True)
    (other / "config.json").write_text((bundled_draft_path() / "config.json").read_text())
    (other / "model.safetensors").write_bytes(b"\0" * 64)
    assert parse_drafter_spec(str(other)).label == "draft"


@pytest.mark.parametrize("text, message", [
    ("self", "needs L"),
    ("self:", "needs L"),
    ("self:0", "must be at least 1, got 0"),
    ("self:-2", "must be at least 1, got -2"),
    ("self:two", "must be an integer, got 'two'"),
    ("lookup:0", "must be at least 1, got 0"),
    ("lookup:0-3", "smallest n-gram size in lookup:MIN-MAX must be at least 1, got 0"),
    ("lookup:3-1", "the smallest n-gram size (3) is larger than the largest (1)"),
    ("lookup:1-2-3", "write lookup, lookup:MAX or lookup:MIN-MAX"),
    ("lookup:x", "must be an integer, got 'x'"),
    ("/no/such/checkpoint", "nor KIND:PATH for "),
    ("medusa:4", "'medusa:4': 4 does not exist (the checkpoint folder of medusa:PATH)"),
])
def test_parse_drafter_spec_refuses(text, message):
    with pytest.raises(TreeoptError) as err:
        parse_drafter_spec(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_drafter_slug_has_no_colons():
    assert drafter_slug("self:6") == "self-L6"
    assert drafter_slug("lookup:1-3") == "lookup-1-3"
    assert drafter_slug("treeopt-smollm2-draft") == "treeopt-smollm2-draft"


def test_check_drafter_against_the_target_config(workdir, tmp_path):
    root, target, draft, _ = workdir
    from sequoia_opt.model.loaders import load_model_config

    cfg = load_model_config(target)
    assert cfg.n_layers == 2
    check_drafter(parse_drafter_spec("self:1"), cfg)  # 1 .. n_layers - 1
    with pytest.raises(TreeoptError, match=r"L must be in 1\.\.1 \(the target has 2 layers"):
        check_drafter(parse_drafter_spec("self:2"), cfg)
    with pytest.raises(TreeoptError, match=r"the target has 1 layer, .* it needs a target of at least 2"):
        check_drafter(parse_drafter_spec("self:1"), cfg.with_(n_layers=1))  # 'L must be in 1..0' before
    check_drafter(parse_drafter_spec(str(draft)), cfg)
    padded = tmp_path / "padded"  # the target's tokenizer, an embedding padded to 300 rows: fitted at load
    save_hf_checkpoint(random_model(3, vocab=300), byte_tokenizer(), padded)
    check_drafter(parse_drafter_spec(str(padded)), cfg, target)
    other = tmp_path / "other"
    save_hf_checkpoint(random_model(3), other_tokenizer(), other)
    check_drafter(parse_drafter_spec(str(other)), cfg)  # the config alone cannot tell
    with pytest.raises(CheckpointError, match=r"mismatched tokenizers: target target \(257 tokens\) and draft "
                                              r"other \(257 tokens\) differ at id 0 \('!' against "):
        check_drafter(parse_drafter_spec(str(other)), cfg, target)
    check_drafter(parse_drafter_spec("lookup"), cfg)  # nothing to check against a config


# ------------------------------------------------------------------------------------------------ bad input, CLI
@pytest.mark.parametrize("spec, message", [
    ("self:2", "L must be in 1..1"),
    ("self:0", "must be at least 1"),
    ("lookup:0", "must be at least 1"),
    ("nothing-here", "names nothing known"),
])
@pytest.mark.parametrize("command", ["latency", "acceptance", "run"])
def test_bad_drafter_exits_2_before_weights_load(workdir, tmp_path, monkeypatch, spec, message, command):
    root, target, draft, prompts = workdir

    def no_weights(*a, **k):
        raise AssertionError("weights were loaded before the drafter was checked")

    monkeypatch.setattr(pipeline, "load_checkpoint", no_weights)
    monkeypatch.setattr("sequoia_opt.model.loaders.load_checkpoint", no_weights)
    out = tmp_path / "out.yaml"
    if command == "run":
        tree = tmp_path / "t.yaml"
        save_tree(tree, Tree.chain(2))
        args = ["run", "--tree", tree, "--results-dir", tmp_path / "res"]
    else:
        args = ["profile", command, "-o", out]
    r = invoke(*args, "--target", target, "--draft", spec, "--prompts", prompts) if command != "latency" else \
        invoke(*args, "--target", target, "--draft", spec)
    assert r.exit_code == 2, r.output
    assert message in r.output and r.output.count("\n") == 1
    assert not out.exists() and not (tmp_path / "res").exists()


# ------------------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("spec, cost_model", [("self:1", "per-level"), ("lookup", "one-pass"),
                                              ("lookup:2-4", "one-pass")])
def test_profile_solve_run_with_each_drafter(workdir, tmp_path, spec, cost_model):
    root, target, draft, prompts = workdir
    label = parse_drafter_spec(spec).label
    lat, acc, tree, res = tmp_path / "lat.yaml", tmp_path / "acc.yaml", tmp_path / "tree.yaml", tmp_path / "res"
    r = invoke("profile", "latency", "--target", target, "--draft", spec, "--context", "16", "--max-tokens", "8",
               "--max-repeats", "5", "--rounds", "1", "-o", lat, "--json")
    assert r.exit_code == 0, r.output
    curve = load_latency(lat)
    assert curve.cost_model == cost_model and curve.model["draft"] == label
    # a one-pass drafter is charged c(n - 1): its draft curve covers the target's token range by default
    assert curve.max_draft_tokens() == (8 if cost_model == "one-pass" else 64)
    assert all(curve.draft_ms(w) > 0 for w in (1, 4, 8))
    summary = json.loads(r.stdout)
    assert summary["profile"]["curves"][0]["draft"]["cost_model"] == cost_model

    r = invoke("profile", "acceptance", "--target", target, "--draft", spec, "--prompts", prompts, "-k", "3",
               "--depth", "3", "--max-new-tokens", "20", "-o", acc, "--json")
    assert r.exit_code == 0, r.output
    prof = load_acceptance(acc)
    assert prof.measured["draft"] == label and prof.measured["draft_cost_model"] == cost_model
    assert prof.num_samples > 0 and 0 <= prof.acceptance.sum() <= 1

    r = invoke("solve", "-a", acc, "-l", lat, "--budget", "8", "--max-depth", "4", "--max-branching", "3", "-o",
               tree, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    t, meta = load_tree(tree)
    want = choose(prof.acceptance, curve, 8, 4, 3)
    assert t.choices() == want.tree.choices()
    assert meta.extra["profiled_draft"] == label and meta.extra["profiled_draft_cost_model"] == cost_model
    assert not [w for w in doc.get("warnings", []) if "cost model" in w]

    r = invoke("run", "--tree", tree, "--target", target, "--draft", spec, "--prompts", prompts,
               "--max-new-tokens", "12", "--num-prompts", "3", "--results-dir", res, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["greedy_ok"] is True and doc["settings"]["draft"] == label
    assert doc["settings"]["draft_cost_model"] == cost_model
    assert [s["mismatches"] for s in doc["summaries"]] == [0, 0]
    assert all(s["new_tokens"] == 3 * 12 for s in doc["summaries"])
    assert not [w for w in doc.get("warnings", []) if "was solved from profiles" in w]


def test_solve_warns_when_the_profiles_describe_different_drafters(workdir, tmp_path):
    root, target, draft, prompts = workdir
    lat, acc = tmp_path / "lat.yaml", tmp_path / "acc.yaml"
    assert invoke("profile", "latency", "--target", target, "--draft", "lookup", "--context", "16", "--max-tokens",
                  "4", "--max-repeats", "5", "--rounds", "1", "-o", lat).exit_code == 0
    assert invoke("profile", "acceptance", "--target", target, "--draft", "self:1", "--prompts", prompts, "-k", "2",
                  "--depth", "2", "--max-new-tokens", "8", "--num-prompts", "2", "-o", acc).exit_code == 0
    r = invoke("solve", "-a", acc, "-l", lat, "--budget", "4", "--json")
    assert r.exit_code == 0, r.output
    warnings = json.loads(r.stdout)["warnings"]
    assert any("drafter has cost model 'per-level' but the latency profile charges 'one-pass'" in w for w in warnings)
    assert any("draft 'self:1' differs from the latency profile's 'lookup:1-3'" in w for w in warnings)


def test_empty_model_path_is_refused_and_dot_is_named_by_its_folder(workdir, monkeypatch):
    root, target, draft, _ = workdir
    with pytest.raises(TreeoptError, match="names no checkpoint"):
        parse_drafter_spec("model:")
    monkeypatch.chdir(draft)
    assert parse_drafter_spec(".").label == "draft"
    assert parse_drafter_spec("model:.").label == "draft"


def test_two_draft_checkpoints_get_their_own_default_latency_files(workdir):
    from sequoia_opt.jobs.load import default_latency_path

    root, target, draft, _ = workdir
    other = root / "draft-b"
    other.mkdir(exist_ok=True)
    a = default_latency_path("t", parse_drafter_spec(str(draft)), "cpu")
    b = default_latency_path("t", parse_drafter_spec(str(other)), "cpu")
    assert a == Path("profiles/cpu/t__draft-latency.yaml") and b == Path("profiles/cpu/t__draft-b-latency.yaml")
    assert default_latency_path("t", parse_drafter_spec("self:3"), "cpu").name == "t__self-L3-latency.yaml"


def test_another_precision_gets_its_own_default_latency_file():
    from sequoia_opt.jobs.load import default_latency_path, precision_suffix

    assert precision_suffix() == "" and precision_suffix(torch.float32, "float32") == ""
    assert precision_suffix(torch.bfloat16) == "-bfloat16" and precision_suffix("float32", "int8") == "-int8"
    assert precision_suffix("bfloat16", "int8") == "-bfloat16-int8"
    spec = parse_drafter_spec("lookup")
    assert default_latency_path("t", spec, "cpu", precision_suffix("float32", "int4")) == \
        Path("profiles/cpu/t__lookup-1-3-int4-latency.yaml")


@pytest.mark.parametrize("args, what", [(["--draft", "self:1", "--context", "480"], "self:1 draft model"),
                                        (["--context", "500", "--max-draft-tokens", "16"], "draft model"),
                                        (["--draft", "lookup", "--context", "510"], "target model")])
def test_profile_latency_checks_every_width_against_the_context_before_timing(workdir, tmp_path, monkeypatch,
                                                                               args, what):
    root, target, draft, _ = workdir
    import sequoia_opt.profiling.latency as latency

    monkeypatch.setattr(latency, "profile_model", lambda *a, **k: pytest.fail("timed before the sizes were checked"))
    out = tmp_path / "lat.yaml"
    full = ["--draft", str(draft)] + args if "--draft" not in args else args
    r = invoke("profile", "latency", "--target", target, "--max-tokens", "4", "-o", out, *full)
    assert r.exit_code == 2, r.output
    assert f"exceeds the {what}'s context of 512 tokens" in r.output and not out.exists()


def test_run_warns_when_a_tree_was_solved_for_another_cost_model(workdir, tmp_path):
    root, target, draft, prompts = workdir
    tree = tmp_path / "t.yaml"
    from sequoia_opt.tree import TreeMetadata

    save_tree(tree, Tree.chain(3), TreeMetadata(extra={"profiled_draft": "lookup:1-3",
                                                       "profiled_draft_cost_model": "per-level"}))
    r = invoke("run", "--tree", tree, "--target", target, "--draft", "lookup", "--prompts", prompts,
               "--num-prompts", "1", "--max-new-tokens", "4", "--results-dir", tmp_path / "res", "--json")
    assert r.exit_code == 0, r.output
    warnings = json.loads(r.stdout)["warnings"]
    assert any("draft_cost_model 'per-level', but this run uses 'one-pass'" in w for w in warnings)
    assert not any("with draft 'lookup:1-3'" in w for w in warnings)


def test_a_tree_solved_for_a_copy_of_the_same_weights_is_not_flagged_as_another_drafter():
    """A copy of a checkpoint under another folder name (``cp -r draft dcopy``) has the same weights: a tree solved
    from the original's profiles warned 'measured with draft 'draft', but this run uses 'dcopy''. Equal
    fingerprints are the same drafter; other weights, or a record without fingerprints, still warn."""
    from sequoia_opt.jobs.entries import tree_mismatch_warnings
    from sequoia_opt.tree import TreeMetadata

    rec = {"target": {"path": "/m/t", "fingerprint": "aa"}, "draft": {"path": "/m/draft", "fingerprint": "bb"}}
    meta = TreeMetadata(extra={"profiled_draft": "draft", "profiled_weights": rec})
    kw = dict(device="cpu x", dtype="float32", target="t", draft="dcopy")
    copy = {"target": rec["target"], "draft": {"path": "/m/dcopy", "fingerprint": "bb"}}
    assert tree_mismatch_warnings("tree", meta, weights=copy, **kw) == []
    other = {"target": rec["target"], "draft": {"path": "/m/dcopy", "fingerprint": "cc"}}
    said = tree_mismatch_warnings("tree", meta, weights=other, **kw)
    assert said[0] == ("tree 'tree' was solved from profiles measured with draft 'draft', but this run uses 'dcopy': "
                       "its predicted figures describe that setting") and "other weights" in said[1]
    assert tree_mismatch_warnings("tree", meta, weights=None, **kw)[0].startswith("tree 'tree' was solved from "
                                                                                   "profiles measured with draft")


def test_an_output_over_a_file_of_an_input_checkpoint_is_refused(workdir, tmp_path):
    """-o into the target's or the draft's own folder replaced its weights or config with a YAML profile, exit 0
    (a tryout); -o equal to an input file was already refused. A file that exists inside an input checkpoint folder
    is refused, before any model loads, and left as it was; a drafter given as kind:PATH is its PATH."""
    import shutil

    from feature_heads import write_medusa

    root, target, draft, prompts = workdir
    tgt = Path(shutil.copytree(target, tmp_path / "target"))
    weights = next(tgt.glob("*.safetensors"))
    before = weights.read_bytes()
    r = invoke("profile", "acceptance", "-t", tgt, "--draft", draft, "--prompts", prompts, "--max-new-tokens", "4",
               "-o", weights)
    assert r.exit_code == 2 and weights.read_bytes() == before
    assert f"-o {weights} is a file of the --target input ({tgt}): written over, the checkpoint would be lost" in \
        " ".join(r.output.split())
    conf = Path(draft) / "config.json"
    text = conf.read_text()
    r = invoke("profile", "latency", "-t", target, "--draft", draft, "--max-tokens", "4", "--context", "16",
               "--rounds", "1", "-o", conf)
    assert r.exit_code == 2 and "is a file of the --draft input" in " ".join(r.output.split())
    assert conf.read_text() == text
    md = write_medusa(tmp_path / "md")
    r = invoke("profile", "acceptance", "-t", target, "--draft", f"medusa:{md}", "--prompts", prompts,
               "--max-new-tokens", "4", "-o", md / "config.json")
    assert r.exit_code == 2 and "is a file of the --draft input (medusa:" in " ".join(r.output.split())
    # tune names --target and --draft too (its -o wrote a vLLM config over the target's config.json, exit 0)
    table = tmp_path / "t.csv"
    table.write_text("batch,tokens,target_ms,draft_ms\n" + "".join(f"1,{n},{10 + 0.1 * n},0.5\n" for n in range(1, 6)))
    acc = tmp_path / "acc.yaml"
    acc.write_text("format: treeopt-acceptance/1\nid: a\nmeasured: {mode: greedy, temperature: 0.0}\n"
                   "acceptance: [0.6, 0.1]\ncounts: [600, 100, 300]\n")
    conf = tgt / "config.json"
    text = conf.read_text()
    for flag in ("-o", "--schedule"):
        r = invoke("tune", "--engine", "vllm", "-l", table, "-a", acc, "--target", tgt, "--draft", draft, flag, conf)
        assert r.exit_code == 2 and f"{flag} {conf} is a file of the --target input" in " ".join(r.output.split())
    assert conf.read_text() == text
    # a new file beside the checkpoint's own is not one of them: written
    r = invoke("profile", "acceptance", "-t", target, "--draft", draft, "--prompts", prompts, "--max-new-tokens", "4",
               "--num-prompts", "1", "-o", tgt / "acceptance.yaml")
    assert r.exit_code == 0, r.output


def test_profiles_of_a_copy_of_the_same_weights_are_the_same_drafters():
    """A tryout: a copy of the draft under another folder name (same fingerprint) still drew 'measured with draft
    'draft', but this run uses 'draftcopy'' from --compare (twice: acceptance and latency), and run --dynamic refused
    the calibration as 'another pair'. Equal fingerprints settle it; other weights still warn and refuse."""
    import numpy as np

    from sequoia_opt.errors import SolverError
    from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve, warn_on_mismatch
    from sequoia_opt.profiles.calibration import same_pair

    rec = {"target": {"path": "/m/target", "fingerprint": "aa"}, "draft": {"path": "/m/draft", "fingerprint": "bb"}}
    acc = AcceptanceProfile(id="a", acceptance=np.array([0.6, 0.1]),
                            measured={"target": "target", "draft": "draft", "weights": rec})
    lat = LatencyCurve.synthetic({1: 10.0, 2: 10.5}, {1: 1.0})
    lat = LatencyCurve.from_dict({**{k: v for k, v in lat.to_dict().items() if k != "example"},
                                  "model": {"target": "target", "draft": "draft"}})
    copy = {"target": rec["target"], "draft": {"path": "/m/draftcopy", "fingerprint": "bb"}}
    other = {"target": rec["target"], "draft": {"path": "/m/draftcopy", "fingerprint": "cc"}}
    kw = dict(acceptance=acc, latency=lat, target="target", draft="draftcopy")
    assert warn_on_mismatch(weights=copy, **kw) == []
    said = warn_on_mismatch(weights=other, **kw)
    assert sum("was measured with draft 'draft', but this run uses 'draftcopy'" in w for w in said) == 2
    assert any("other weights" in w for w in said)
    from types import SimpleNamespace  # same_pair reads a calibration's id and measured record only

    cal = SimpleNamespace(id="c", measured={"target": "target", "draft": "draft", "temperature": 0.0, "weights": rec})
    same_pair(cal, lat, run=("target", "draftcopy"), weights=copy)  # no error: the same weights
    with pytest.raises(SolverError, match="profiles of another pair predict nothing here"):
        same_pair(cal, lat, run=("target", "draftcopy"), weights=other)
