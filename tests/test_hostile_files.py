"""Hostile and careless input files (a break-it pass over every reader of a user's file): each is one line and
exit 2, never a crash, a hang, or a silent misreading."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sequoia_opt._io import MAX_NESTING, deep_nesting_at, load_json, safe_load_yaml
from sequoia_opt.cli import app
from sequoia_opt.errors import ProfileError, TreeValidationError
from sequoia_opt.profiles import load_acceptance, load_latency
from sequoia_opt.prompts import PromptFileError, load_prompts
from sequoia_opt.tree import Tree, TreeMetadata, load_tree, tree_to_yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_ACC = ROOT / "profiles" / "example" / "acceptance.yaml"
EXAMPLE_LAT = ROOT / "profiles" / "example" / "latency.yaml"
TABLE = ROOT / "profiles" / "example" / "tbn-roofline.csv"
runner = CliRunner()


def _example(**changes) -> dict:
    doc = yaml.safe_load(EXAMPLE_ACC.read_text())
    doc.update(changes)
    return doc


# ------------------------------------------------------------------------------------------------ nesting
def test_nesting_is_measured_past_the_limit_only():
    assert deep_nesting_at("[" * MAX_NESTING + "]" * MAX_NESTING) is None
    assert deep_nesting_at("x: " + "[" * (MAX_NESTING + 1)) == 3 + MAX_NESTING
    assert deep_nesting_at("[]" * 10_000) is None  # many brackets, shallow
    with pytest.raises(yaml.YAMLError, match=f"nested deeper than {MAX_NESTING} levels"):
        safe_load_yaml("a: 1\nb: " + "[" * 30_000 + "]" * 30_000)
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        load_json("[" * 100_000 + "]" * 100_000)
    # JSON is parsed, not scanned: brackets inside strings are text, however many prompts leave one open
    assert len(load_json(json.dumps([f"row_{i} = {{'id': {i}, 'tags': [" for i in range(500)]))) == 500


def test_a_deeply_nested_profile_is_one_line_not_a_segfault(tmp_path):
    """PyYAML's C parser overflowed the stack at 30,000 levels: the process died (exit 139) with no message. Run
    in a process of its own, so a regression kills that process, not the test run."""
    deep = tmp_path / "deep.yaml"
    deep.write_text("format: treeopt-acceptance/1\nacceptance: [0.5]\nx: " + "[" * 30_000 + "]" * 30_000 + "\n")
    r = subprocess.run([sys.executable, "-m", "sequoia_opt", "solve", "-a", str(deep), "-l", str(EXAMPLE_LAT),
                        "--budget", "8"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 2, (r.returncode, r.stderr[-500:])
    assert f"{deep}: not valid YAML (line 3, column " in r.stderr and "nested deeper than 200 levels" in r.stderr


def test_deep_tree_and_prompt_files_are_one_line(tmp_path):
    tree = tmp_path / "t.yaml"
    tree.write_text("format: treeopt-tree/1\nnodes: " + "[" * 30_000 + "]" * 30_000 + "\n")
    with pytest.raises(TreeValidationError, match="nested deeper"):
        load_tree(tree)
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "x"}\n{"prompt": "x", "m": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(PromptFileError, match=r"p.jsonl:2: not valid JSON \(nested too deeply\)"):
        load_prompts(jsonl)
    code = tmp_path / "code.json"  # completion prompts that stop inside a bracket: 500 open ones in strings
    code.write_text(json.dumps([f"row_{i} = {{'id': {i}, 'tags': [" for i in range(500)]))
    assert len(load_prompts(code)) == 500
    big = tmp_path / "big.jsonl"
    big.write_text('{"prompt": "x", "n": ' + "9" * 5000 + "}\n")
    with pytest.raises(PromptFileError, match="big.jsonl:1: not valid JSON"):
        load_prompts(big)


# ------------------------------------------------------------------------------------------------ prompts
def test_a_lone_surrogate_is_refused_when_the_prompts_are_read(tmp_path):
    """JSON's \\ud800 without its pair decodes to a str no tokenizer takes: a TypeError after the models loaded."""
    for line in ('{"prompt": "def f(\\ud800): pass"}',
                 '{"messages": [{"role": "user", "content": "x\\udfff"}]}'):
        f = tmp_path / "s.jsonl"
        f.write_text(line + "\n")
        with pytest.raises(PromptFileError, match=r"s.jsonl:1: the prompt holds .* lone UTF-16 surrogate"):
            load_prompts(f)
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"prompt": "a pair is text: \\ud83d\\ude00"}\n')
    assert load_prompts(ok)[0].text == "a pair is text: \U0001F600"


