"""``treeopt solve``: the DP-optimal tree for an acceptance profile, the hardware-aware choice of budget and
depth from a latency profile, baselines side by side, and the exports for serving engines."""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import typer
from rich.console import Console
from typing_extensions import Annotated

from .._io import atomic_write_text
from ..errors import TreeoptError
from ..report import Report
from ..tree import Tree, TreeMetadata, now_iso
from .common import (AcceptanceOpt, BudgetOpt, ContextOpt, FormatOpt, JsonOpt, LatencyOpt,
                     MaxBranchingOpt, MaxDepthOpt, OutputOpt, app, handle_errors)
from .render import render

def _exporter(fmt: str) -> Callable[[Tree, TreeMetadata, Any], Any]:
    """Resolve the output format before any work is done (so a bad format writes nothing); returns a
    function giving the :class:`~sequoia_opt.exports.Export` of a tree."""
    from .. import exports

    try:
        key = exports.normalise_format(fmt)
    except exports.ExportError:
        raise TreeoptError(f"unknown --format {fmt!r}; choose one of {', '.join(exports.EXPORT_FORMATS)}") from None

    def run(tree: Tree, meta: TreeMetadata, p: Any) -> Any:
        return exports.export(tree, key, metadata=meta, acceptance=p)

    return run


def _measured_on(acc: Any, curve: Any) -> dict[str, Any]:
    """What the profiles behind a tree were measured on (stored in the tree's metadata so ``run`` can warn
    when it executes the tree on another device, dtype or model pair)."""
    out: dict[str, Any] = {}
    for key, value in (("target", acc.measured.get("target")), ("draft", acc.measured.get("draft")),
                       ("draft_cost_model", curve.cost_model if curve else acc.measured.get("draft_cost_model")),
                       ("device", curve.device.get("name") if curve else None),
                       ("dtype", (curve.device.get("dtype") if curve else None) or acc.measured.get("dtype"))):
        if value is not None:
            out[f"profiled_{key}"] = value
    return out


