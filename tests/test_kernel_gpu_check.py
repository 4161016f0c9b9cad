"""The kernel check (benchmarks/gpu_check.py, run by gpu_check.sh's build and kernel stages) on a CPU: argument
parsing, its float64 reference, the correctness grid and its edge cases, the sweep's PASS / FAIL / INCOMPLETE,
the verdict that lets the profiles ask for the kernel, the goal verdicts and a full --dry-run writing JSON with
every benchmark row's error."""

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
        gc.parse_args(["--steps", "correctness,profile"])  # the profiles are gpu_check.sh stages now
    args = gc.parse_args(["--steps", "bench", "--quick"])
    assert args.steps == ["bench"] and args.quick
    assert gc.parse_args([]).steps == ["build", "correctness", "bench"]


def test_full_grid_covers_every_combination(gc):
    args = gc.parse_args([])
    cases = gc.correctness_cases(args)
    combos = {(c["T"], c["L"], c["group"], c["D"], c["dtype"]) for c in cases}
    assert len(combos) == 5 * 5 * 3 * 2 * 2
    assert any(c["m"] > c["T"] for c in cases) and any(c["B"] == 2 for c in cases)
    assert any(c["num_splits"] == 1 for c in cases) and any(c["num_splits"] == 100000 for c in cases)
    # shuffled: the first fifth (what a short budget runs) already spans every dtype, head_dim, group and L
    head = cases[: len(cases) // 5]
    for key in ("dtype", "D", "group", "L"):
        assert {c[key] for c in head} == {c[key] for c in cases}, key
    assert cases == gc.correctness_cases(args)  # the same order every run


def test_edge_cases_time_the_benchmark_head_shape_past_32k(gc):
    cases = gc.edge_cases(gc.parse_args([]))
    longs = [c for c in cases if c["L"] > 32768]
    assert longs and all(c["L"] % 2 == 1 and c["Hkv"] * c["group"] == 32 and c["Hkv"] == 8 and c["D"] == 128
                         and c["dtype"] == "bfloat16" for c in longs)
    assert {c["T"] for c in longs} == {1, 64}
    assert sum(1 for c in cases if c.get("empty_row") is not None) == 4
    graphs = [c for c in cases if c.get("graphs_layout")]
    assert graphs and all(c["L"] == 0 and c["m"] > 1900 and c["graphs_layout"][1] >= 64 for c in graphs)


def test_sweep_status_and_kernel_verdict(gc):
    ok, bad = {"passed": True}, {"passed": False}
    assert gc.sweep_status(3, [ok, ok, ok]) == "PASS"
    assert gc.sweep_status(3, [ok, ok]) == "INCOMPLETE"  # the budget ran out: not a failure
    assert gc.sweep_status(3, [ok, bad]) == "FAIL"
    corr = {"status": "INCOMPLETE", "failed": 0, "cases_run": 120, "cases_passed": 120}
    bench = {"rows": [{"n": 64, "L": 4096, "ours_ok": True}, {"n": 16, "L": 1024, "ours_ok": True}]}
    assert gc.kernel_verdict(corr, bench) == (True, "120 correctness cases passed (INCOMPLETE), 2 benchmark rows "
                                                    "within tolerance")
    bench["rows"][1]["ours_ok"] = False
    assert gc.kernel_verdict(corr, bench) == (False, "benchmark rows over tolerance: n=16 L=1024")
    assert gc.kernel_verdict({**corr, "status": "FAIL", "failed": 2}, None) == (False, "2 correctness case(s) failed")
    assert gc.kernel_verdict(None, None)[0] is False


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
    assert names == {"environment.json", "build.json", "correctness.json", "bench.json", "summary.json"}
    assert not (tmp_path / "device_out").exists()  # only gpu_check.sh's runner writes $OUT (three files)
    summary = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert summary["correctness"]["status"] == "PASS" and summary["correctness"]["complete"]
    assert summary["correctness"]["max_prefix_len"] == 337  # the long odd prefix ran
    assert summary["exit_code"] == 0 and summary["kernel_ok"] is True
    assert summary["build"]["ok"] and summary["build"]["name"].startswith("treeopt_tree_attention_")
    bench = json.loads((tmp_path / "gpu" / "bench.json").read_text())
    assert all("ours" in r and "sdpa" in r for r in bench["rows"])
    assert all(r["ours_rel_err"] < 1e-5 and r["ours_ok"] and r["sdpa_rel_err"] < 1e-5 for r in bench["rows"])
    printed = capsys.readouterr().out
    assert "correctness: PASS" in printed and printed.rstrip().endswith("=" * 100)

def test_flex_attention_is_timed_on_the_goal_row_only(gc, tmp_path, monkeypatch):
    """FlexAttention is compiled per shape (tens of seconds each): the bench times it on the goal row alone. On a
    CPU its eager form stands in for the compiled one; its output is checked against the reference."""
    import warnings

    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    calls = []

    def flex(*a, **kw):
        calls.append(a[0].shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return flex_attention(*a, **kw)

    monkeypatch.setattr(gc, "_flex_factory", lambda device: ((flex, create_block_mask), None))
    args = gc.parse_args(["--dry-run", "--reps", "3", "--steps", "bench", "--out", str(tmp_path)])
    bench = gc.step_bench(args, torch.device("cpu"), budget_s=1000.0, copy_bw=None)
    flexed = [r for r in bench["rows"] if "ms" in r["flex"]]
    assert [(r["n"], r["L"]) for r in flexed] == [(4, 64)]  # the dry run's goal row
    assert flexed[0]["flex_rel_err_vs_sdpa"] < 1e-5 and calls
    other = [r for r in bench["rows"] if r not in flexed]
    assert other and all("compiled for the goal row" in r["flex"]["error"] for r in other)
    short = gc.step_bench(args, torch.device("cpu"), budget_s=gc.FLEX_COMPILE_S - 1, copy_bw=None)
    assert "its compile may take" in short["rows"][0]["flex"]["error"]


def test_bench_rows_survive_a_kill_mid_bench(gc, tmp_path):
    """gpu_check.sh stops the kernel stage at its cap (SIGTERM): the rows timed before that must already be in
    bench.json and in summary.json (the runner's headline figures and its kernel verdict read summary.json)."""

    class Killed(BaseException):  # not an Exception: nothing in the bench catches it, as with a signal
        pass

    calls = []

    class KilledTimer(gc.Timer):
        def __call__(self, fns, use_graph=True):
            calls.append(len(fns))
            if len(calls) > 3:  # the dry run times 3 things per row (no FlexAttention on a CPU): row 2 is killed
                raise Killed
            return super().__call__(fns, use_graph)

    orig = gc.Timer
    gc.Timer = KilledTimer
    try:
        with pytest.raises(Killed):
            gc.main(["--dry-run", "--out", str(tmp_path), "--reps", "3", "--budget-s", "120"])
    finally:
        gc.Timer = orig
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert [(r["n"], r["L"]) for r in bench["rows"]] == [(4, 64)] and not bench["complete"]
    assert bench["rows"][0]["ours"]["ms"] > 0 and bench["rows"][0]["ours_ok"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["n"], r["L"]) for r in summary["bench"]["rows"]] == [(4, 64)]
    assert summary["kernel_ok"] is True and "1 benchmark rows within tolerance" in summary["kernel_why"]
    assert summary["correctness"]["status"] == "PASS"