# ------------------------------------------------------------------------------------------------ profiles
def test_a_depth_of_two_billion_is_refused_at_once(tmp_path):
    """acceptance_by_depth {2147483647: ...} built one row per depth: minutes and gigabytes, no output."""
    f = tmp_path / "a.yaml"
    vec = yaml.safe_load(EXAMPLE_ACC.read_text())["acceptance"]
    f.write_text(yaml.safe_dump(_example(acceptance_by_depth={2147483647: vec})))
    t0 = time.perf_counter()
    with pytest.raises(ProfileError, match="acceptance_by_depth key"):
        load_acceptance(f)
    assert time.perf_counter() - t0 < 5
    f.write_text(yaml.safe_dump(_example(acceptance_by_depth={4096: vec})))
    assert set(load_acceptance(f).by_depth) == {4096}


@pytest.mark.parametrize("value", ["false", "no", 0, [], "true"])
def test_positional_consistent_must_be_a_boolean(tmp_path, value):
    """'false' (text) was read as true: the solver's acceptance model turned, its prediction 26 % higher."""
    doc = _example()
    doc.setdefault("measured", {})["positional_consistent"] = value
    f = tmp_path / "a.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="positional_consistent .* must be true or false"):
        load_acceptance(f)


def test_probabilities_written_as_text_are_refused(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text(yaml.safe_dump(_example(acceptance=["0.6", "0.1"])))
    with pytest.raises(ProfileError, match=r"holds text where probabilities belong \(write 0.62, not '0.62'\)"):
        load_acceptance(f)


def test_a_profile_written_as_json_reads_as_its_yaml(tmp_path):
    """YAML 1.1 read JSON's 3e-05 as text, and JSON's keys are text: per-depth vectors could not be written as
    JSON at all. A JSON object is now read by JSON's rules; a key given twice is still refused."""
    lat = yaml.safe_load(EXAMPLE_LAT.read_text())
    lat["step_overhead_ms"] = 3e-05
    (tmp_path / "l.json").write_text(json.dumps(lat))
    assert load_latency(tmp_path / "l.json").step_overhead_ms == 3e-05
    vec = yaml.safe_load(EXAMPLE_ACC.read_text())["acceptance"]
    doc = _example(acceptance_by_depth={1: vec, 2: vec})
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "a.json").write_text(json.dumps(doc))
    a, b = load_acceptance(tmp_path / "a.yaml"), load_acceptance(tmp_path / "a.json")
    assert set(b.by_depth) == {1, 2} and (b.depth_rows() == a.depth_rows()).all()
    (tmp_path / "twice.json").write_text('{"format": "treeopt-acceptance/1", "acceptance": [0.5], '
                                        '"acceptance": [0.9]}')
    with pytest.raises(ProfileError, match="given twice"):
        load_acceptance(tmp_path / "twice.json")


def test_a_calibration_temperature_must_be_a_number(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_dynamic_cli import _calibration

    from sequoia_opt.profiles.calibration import load_calibration

    f = _calibration(tmp_path / "cal.yaml")
    # the acceptance profile's words (one check, profiles.common._number)
    for key, value, message in (("temperature", "hot", "temperature must be a number, got 'hot'"),
                                ("temperature", -0.5, "temperature = -0.5 must be non-negative"),
                                ("top_p", 1.5, "top_p = 1.5 must be in (0, 1]")):
        doc = yaml.safe_load(f.read_text())
        doc["measured"][key] = value
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(doc))
        with pytest.raises(ProfileError, match=re.escape(f"{bad}: measured.{message}")):
            load_calibration(bad)
    doc = yaml.safe_load(f.read_text())
    doc["steps"][0]["entropy"] = [-1.0 if x is not None else None for x in doc["steps"][0]["entropy"]]
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match=r"entropy\[\d+\] = -1.0 must be >= 0"):
        load_calibration(bad)


# ------------------------------------------------------------------------------------------------ plans
@pytest.fixture
def plan(tmp_path):
    out, sched = tmp_path / "spec.json", tmp_path / "plan.yaml"
    r = runner.invoke(app, ["tune", "--engine", "vllm", "-a", str(EXAMPLE_ACC), "-l", str(TABLE), "--batches",
                            "1,4", "-o", str(out), "--schedule", str(sched)])
    assert r.exit_code == 0, r.output
    return sched


