"""Tests for sequoia_opt.plots: every figure is a valid PNG written atomically, the tree layout is sound, and
missing optional data (no counts, one context, no run) still draws."""

from __future__ import annotations

import io
import json
import math
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sequoia_opt import plots
from sequoia_opt.errors import TreeoptError
from sequoia_opt.plots import (
    SpeedupPoints,
    TreePoint,
    acceptance_intervals,
    plot_acceptance,
    plot_all,
    plot_latency,
    plot_speedup_vs_budget,
    plot_tree,
    predicted_speedup_curve,
    speedup_points_from_run,
    tree_layout,
)
from sequoia_opt.profiles import AcceptanceProfile, LatencyCurve
from sequoia_opt.tree import Tree

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Check ``path`` is a complete PNG and return (width, height) from its IHDR chunk."""
    data = path.read_bytes()
    assert len(data) > 1000, f"{path} is suspiciously small ({len(data)} bytes)"
    assert data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    assert data[-8:-4] == b"IEND"  # complete: ends with the IEND chunk
    with Image.open(io.BytesIO(data)) as im:
        im.verify()  # CRCs and structure
    return width, height


def assert_png(path: Path, *, min_side: int = 300, max_side: int = 2500) -> None:
    w, h = png_size(path)
    assert min_side <= w <= max_side and min_side <= h <= max_side, (w, h)


def assert_no_temp_files(folder: Path) -> None:
    leftovers = [p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]
    assert not leftovers, leftovers


# ---------------------------------------------------------------------------------------------- fixtures
def latency_two_contexts() -> LatencyCurve:
    tokens = [1, 2, 4, 8, 16, 32, 64, 128]
    curves = []
    for ctx, base in ((256, 20.0), (2048, 24.0)):
        t_ms = [base if n <= 16 else base * n / 16 for n in tokens]
        curves.append({
            "context_tokens": ctx,
            "target": {"tokens": tokens, "target_forward_ms": t_ms,
                       "target_forward_spread_ms": [0.04 * v for v in t_ms]},
            "draft": {"tokens": tokens, "draft_forward_ms": [1.0 + 0.01 * n for n in tokens],
                      "draft_forward_spread_ms": [0.05] * len(tokens)},
        })
    doc = {"format": "treeopt-latency/1", "id": "two-ctx", "device": {"name": "test-device"},
           "step_overhead_ms": 0.5, "curves": curves}
    return LatencyCurve.from_dict(doc)


def latency_one_context() -> LatencyCurve:
    # one context, no spreads, smallest measured count 2 (so the ratio panel is T(n)/T(2))
    return LatencyCurve.synthetic({2: 10.0, 4: 10.5, 8: 12.0, 16: 20.0, 32: 38.0}, {2: 2.0, 8: 2.5, 32: 4.0})


def acceptance_with_counts() -> AcceptanceProfile:
    counts = np.array([600, 120, 50, 25, 15, 10, 180])
    p = counts[:-1] / counts.sum()
    return AcceptanceProfile(
        id="counted", acceptance=p, counts=counts,
        measured={"target": "tgt", "draft": "drf", "mode": "sampling", "temperature": 0.7, "top_p": 0.9},
        by_depth={1: p * 1.05, 2: p * 0.9},
    )


def acceptance_no_counts() -> AcceptanceProfile:
    return AcceptanceProfile(id="bare", acceptance=np.array([0.55, 0.15, 0.05]), example=True)


def run_report() -> dict:
    return {
        "format": "treeopt-run/1",
        "run_id": "run-test",
        "summaries": [
            {"tree": "plain", "size": 1, "depth": 0, "speedup": 1.0, "predicted_speedup": 1.0,
             "tokens_per_step": 1.0, "tps_ci95": [1.0, 1.0], "predicted_tokens_per_step": 1.0},
            {"tree": "solved", "size": 24, "depth": 5, "speedup": 1.8, "predicted_speedup": 1.9,
             "tokens_per_step": 2.6, "tps_ci95": [2.4, 2.8], "predicted_tokens_per_step": 2.7},
            {"tree": "chain", "size": 5, "depth": 4, "speedup": 1.4, "predicted_speedup": None,
             "tokens_per_step": 2.0, "tps_ci95": [math.nan, math.nan], "predicted_tokens_per_step": None},
        ],
    }


def random_tree(n: int, seed: int) -> Tree:
    rng = random.Random(seed)
    parent, rank, nchild = [-1], [0], [0]
    for i in range(1, n):
        p = rng.randrange(i)
        parent.append(p)
        rank.append(nchild[p])
        nchild[p] += 1
        nchild.append(0)
    return Tree.from_edges(parent, rank)


# ---------------------------------------------------------------------------------------------- layout
@pytest.mark.parametrize(
    "tree",
    [
        Tree.chain(6),
        Tree.from_choices([[0], [1], [2], [3]]),
        Tree.from_choices([[0], [1], [0, 0], [0, 1], [0, 0, 0], [1, 0], [0, 1, 0], [0, 1, 1]]),
        random_tree(40, 1),
        random_tree(256, 2),
    ],
    ids=["chain", "star", "asymmetric", "random40", "random256"],
)
def test_tree_layout_centres_children_and_separates_leaves(tree: Tree) -> None:
    x, y = tree_layout(tree)
    assert x.shape == y.shape == (tree.size,)
    np.testing.assert_array_equal(x, tree.depth)
    leaves = [v for v in range(tree.size) if not tree.children[v]]
    ly = sorted(y[leaves])
    assert len(set(ly)) == len(leaves)  # distinct leaves
    assert ly == list(range(len(leaves)))  # packed: 0, 1, 2, ...
    for v in range(tree.size):
        ch = tree.children[v]
        if ch:
            assert y[v] == pytest.approx(np.mean(y[list(ch)]))  # children centred on their parent
            assert all(y[a] < y[b] for a, b in zip(ch, ch[1:]))  # siblings in rank order
    # subtrees do not overlap: each node's subtree leaves form a contiguous, disjoint y range
    for v in range(tree.size):
        ch = tree.children[v]
        for a, b in zip(ch, ch[1:]):
            sub_a = [u for u in range(tree.size) if a in tree.paths[u]]
            sub_b = [u for u in range(tree.size) if b in tree.paths[u]]
            assert max(y[sub_a]) < min(y[sub_b])


def test_tree_layout_root_only() -> None:
    x, y = tree_layout(Tree.chain(1))
    assert x.tolist() == [0.0] and y.tolist() == [0.0]


# ---------------------------------------------------------------------------------------------- run points
def test_speedup_points_from_run() -> None:
    pts = speedup_points_from_run(run_report())
    assert [t.name for t in pts.trees] == ["solved", "chain"]  # plain (the 1x reference) is left out
    solved, chain = pts.trees
    assert (solved.size, solved.speedup, solved.predicted_speedup) == (24, 1.8, 1.9)
    assert solved.tps_ci95 == (2.4, 2.8) and solved.predicted_tokens_per_step == 2.7
    assert chain.predicted_speedup is None and chain.tps_ci95 is None  # null and NaN become "unknown"
    assert pts.predicted == [] and "run-test" in pts.title
    # the JSON written by RunReport.save (NaN spelled NaN) reads back the same
    again = speedup_points_from_run(json.loads(json.dumps(run_report())))
    assert again.trees == pts.trees
    with pytest.raises(TreeoptError, match="summaries"):
        speedup_points_from_run({"format": "treeopt-run/1"})
    with pytest.raises(TreeoptError, match="size"):
        speedup_points_from_run({"summaries": [{"tree": "x", "size": 0}]})


def test_predicted_speedup_curve_matches_hardware_choice() -> None:
    from sequoia_opt.solver.hardware import choose

    curve = LatencyCurve.synthetic({1: 10.0, 4: 10.5, 8: 12.0, 16: 20.0, 32: 38.0}, {1: 2.0, 8: 2.5, 32: 4.0})
    p = [0.6, 0.15, 0.05]
    pts = predicted_speedup_curve(p, curve, 32, 6, budgets=[2, 4, 8, 16, 32, 64])
    assert [b for b, _ in pts] == [2, 4, 8, 16, 32]  # 64 is past the measured range: dropped, not extrapolated
    assert all(s > 0 for _, s in pts)
    default = predicted_speedup_curve(p, curve, 32, 6)
    best = choose(p, curve, 32, 6)
    assert max(s for _, s in default) == pytest.approx(best.speedup)


def test_predicted_speedup_curve_skips_the_trees_below_a_draft_table_that_starts_at_a_block() -> None:
    # a one-pass block drafter timed from 4 drafted tokens: choose skips the trees of 1..3 drafted tokens; the plot's
    # curve raised "draft forward at 1 tokens is below the smallest measured count 4 tokens" (treeopt plot failed
    # on a profile solve takes)
    from sequoia_opt.solver.hardware import choose

    target = {t: 10.0 + 0.01 * t for t in (1, 2, 4, 8, 16, 32)}
    curve = LatencyCurve.synthetic(target, {4: 1.0, 8: 1.1, 16: 1.2, 32: 1.3}, cost_model="one-pass")
    p = [0.6, 0.15, 0.05, 0.02]
    pts = predicted_speedup_curve(p, curve, 32, 6)
    assert pts[0] == (1, pytest.approx(1.0))  # plain decoding: no draft forward
    assert all(b >= 5 for b, _ in pts[1:]) and len(pts) > 1  # budgets 2..4 hold no tree c(w) prices: left out
    assert max(s for _, s in pts) == pytest.approx(choose(p, curve, 32, 6).speedup)


# ---------------------------------------------------------------------------------------------- figures
def test_plot_all_with_everything(tmp_path: Path) -> None:
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(run_report()))
    out = tmp_path / "figs"
    acc = acceptance_with_counts()
    written = plot_all(
        out,
        latency=latency_two_contexts(),
        acceptance=acc,
        run=run_json,  # a path to the run JSON works like the dict
        tree=Tree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
        predicted=[(1, 1.0), (4, 1.5), (8, 1.8), (16, 1.95), (32, 1.9)],
    )
    assert [p.name for p in written] == ["latency.png", "acceptance.png", "speedup_vs_budget.png", "tree.png"]
    for p in written:
        assert p.parent == out
        assert_png(p)
    assert sorted(x.name for x in out.iterdir()) == sorted(p.name for p in written)
    assert_no_temp_files(out)
    w, h = png_size(out / "latency.png")
    assert w > 2 * h  # three panels side by side
    assert plot_all(tmp_path / "empty") == []


def test_a_bad_run_file_leaves_every_png_as_it_was(tmp_path: Path) -> None:
    """plot_all drew latency.png and acceptance.png, then refused the run file (exit 2) with both already
    replaced. Now the run is read first: nothing is written."""
    out = tmp_path / "figs"
    out.mkdir()
    (out / "latency.png").write_bytes(b"an earlier figure")
    bad = dict(run_report(), summaries=[{"tree": "t", "size": 0}])
    with pytest.raises(TreeoptError, match=r"summaries\[0\] \(t\): 'size' must be a node count >= 1, got 0"):
        plot_all(out, latency=latency_two_contexts(), acceptance=acceptance_with_counts(), run=bad)
    assert sorted(x.name for x in out.iterdir()) == ["latency.png"]
    assert (out / "latency.png").read_bytes() == b"an earlier figure"


@pytest.mark.parametrize("stop", ["drawing", "writing"])
def test_a_stopped_or_failed_plot_leaves_the_old_set(tmp_path: Path, monkeypatch, stop: str) -> None:
    """Ctrl-C while the third figure was drawn left latency.png and acceptance.png new beside the old
    speedup_vs_budget.png and tree.png: each file whole, the set a mix. Every figure is drawn first now, then the
    set is written as one unit: a stop while drawing, or a failed write of the last PNG, leaves the old set."""
    import sequoia_opt.plots as plots
    from sequoia_opt._io import OutputError

    out = tmp_path / "figs"
    out.mkdir()
    names = ["latency.png", "acceptance.png", "speedup_vs_budget.png", "tree.png"]
    for n in names:
        (out / n).write_bytes(f"old {n}".encode())
    if stop == "drawing":
        def interrupted(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(plots, "plot_speedup_vs_budget", interrupted)
        error = KeyboardInterrupt
    else:
        real = plots.atomic_write_bytes

        def full(path, data):
            if Path(path).name == "tree.png":
                raise OutputError(f"cannot write {path}: No space left on device")
            return real(path, data)
        monkeypatch.setattr(plots, "atomic_write_bytes", full)
        error = OutputError
    with pytest.raises(error):
        plot_all(out, latency=latency_two_contexts(), acceptance=acceptance_with_counts(),
                 predicted=[(1, 1.0), (4, 1.5)], tree=Tree.from_choices([[0], [1]]))
    assert {n: (out / n).read_bytes() for n in names} == {n: f"old {n}".encode() for n in names}
    assert_no_temp_files(out)


def test_plots_with_missing_optional_data(tmp_path: Path) -> None:
    # one context, no spreads, smallest count 2; no counts (no intervals), no per-depth vectors
    assert_png(plot_latency(latency_one_context(), tmp_path / "lat.png"))
    assert_png(plot_acceptance(acceptance_no_counts(), tmp_path / "acc.png"))
    # predicted only, as a plain list of (budget, speedup)
    assert_png(plot_speedup_vs_budget([(1, 1.0), (2, 1.3), (4, 1.6)], tmp_path / "pred.png"))
    # a large tree, no acceptance: no labels, small markers, still a bounded image
    big = random_tree(200, 3)
    assert_png(plot_tree(big, tmp_path / "big.png"))
    assert_no_temp_files(tmp_path)


def test_speedup_measured_only_and_errors(tmp_path: Path) -> None:
    target = tmp_path / "s.png"
    pts = SpeedupPoints(trees=[TreePoint("only", 8, speedup=1.2)])  # no predictions, no tokens per step
    assert_png(plot_speedup_vs_budget(pts, target))
    before = target.read_bytes()
    with pytest.raises(TreeoptError, match="nothing to plot"):
        plot_speedup_vs_budget(SpeedupPoints(), target)
    with pytest.raises(TreeoptError):
        plot_speedup_vs_budget([("a", "b", "c")], target)
    assert target.read_bytes() == before  # a failed plot leaves the old file untouched
    assert_no_temp_files(tmp_path)


def test_module_avoids_pyplot() -> None:
    src = Path(plots.__file__).read_text()
    assert "import pyplot" not in src and "matplotlib.pyplot" not in src  # no global figure state


def test_the_acceptance_bars_are_between_prompts_where_the_profile_keeps_them() -> None:
    """Five prompts accepting 0.5..0.9 at rank 1: the interval between prompts (what the solver's predictions
    carry) is several times the Wilson interval of the 1000 pooled tokens, which the figure drew before."""
    from sequoia_opt.solver.intervals import acceptance_spreads

    rates = [0.5, 0.6, 0.7, 0.8, 0.9]
    pc = np.array([[[int(200 * r), 0, 0, 200 - int(200 * r)]] for r in rates], dtype=np.int64)
    counts = pc.sum(axis=(0, 1))
    prof = AcceptanceProfile(id="acc", acceptance=counts[:-1] / counts.sum(), counts=counts, prompt_counts=pc)
    ci, rest, label = acceptance_intervals(prof)
    assert label == "95% interval between prompts (5)" and ci.shape == (3, 2)
    sp = acceptance_spreads(prof)
    assert tuple(ci[0]) == pytest.approx(sp[0].mean_interval())
    lo, hi = sp[3].mean_interval()  # sum p_k's interval, mirrored for the all-rejected bar
    assert rest == pytest.approx((max(0.0, 1 - hi), min(1.0, 1 - lo)))
    wilson = AcceptanceProfile(id="acc", acceptance=prof.acceptance, counts=counts)
    wci, _, wlabel = acceptance_intervals(wilson)
    assert wlabel.startswith("95% Wilson") and tuple(wci[0]) == pytest.approx(wilson.confidence_interval()[0])
    assert (ci[0, 1] - ci[0, 0]) > 4 * (wci[0, 1] - wci[0, 0])
    assert acceptance_intervals(acceptance_no_counts()) is None
