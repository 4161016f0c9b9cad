"""The held-out code prompts of the prediction benchmarks (``benchmarks/data/code-heldout.jsonl``, written by
``benchmarks/make_code_prompts.py``): code of the demo sets' kind that neither the shipped draft model nor the
shipped EAGLE-3 head ever trained on, and that no shipped prompt set holds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from sequoia_opt.distill.data import EXCLUDED_DIRS, collect_sources
from sequoia_opt.distill.eagle3 import check_disjoint
from sequoia_opt.prompts import demo_prompts_path, load_prompts

REPO = Path(__file__).resolve().parents[1]
HELDOUT = REPO / "benchmarks" / "data" / "code-heldout.jsonl"
DRAFT_LOG = REPO / "sequoia_opt" / "data" / "draft" / "training_log.json"
HEAD_LOG = REPO / "sequoia_opt" / "data" / "eagle3" / "training_log.json"


def _rows() -> list[dict]:
    return [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]


def _make_code_prompts():
    spec = importlib.util.spec_from_file_location("make_code_prompts", REPO / "benchmarks" / "make_code_prompts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_prompt_comes_from_a_folder_training_skips_one_file_each():
    rows = _rows()
    assert len(rows) == 99
    dirs = [r["source"].split("/")[1] for r in rows]  # "python3.11/idlelib/..." -> "idlelib"
    assert set(dirs) == {"ensurepip", "idlelib", "lib2to3", "turtledemo"} <= EXCLUDED_DIRS
    assert len({r["source"] for r in rows}) == len(rows)  # one prefix per file
    assert not any("test" in r["source"] for r in rows)  # no test folder (idle_test, lib2to3/tests) or test file
    assert len({r["prompt"] for r in rows}) == len(rows)
    assert all(r["prompt"].endswith("\n") and r["prompt"].strip() for r in rows)  # whole lines, as make_prompt


def test_no_prompt_is_in_a_shipped_set_or_a_training_file_list():
    texts = set(load_prompts(HELDOUT))
    for name in ("profile", "eval", "chat"):
        assert not texts & set(load_prompts(demo_prompts_path(name))), name
    sources = {r["source"].split("/", 1)[1] for r in _rows()}
    draft = json.loads(DRAFT_LOG.read_text(encoding="utf-8"))["data"]
    head = json.loads(HEAD_LOG.read_text(encoding="utf-8"))["data"]
    trained = set(draft["train_files_used"]) | set(head["train_files_used"])
    assert len(trained) > 300
    assert not sources & trained
    # nor is any of them a file the draft's split held out for its own profile / eval sets
    assert not sources & (set(draft["split"]["profile"]) | set(draft["split"]["eval"]))


def test_the_draft_models_training_text_does_not_hold_any_prompt():
    log = json.loads(DRAFT_LOG.read_text(encoding="utf-8"))["data"]
    root = Path(log["stdlib_root"])
    files = [root / f for f in log["train_files_used"]]
    if not all(f.is_file() for f in files):
        pytest.skip(f"the training text (this Python's standard library under {root}) is not on this machine")
    checked = check_disjoint([f.read_text(encoding="utf-8", errors="replace") for f in files], [HELDOUT])
    assert checked == {str(HELDOUT): 99}


def test_held_out_files_keep_to_the_folders_and_skip_tests_and_small_files(tmp_path: Path):
    mod = _make_code_prompts()
    for rel, size in [("idlelib/editor.py", 3000), ("idlelib/idle_test/test_editor.py", 3000),
                      ("idlelib/tiny.py", 100), ("lib2to3/tests/data/x.py", 5000), ("lib2to3/fixer_base.py", 2500),
                      ("json/decoder.py", 4000), ("turtledemo/clock.py", 2000)]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x" * size)
    assert mod.held_out_files(tmp_path) == ["idlelib/editor.py", "lib2to3/fixer_base.py", "turtledemo/clock.py"]
    # and none of them is a file the training data collects
    assert not set(mod.held_out_files(tmp_path)) & set(collect_sources(tmp_path))
