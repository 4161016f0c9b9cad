"""The GPU check script (benchmarks/gpu_check.py, gpu_check.sh) on a CPU: argument parsing, its float64
reference, the correctness grid, the goal verdicts and a full --dry-run writing JSON."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sequoia_opt.attention import TreeMask, tree_attention

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0
    assert "--dry-run" in proc.stdout and "--steps" in proc.stdout


def test_shell_wrapper_parses():
    proc = subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_parse_args_rejects_unknown_step(gc):
    with pytest.raises(SystemExit):
        gc.parse_args(["--steps", "correctness,nope"])
    args = gc.parse_args(["--steps", "bench", "--quick"])
    assert args.steps == ["bench"] and args.quick


def test_full_grid_covers_every_combination(gc):
    args = gc.parse_args([])
    cases = gc.correctness_cases(args)
    combos = {(c["T"], c["L"], c["group"], c["D"], c["dtype"]) for c in cases}
    assert len(combos) == 5 * 5 * 3 * 2 * 2
    assert any(c["m"] > c["T"] for c in cases) and any(c["B"] == 2 for c in cases)
    assert any(c["num_splits"] == 1 for c in cases) and any(c["num_splits"] == 100000 for c in cases)


def test_naive_reference_matches_torch_reference(gc):
    gen = torch.Generator().manual_seed(5)
    T, m, L, D = 7, 44, 129, 64
    q = torch.randn(2, 8, T, D, generator=gen)
    k = torch.randn(2, 2, L + m + 3, D, generator=gen)
    v = torch.randn(2, 2, L + m + 3, D, generator=gen)
    dense = gc.tree_rows(T, m, gen)
    assert dense.shape == (T, m) and dense.diagonal(m - T).all()  # each query sees itself
    ref = gc.naive_attention_f64(q, k, v, L, dense, 0.1)
    out = tree_attention(q, k, v, L, TreeMask.from_dense(dense), scale=0.1, backend="torch")
    assert gc.rel_err(out, ref) < 1e-5


def test_ancestor_mask_is_the_tree(gc):
    parents = [-1, 0, 0, 1, 3]
    dense = gc.ancestor_mask(parents)
    assert dense.tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [True, False, True, False, False],
        [True, True, False, True, False],
        [True, True, False, True, True],
    ]


def test_goals_verdicts(gc):
    bench = {"rows": [
        {"n": 64, "L": 4096, "copy_fraction": 0.75, "speedup_vs_sdpa": 1.4, "speedup_vs_flex": 1.1},
        {"n": 16, "L": 16384, "copy_fraction": 0.5},
        {"n": 16, "L": 1024, "copy_fraction": 0.1},
    ]}  # fmt: skip
    verdicts = {g["goal"]: g["status"] for g in gc.goals(bench)}
    assert verdicts[">= 70% of copy bandwidth at n=64 L=4096"] == "PASS"
    assert verdicts[">= 70% of copy bandwidth at n=16 L=16384"] == "MISS"
    assert not any("L=1024" in g for g in verdicts)  # the bandwidth goal is for L >= 4096 only
    assert verdicts[">= 1.5x faster than SDPA dense mask at n=64 L=4096"] == "MISS"
    assert verdicts["not slower than FlexAttention at n=64 L=4096"] == "PASS"
    assert gc.goals(None)[0]["status"] == "NOT RUN"


def test_dry_run_writes_json_and_table(gc, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path / "device_out"))
    rc = gc.main(["--dry-run", "--out", str(tmp_path / "gpu"), "--reps", "3", "--budget-s", "120"])
    assert rc == 0
    names = {p.name for p in (tmp_path / "gpu").iterdir()}
    assert {"environment.json", "correctness.json", "bench.json", "profile.json", "summary.json"} <= names
    assert names <= {p.name for p in (tmp_path / "device_out").iterdir()}  # copied to $OUT
    summary = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert summary["correctness"]["passed"] and summary["correctness"]["complete"]
    assert summary["exit_code"] == 0
    bench = json.loads((tmp_path / "gpu" / "bench.json").read_text())
    assert all("ours" in r and "sdpa" in r for r in bench["rows"])
    assert summary["profile"]["status"] in ("skipped", "dry-run")
    printed = capsys.readouterr().out
    assert "correctness: PASS" in printed and printed.rstrip().endswith("=" * 100)
