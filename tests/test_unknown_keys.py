"""A key a file's format does not read is named in one warning, with the known key it is closest to: a misspelt
optional key (``acceptence_by_depth``, ``stops_paying_abve``, a tree node's ``drafer``) was ignored without a word,
and the file solved or ran as if the key were absent. The files treeopt ships and writes raise none."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sequoia_opt._io import safe_load_yaml
from sequoia_opt.cli import app
from sequoia_opt.drafting.policies import load_scheduler
from sequoia_opt.errors import ProfileWarning, TreeValidationError
from sequoia_opt.profiles import load_acceptance, load_latency
from sequoia_opt.profiles.batch import load_batch_latency
from sequoia_opt.profiles.calibration import load_calibration
from sequoia_opt.profiles.pair import load_pair_acceptance
from sequoia_opt.solver.schedule import load_schedule
from sequoia_opt.tree import DrafterTree, Tree, TreeMetadata, load_drafter_tree, save_drafter_tree, save_tree

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "profiles" / "example"
runner = CliRunner()


def _unknown(fn, *args) -> list[str]:
    """The unknown-key warnings ``fn(*args)`` raises (each message)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args)
    return [str(w.message) for w in caught if issubclass(w.category, ProfileWarning) and "unknown key" in str(w.message)]


def _edited(src: Path, dst: Path, edit) -> Path:
    doc = yaml.safe_load(src.read_text())
    edit(doc)
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


def test_a_misspelt_profile_key_is_named_with_the_key_it_resembles(tmp_path):
    acc = _edited(EXAMPLE / "acceptance.yaml", tmp_path / "a.yaml",
                  lambda d: d.__setitem__("acceptence_by_depth", {1: d["acceptance"]}))
    assert _unknown(load_acceptance, acc) == [
        f"{acc}: unknown key 'acceptence_by_depth' (did you mean 'acceptance_by_depth'?): ignored"]
    # a nested place is named by its path; a key near nothing gets no guess
    lat = _edited(EXAMPLE / "latency.yaml", tmp_path / "l.yaml",
                  lambda d: (d["curves"][0].__setitem__("loops", {}), d.__setitem__("comment", "mine")))
    assert sorted(_unknown(load_latency, lat)) == sorted([
        f"{lat}: curves[0]: unknown key 'loops' (did you mean 'loop'?): ignored",
        f"{lat}: unknown key 'comment': ignored"])
    # the value read is the one without the key: the misspelt per-depth vectors were not used
    with pytest.warns(ProfileWarning, match="acceptence_by_depth"):
        assert not load_acceptance(acc).by_depth


def test_a_misspelt_schedule_key_is_named(tmp_path):
    doc = {"format": "treeopt-schedule/1", "stops_paying_abve": 8, "ranges": [
        {"batch_range": [1, 8], "setting": {"shape": "chain", "draft_tokens": 2}, "predicted_": None},
        {"batch_range": [9, 64], "setting": {"shape": "none"}}]}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert sorted(_unknown(load_schedule, path)) == sorted([
        f"{path}: unknown key 'stops_paying_abve' (did you mean 'stops_paying_above'?): ignored",
        f"{path}: ranges[0]: unknown key 'predicted_' (did you mean 'predicted'?): ignored"])


def test_a_misspelt_tree_node_key_is_named_once_at_its_first_node(tmp_path):
    """``drafer: 1`` on a node read as drafter 0 (the light drafter) with no word: the grafted tree ran without its
    strong drafter."""
    path = tmp_path / "t.yaml"
    path.write_text("format: treeopt-tree/2\nmetdata: {}\ndrafters: [a, b]\nnodes:\n"
                    "  - {parent: -1, rank: 0}\n  - {parent: 0, rank: 0, drafer: 1}\n  - {parent: 0, rank: 1, drafer: 1}\n")
    assert _unknown(load_drafter_tree, path) == [
        f"{path}: unknown key 'metdata' (did you mean 'metadata'?): ignored",
        f"{path}: node 1: unknown key 'drafer' (did you mean 'drafter'?): ignored"]


def test_the_cli_prints_the_warning_and_goes_on(tmp_path):
    acc = _edited(EXAMPLE / "acceptance.yaml", tmp_path / "a.yaml", lambda d: d.__setitem__("exampel", True))
    res = runner.invoke(app, ["solve", "--acceptance", str(acc), "--latency", str(EXAMPLE / "latency.yaml"),
                              "--budget", "8", "-o", str(tmp_path / "tree.yaml")])
    assert res.exit_code == 0, res.output
    assert f"warning: {acc}: unknown key 'exampel' (did you mean 'example'?): ignored" in " ".join(res.output.split())
    assert (tmp_path / "tree.yaml").is_file()


