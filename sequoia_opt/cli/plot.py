"""``treeopt plot``: PNGs of the latency curve, the acceptance vector, predicted against measured speedup,
and the tree."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from .._io import load_json, read_text_file
from ..errors import TreeoptError
from ..report import Report
from .common import JsonOpt, _check_results_dir, _load_tree_entry, app, handle_errors
from .render import render

#: File name endings of pictures: an --out-dir named so is a file name given where a folder is wanted.
_PICTURE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".webp", ".gif", ".tif", ".tiff", ".bmp", ".eps")


@app.command("plot")
@handle_errors
def plot_cmd(
    latency: Annotated[Optional[Path], typer.Option("--latency", "-l", help="Latency profile (treeopt-latency/1 YAML).")] = None,
    acceptance: Annotated[Optional[Path], typer.Option("--acceptance", "-a", help="Acceptance profile.")] = None,
    run: Annotated[Optional[Path], typer.Option("--run", help="A results/<run-id>.json from treeopt run.")] = None,
    tree: Annotated[Optional[Path], typer.Option("--tree", help="A tree file to draw.")] = None,
    out_dir: Annotated[Path, typer.Option("--out-dir", "-o", help="Folder for the PNGs.")] = Path("results/plots"),
    max_depth: Annotated[int, typer.Option("--max-depth", "-d", help="Depth limit for the predicted speedup curve.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """Draw PNGs: latency curve, acceptance vector with intervals, predicted vs measured speedup against
    budget, and the tree."""
    from ..plots import plot_all, predicted_speedup_curve
    from ..profiles import load_acceptance, load_latency, warn_on_mismatch

    if not any((latency, acceptance, run, tree)):
        raise TreeoptError("nothing to plot: pass --latency, --acceptance, --run and/or --tree")
    _check_results_dir(out_dir, "--out-dir")  # a file there: one line before drawing, not 'File exists' after
    if out_dir.suffix.lower() in _PICTURE_SUFFIXES and not out_dir.is_dir():
        raise TreeoptError(f"--out-dir {out_dir} names a picture file; plot writes its PNGs into a folder under fixed "
                           "names (latency.png, acceptance.png, speedup_vs_budget.png, tree.png): give the folder")
    curve = load_latency(latency) if latency else None
    acc = load_acceptance(acceptance) if acceptance else None
    run_doc = None
    if run is not None:
        text = read_text_file(run, error=TreeoptError, what="run results file")
        try:
            run_doc = load_json(text)
        except ValueError as err:
            raise TreeoptError(f"cannot read run results file {run}: {str(err).splitlines()[0]}") from None
        if not isinstance(run_doc, dict) or not isinstance(run_doc.get("summaries"), list):  # a tree, a profile
            raise TreeoptError(f"{run}: not a run results file (no 'summaries' list; treeopt run writes one as "
                               "results/.../*.json)")
    t = _plot_tree(tree) if tree else None
    predicted = None
    if curve is not None and acc is not None:
        predicted = predicted_speedup_curve(acc.acceptance, curve, curve.max_target_tokens(),
                                            acc.capped_depth(max_depth),  # Medusa's K heads
                                            max(acc.width, 1))
    paths = plot_all(out_dir, latency=curve, acceptance=acc, run=run_doc, tree=t, predicted=predicted)
    report = Report(title="treeopt plot", summary={"written": ", ".join(str(p) for p in paths)})
    # profiles of another pair than the run's (or than each other) draw a prediction of something else: said,
    # as solve says it
    settings = (run_doc or {}).get("settings") or {}
    report.warnings = warn_on_mismatch(acceptance=acc, latency=curve, target=settings.get("target"),
                                       draft=settings.get("draft"))
    report.data = {"written": [str(p) for p in paths], "warnings": report.warnings}
    render(report, as_json)


def _plot_tree(path: Path):
    """The tree a file holds, as plot draws it: a grafted (multi-drafter, ``treeopt-tree/2``) tree's shape too,
    which the single-drafter reader refuses; every other format as ``run --tree`` reads it."""
    from ..errors import MultiDrafterTreeError
    from ..tree import load_drafter_tree

    try:
        return _load_tree_entry(path).tree
    except MultiDrafterTreeError:
        return load_drafter_tree(path)[0].tree