@pytest.mark.parametrize("key, value, message", [
    ("method", 5, "method = 5 must be a name"),
    ("method", ["ngram"], "must be a name"),
    ("draft_model", {"a": 1}, "draft_model = {'a': 1} must be a name"),
    ("lookup", [5, 2], r"lookup = \[5, 2\] must be \[MIN, MAX\] n-gram sizes"),
    ("lookup", [-3, 0], "n-gram sizes"),
    ("lookup", [1.9, 2.9], "n-gram sizes"),
    ("lookup", [None, None], "n-gram sizes"),
    ("lookup", [1, 4611686018427387904], "MAX <= 2147483647"),
])
def test_a_plans_drafter_settings_are_checked_before_they_reach_an_engine(plan, tmp_path, key, value, message):
    """tune --plan wrote a plan's lookup = [-3, 0] into vLLM's config, exported method: 5 with a traceback."""
    doc = yaml.safe_load(plan.read_text())
    doc[key] = value
    plan.write_text(yaml.safe_dump(doc))
    out = tmp_path / "again.json"
    r = runner.invoke(app, ["tune", "--engine", "vllm", "-a", str(EXAMPLE_ACC), "-l", str(TABLE), "--batches", "1,4",
                            "--plan", str(plan), "-o", str(out)])
    assert r.exit_code == 2 and not out.exists()
    assert len(r.output.strip().splitlines()) == 1
    import re
    assert re.search(message, " ".join(r.output.split())), r.output


# ------------------------------------------------------------------------------------------------ tree metadata
@pytest.mark.parametrize("extra, message", [
    ({"node_rates": ["abc", 0.5]}, "node_rates must list probabilities in"),
    ({"node_rates": [5.0, 0.5]}, "node_rates must list probabilities in"),
    ({"node_rates": 0.5}, "node_rates must list probabilities in"),
    ({"end_overshoot_tokens": 1e300}, "end_overshoot_tokens = 1e\\+300 must be a number in 0..2"),
    ({"budget_limit": "abc"}, "budget_limit = 'abc' must be an integer"),
    ({"max_branching": 0}, "max_branching = 0 must be an integer"),
    ({"tokens_per_step_spread": "x"}, "tokens_per_step_spread must be a mapping"),
])
def test_a_trees_run_metadata_is_checked_when_read(tmp_path, extra, message):
    """A bad node_rates failed run after the decoding, its results lost; 1e300 tokens per step was shown."""
    t = Tree.from_choices([[0], [0, 0]])  # 3 nodes, depth 2
    f = tmp_path / "t.yaml"
    f.write_text(tree_to_yaml(t, TreeMetadata(budget=3, max_depth=2, extra=extra)))
    with pytest.raises(TreeValidationError, match=message):
        load_tree(f)
    f.write_text(tree_to_yaml(t, TreeMetadata(budget=3, max_depth=2, expected_tokens_per_step=1e300)))
    with pytest.raises(TreeValidationError, match="a tree of depth 2 emits at most 3 tokens per step"):
        load_tree(f)
    f.write_text(tree_to_yaml(t, TreeMetadata(budget=3, max_depth=2, expected_tokens_per_step=2.5, extra={
        "node_rates": [0.6, 0.5], "end_overshoot_tokens": 0.4, "budget_limit": 3, "max_branching": 1})))
    assert load_tree(f)[1].extra["node_rates"] == [0.6, 0.5]


@pytest.mark.parametrize("args", [
    ["solve", "-a", str(EXAMPLE_ACC), "-l", str(EXAMPLE_LAT)],
    ["tune", "--engine", "vllm", "-a", str(EXAMPLE_ACC), "-l", str(TABLE)],
    ["tune", "--engine", "treeopt", "--schedule"],
    ["profile", "acceptance"],
    ["profile", "latency"],
    ["profile", "scheduler", "--draft", "lookup", "--draft", "self:1", "--tree", "t.yaml"],
    ["export-draft", "--gguf"],
])
@pytest.mark.parametrize("name", ["newf/", "newf//", "newf/.", "sub/newf/.."])
def test_an_output_file_spelt_as_a_folder_is_refused_and_nothing_is_written(tmp_path, monkeypatch, args, name):
    """``-o newf/`` for a folder that does not exist wrote a FILE named ``newf`` (pathlib drops the slash): every
    option naming an output file (-o, tune's --schedule, export-draft --gguf) refuses it before anything runs, as
    it refuses a folder that exists: one line, exit 2, nothing made."""
    monkeypatch.chdir(tmp_path)
    flag = [] if args[-1] in ("--schedule", "--gguf") else ["-o"]
    r = runner.invoke(app, [*args, *flag, name])
    assert r.exit_code == 2, r.output
    assert f"{name} ends in " in r.output and "which names a folder: give a file name" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_output_file_in_a_new_folder_is_still_written(tmp_path):
    out = tmp_path / "new" / "tree.yaml"
    r = runner.invoke(app, ["solve", "-a", str(EXAMPLE_ACC), "-l", str(EXAMPLE_LAT), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert load_tree(out)[0].size > 1