_LOADERS = {"treeopt-acceptance/1": load_acceptance, "treeopt-latency/1": load_latency,
            "treeopt-latency-batch/1": load_batch_latency, "treeopt-calibration/1": load_calibration,
            "treeopt-acceptance-pair/1": load_pair_acceptance, "treeopt-schedule/1": load_schedule,
            "treeopt-tree/1": load_drafter_tree, "treeopt-tree/2": load_drafter_tree,
            "treeopt-scheduler/1": load_scheduler}


def test_the_files_treeopt_ships_and_writes_hold_no_unknown_key():
    """Every profile, plan and tree shipped (the package's data, profiles/) or recorded by a benchmark (results/)
    loads without an unknown-key warning: the known keys of each format are complete. The recorded files are the
    writers' own output at many versions (the larger ones were checked once by hand, 2026-12-05)."""
    seen: dict[str, int] = {}
    # files under 100 KB: every format has some, and the recorded calibration profiles of 0.3-0.8 MB took 20 s
    for path in sorted(p for d in ("sequoia_opt/data", "profiles", "results") for p in (ROOT / d).rglob("*")
                       if p.suffix in (".yaml", ".json") and p.stat().st_size < 100_000):
        text = path.read_text(encoding="utf-8")
        try:
            doc = json.loads(text) if path.suffix == ".json" else safe_load_yaml(text)  # libyaml's: fast
        except (ValueError, yaml.YAMLError):
            continue  # not a treeopt format (a benchmark's CSV-like log)
        fmt = doc.get("format") if isinstance(doc, dict) else None
        if fmt not in _LOADERS:
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                _LOADERS[fmt](path)
            except TreeValidationError as err:  # two recorded scheduled trees carry the graft tree's max_depth
                assert "tree-scheduled.yaml" in str(path) and "is beyond the limit" in str(err), err
        unknown = [str(w.message) for w in caught if "unknown key" in str(w.message)]
        assert unknown == [], unknown
        seen[fmt] = seen.get(fmt, 0) + 1
    assert set(seen) == set(_LOADERS) and sum(seen.values()) > 200, seen


def test_a_batch_plan_solve_writes_reads_back_without_a_warning(tmp_path):
    """No batch plan (treeopt-batch-trees/1) is shipped: one written by solve --batch is read back instead."""
    from sequoia_opt.solver.batch import load_plan

    out = tmp_path / "plan.yaml"
    res = runner.invoke(app, ["solve", "--acceptance", str(EXAMPLE / "acceptance.yaml"), "--latency",
                              str(EXAMPLE / "tbn-roofline.csv"), "--batch", "1,8", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert _unknown(load_plan, out) == [] and [lo for lo, _, _ in load_plan(out)] == [1, 8]


def test_a_tree_is_not_saved_with_metadata_it_contradicts(tmp_path):
    """benchmarks/graft.py saved the scheduled tree with the graft tree's metadata (max_depth 6 on a tree of depth
    7): a file its own loader refused. The writers now read the text back first; nothing is written."""
    tree = Tree.from_choices([[0], [0, 0], [0, 0, 0]])
    meta = TreeMetadata(budget=4, max_depth=2)
    for save, obj in ((save_tree, tree), (save_drafter_tree, DrafterTree(tree, [0] * tree.size, ("d",)))):
        path = tmp_path / f"{save.__name__}.yaml"
        with pytest.raises(TreeValidationError, match="depth 3 is beyond the limit 2"):
            save(path, obj, meta)
        assert not path.exists()
        save(path, obj, TreeMetadata(budget=4, max_depth=3))
        assert path.is_file()


def test_a_json_tree_export_reads_back_without_a_warning(tmp_path):
    """The JSON export adds ``derived`` (figures recomputed from the nodes, ignored on import): a known key."""
    from sequoia_opt.exports import export_tree, load_any_tree

    tree = Tree.from_choices([[0], [1], [0, 0]])
    path = tmp_path / "tree.json"
    path.write_text(export_tree(tree, "json", acceptance=[0.6, 0.2]))
    assert "derived" in json.loads(path.read_text())
    assert _unknown(load_any_tree, path) == []
    assert load_any_tree(path)[0] == tree


def test_a_json_document_carries_the_files_warnings(tmp_path):
    """--json printed the command's own warnings; a file's (an unknown key, an implausible curve) went to stderr
    only, so a program reading the JSON never saw them. They are in its 'warnings' list now, once each."""
    acc = _edited(EXAMPLE / "acceptance.yaml", tmp_path / "a.yaml", lambda d: d.__setitem__("exampel", True))
    res = runner.invoke(app, ["solve", "--acceptance", str(acc), "--latency", str(EXAMPLE / "latency.yaml"),
                              "--budget", "8", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    said = f"{acc}: unknown key 'exampel' (did you mean 'example'?): ignored"
    assert doc["warnings"].count(said) == 1, doc["warnings"]