@app.command()
@handle_errors
def solve(
    acceptance: AcceptanceOpt,
    budget: BudgetOpt = 128,
    max_depth: MaxDepthOpt = 16,
    latency: LatencyOpt = None,
    max_branching: MaxBranchingOpt = 32,
    context: ContextOpt = None,
    output: OutputOpt = None,
    fmt: FormatOpt = None,
    compare: Annotated[bool, typer.Option("--compare", help="Score baseline trees under the same model.")] = False,
    width: Annotated[
        Optional[int], typer.Option("--width", "-k", help="Expected K (entries of the acceptance vector); refuse another length.")
    ] = None,
    acceptance_model: Annotated[str, typer.Option(
        "--acceptance-model", help="positional (Sequoia's p_k, the same at every depth) | by-depth (the "
        "profile's per-depth vectors: drafters whose accepted tokens come in runs, such as lookup) | auto "
        "(by-depth when the profile's positional check failed).")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    """Find the speculation tree with the most expected tokens per second (or per step without --latency)."""
    from ..errors import SolverError
    from ..profiles import load_acceptance, load_latency, warn_on_mismatch
    from ..solver import choose, compare_baselines
    from ..solver.depth import ACCEPTANCE_MODELS, solve_profile

    export = _exporter(fmt or "yaml")
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    if context is not None and latency is None:
        raise SolverError("--context selects where to read the latency profile: pass --latency too (or drop it)")
    if context is not None and context < 0:
        raise SolverError(f"--context must be a number of tokens >= 0, got {context}")
    if acceptance_model not in ACCEPTANCE_MODELS:
        raise SolverError(f"unknown --acceptance-model {acceptance_model!r}; use {' | '.join(ACCEPTANCE_MODELS)}")
    acc = load_acceptance(acceptance)
    if width is not None and acc.width != width:
        raise SolverError(f"acceptance profile {acc.id!r} has {acc.width} entries but --width {width} was asked for")
    curve = load_latency(latency) if latency is not None else None
    p = acc.acceptance
    report = Report(title="treeopt solve")
    report.warnings = warn_on_mismatch(acceptance=acc, latency=curve)
    report.acceptance = p
    data: dict[str, Any] = {
        "acceptance_profile": acc.id,
        "latency_profile": curve.id if curve else None,
        "budget_limit": budget,
        "max_depth": max_depth,
        "max_branching": max_branching,
    }

    sol, model_used = solve_profile(acc, budget, max_depth, max_branching, acceptance_model)
    data["acceptance_model"] = model_used
    if model_used == "by-depth":
        report.notes.append(
            f"acceptance model by-depth: the profile's per-depth vectors (depths 1..{len(acc.depth_rows())}, deeper "
            "levels use the last) " + ("because its positional check failed (acceptance differs by depth "
                                       "beyond noise)" if acceptance_model == "auto" else "as asked"))
    if curve is None:
        tree = sol.tree()
        g = sol.expected_tokens()
        chosen_budget, chosen_depth, speedup = budget, max_depth, None
        report.notes.append(
            f"no --latency profile: maximised expected tokens per step at budget {budget} (no hardware-aware "
            "choice, no speedup prediction)"
        )
        data["choice"] = {
            "budget": budget,
            "max_depth": max_depth,
            "nodes": tree.size,
            "depth": tree.tree_depth,
            "level_widths": list(tree.level_widths),
            "expected_tokens_per_step": g,
        }
        report.summary = {
            "acceptance profile": acc.id,
            "acceptance model": model_used,
            "nodes": tree.size,
            "depth": tree.tree_depth,
            "level widths": list(tree.level_widths),
            "expected tokens / step": g,
        }
    else:
        ch = choose(p, curve, budget, max_depth, max_branching, context=context, solution=sol)
        tree, g, speedup = ch.tree, ch.expected_tokens, ch.speedup
        chosen_budget, chosen_depth = ch.budget, ch.depth
        best = ch.alternatives[0]
        data["choice"] = best.as_dict()
        data["plain_ms_per_token"] = ch.plain_ms_per_token
        data["context_tokens"] = context if context is not None else int(curve.contexts[0])
        data["alternatives"] = [a.as_dict() for a in ch.alternatives]
        data["candidates_scored"] = ch.considered
        data["candidates_skipped"] = ch.skipped
        report.summary = {
            "acceptance profile": acc.id,
            "latency profile": curve.id,
            "drafter": acc.measured.get("draft") or curve.model.get("draft"),
            "acceptance model": model_used,
            "draft cost model": curve.cost_model,
            "context (tokens)": context if context is not None else int(curve.contexts[0]),
            "nodes": tree.size,
            "depth": tree.tree_depth,
            "level widths": list(tree.level_widths),
            "expected tokens / step": g,
            "step cost (ms)": ch.cost_ms,
            "tokens / s": ch.tokens_per_s,
            "plain decoding (ms / token)": ch.plain_ms_per_token,
            "predicted speedup": ch.speedup,
        }
        report.tables.append(
            (
                "best choices (DP-optimal tree per budget and depth limit)",
                ["budget", "max depth", "nodes", "G", "draft ms", "target ms", "cost ms", "tokens/s", "speedup"],
                [
                    [a.budget, a.depth, a.size, a.cost.expected_tokens, a.cost.draft_ms, a.cost.target_ms,
                     a.cost.cost_ms, a.cost.tokens_per_s, a.cost.speedup]
                    for a in ch.alternatives
                ],
            )
        )
        if ch.skipped:
            report.notes.append(f"{ch.skipped} candidates skipped: their draft widths exceed the measured draft curve")

    if compare:
        base = compare_baselines(p, budget, max_depth, max_branching, curve, context=context, best_first_budget=chosen_budget)
        data["baselines"] = [b.as_dict() for b in base]
        cols = ["name", "params", "nodes", "depth", "G"] + (["cost ms", "tokens/s", "speedup"] if curve else [])
        rows = []
        for b in base:
            row = [b.name, " ".join(f"{k}={v}" for k, v in b.params.items()), b.tree.size, b.tree.tree_depth, b.expected_tokens]
            if curve is not None:
                row += [b.cost.cost_ms, b.cost.tokens_per_s, b.cost.speedup] if b.cost else [None] * 3
            if b.note:
                report.notes.append(b.note)
            rows.append(row)
        report.tables.append(("baselines (same acceptance vector and cost model)", cols, rows))

    meta = TreeMetadata(
        budget=chosen_budget,
        max_depth=chosen_depth,
        expected_tokens_per_step=g,
        predicted_speedup=speedup,
        acceptance_profile=acc.id,
        latency_profile=curve.id if curve else None,
        solver="sequoia-dp" + ("+hardware" if curve else ""),
        date=now_iso(),
        extra={"max_branching": max_branching, "budget_limit": budget, "acceptance_model": model_used,
               **_measured_on(acc, curve)},
    )
    data["tree"] = {"choices": tree.choices(), "metadata": meta.to_dict()}
    out = None
    if output is not None or fmt is not None:
        out = export(tree, meta, p)
        report.notes.extend(out.notes)
        report.warnings.extend(out.warnings)
        data["export"] = {"format": out.fmt, "text": out.text, "notes": list(out.notes),
                          "warnings": list(out.warnings)}
    if output is not None:
        atomic_write_text(output, out.text)
        report.notes.append(f"wrote {out.fmt} to {output}")
        data["output"] = str(output)
    report.tree = tree
    report.data = data
    if out is not None and output is None and not as_json:
        # --format without -o: stdout carries the export alone (pipe it into a file or an engine's config);
        # the report goes to stderr
        render(report, False, console=Console(stderr=True, width=None if sys.stderr.isatty() else 200))
        typer.echo(out.text, nl=False)
    else:
        render(report, as_json)
