"""The ``treeopt`` command line: a thin layer over the library (typer + rich).

Adding a command: write a function decorated with ``@app.command()`` and ``@handle_errors``, take the shared
option types below (``AcceptanceOpt``, ``LatencyOpt``, ``BudgetOpt``, ...), do the work with library calls,
build a :class:`Report` and pass it to :func:`render` (which prints either rich tables or ``--json``). User
errors are :class:`~sequoia_opt.errors.TreeoptError`: ``handle_errors`` prints them as one red line on stderr
and exits with code 2, without a traceback. Output files are written last, atomically, so a failure leaves
no file behind.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree as RichTree
from typing_extensions import Annotated

from . import __version__
from ._io import atomic_write_text
from .errors import TreeoptError
from .tree import Tree, TreeMetadata, now_iso, tree_to_yaml

app = typer.Typer(
    name="treeopt",
    help="Hardware-aware optimizer for tree-based speculative decoding (Sequoia-style).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FORMATS = ("yaml", "json", "medusa", "vllm", "sglang")

# ---------------------------------------------------------------------------------------------- shared options
AcceptanceOpt = Annotated[
    Path, typer.Option("--acceptance", "-a", help="Acceptance profile (treeopt-acceptance/1 YAML).")
]
LatencyOpt = Annotated[
    Optional[Path],
    typer.Option("--latency", "-l", help="Latency profile (treeopt-latency/1 YAML); enables the hardware-aware choice."),
]
BudgetOpt = Annotated[int, typer.Option("--budget", "-n", help="Largest tree size considered (nodes, root included).")]
MaxDepthOpt = Annotated[int, typer.Option("--max-depth", "-d", help="Depth limit D (the root is depth 0).")]
MaxBranchingOpt = Annotated[int, typer.Option("--max-branching", "-b", help="Most children per node B.")]
ContextOpt = Annotated[
    Optional[int], typer.Option("--context", help="Context length (tokens) to read latency at; default: smallest measured.")
]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Write the tree here (atomically).")]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="Output format: " + "|".join(FORMATS) + ".")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]

_err = Console(stderr=True, highlight=False)
F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(fn: F) -> F:
    """Turn TreeoptError into one red line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TreeoptError as err:
            msg = str(err).splitlines()[0] if str(err) else err.__class__.__name__
            _err.print(f"[bold red]error:[/] {msg}", markup=True, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"treeopt {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """treeopt: profile -> solve -> run."""


# ---------------------------------------------------------------------------------------------- rendering
@dataclass
class Report:
    """What a command shows: a title, summary key/values, tables, notes, warnings and an optional tree.

    :func:`render` prints it as rich tables or as one JSON document (``data``), from the same content.
    """

    title: str
    summary: dict[str, Any] = field(default_factory=dict)
    tables: list[tuple[str, list[str], list[list[Any]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tree: Tree | None = None
    acceptance: Any = None
    data: dict[str, Any] = field(default_factory=dict)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    if v is None:
        return "-"
    return str(v)


def draw_tree(tree: Tree, acceptance: Any = None, *, max_nodes: int = 40, max_children: int = 6, max_depth: int = 6) -> RichTree:
    """A rich drawing of the tree: each node shows its rank and (with p) its path probability. Big trees are
    truncated: at most ``max_children`` children per node, ``max_depth`` levels, ``max_nodes`` lines."""
    probs = tree.path_probabilities(acceptance) if acceptance is not None else None

    def label(v: int) -> str:
        base = "root" if v == 0 else f"r{tree.rank[v]}"
        return base if probs is None else f"{base}  [dim]{probs[v]:.3f}[/]"

    def subtree_size(v: int) -> int:
        return 1 + sum(subtree_size(c) for c in tree.children[v])

    root = RichTree(f"{label(0)}  [dim]({tree.summary()})[/]")
    shown = 1
    stack = [(0, root)]
    while stack:
        v, node = stack.pop(0)
        kids = tree.children[v]
        if not kids:
            continue
        if tree.depth[v] >= max_depth:
            node.add(f"[dim]… {subtree_size(v) - 1} nodes deeper[/]")
            continue
        for i, c in enumerate(kids):
            if i >= max_children or shown >= max_nodes:
                rest = sum(subtree_size(x) for x in kids[i:])
                node.add(f"[dim]… {len(kids) - i} more children ({rest} nodes)[/]")
                break
            stack.append((c, node.add(label(c))))
            shown += 1
    return root


def render(report: Report, json_mode: bool, console: Console | None = None) -> None:
    """Print a report: rich (summary table, tables, tree, notes, warnings) or ``--json`` (``report.data``,
    falling back to the summary/tables/notes/warnings content)."""
    if json_mode:
        doc = report.data or {
            "summary": report.summary,
            "tables": {t: [dict(zip(cols, row)) for row in rows] for t, cols, rows in report.tables},
        }
        doc = {**doc, "notes": report.notes, "warnings": report.warnings}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    con = console or Console()
    summary = Table(title=report.title, show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for k, v in report.summary.items():
        summary.add_row(k, _fmt(v))
    con.print(summary)
    for title, cols, rows in report.tables:
        t = Table(title=title, title_justify="left")
        for c in cols:
            t.add_column(c, justify="right" if c not in ("name", "params", "level widths") else "left")
        for row in rows:
            t.add_row(*[_fmt(x) for x in row])
        con.print(t)
    if report.tree is not None:
        con.print(draw_tree(report.tree, report.acceptance))
    for n in report.notes:
        con.print(f"[cyan]note:[/] {n}", soft_wrap=True)
    for w in report.warnings:
        _err.print(f"[yellow]warning:[/] {w}", soft_wrap=True)


# ---------------------------------------------------------------------------------------------- export
def _exporter(fmt: str) -> Callable[[Tree, TreeMetadata, Any], tuple[str, list[str]]]:
    """Resolve the output format before any work is done (so a bad format writes nothing)."""
    key = fmt.strip().lower()
    if key not in FORMATS:
        raise TreeoptError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    try:
        from . import exports
    except ImportError:
        exports = None  # type: ignore[assignment]
    if exports is not None and hasattr(exports, "export"):

        def run(tree: Tree, meta: TreeMetadata, p: Any) -> tuple[str, list[str]]:
            out = exports.export(tree, key, metadata=meta, acceptance=p)
            return out.text, list(out.notes)

        return run
    if exports is not None and hasattr(exports, "export_tree"):
        return lambda tree, meta, p: (exports.export_tree(tree, key, meta), [])
    if key != "yaml":
        raise TreeoptError(f"--format {key} needs sequoia_opt.exports, which this installation lacks; use --format yaml")
    return lambda tree, meta, p: (tree_to_yaml(tree, meta), [])


# ---------------------------------------------------------------------------------------------- solve
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
    fmt: FormatOpt = "yaml",
    compare: Annotated[bool, typer.Option("--compare", help="Score baseline trees under the same model.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Find the speculation tree with the most expected tokens per second (or per step without --latency)."""
    from .errors import SolverError
    from .profiles import load_acceptance, load_latency, warn_on_mismatch
    from .solver import choose, compare_baselines, solve_dp

    export = _exporter(fmt)
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    acc = load_acceptance(acceptance)
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

    if curve is None:
        sol = solve_dp(p, budget, max_depth, max_branching)
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
            "nodes": tree.size,
            "depth": tree.tree_depth,
            "level widths": list(tree.level_widths),
            "expected tokens / step": g,
        }
    else:
        ch = choose(p, curve, budget, max_depth, max_branching, context=context)
        tree, g, speedup = ch.tree, ch.expected_tokens, ch.speedup
        chosen_budget, chosen_depth = ch.budget, ch.depth
        best = ch.alternatives[0]
        data["choice"] = best.as_dict()
        data["plain_ms_per_token"] = ch.plain_ms_per_token
        data["context_tokens"] = context
        data["alternatives"] = [a.as_dict() for a in ch.alternatives]
        data["candidates_scored"] = ch.considered
        data["candidates_skipped"] = ch.skipped
        report.summary = {
            "acceptance profile": acc.id,
            "latency profile": curve.id,
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
            if b.cost is not None:
                row += [b.cost.cost_ms, b.cost.tokens_per_s, b.cost.speedup]
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
        extra={"max_branching": max_branching, "budget_limit": budget},
    )
    data["tree"] = {"choices": tree.choices(), "metadata": meta.to_dict()}
    if output is not None:
        text, notes = export(tree, meta, p)
        atomic_write_text(output, text)
        report.notes.extend(notes)
        report.notes.append(f"wrote {fmt} to {output}")
        data["output"] = str(output)
    report.tree = tree
    report.data = data
    render(report, as_json)


if __name__ == "__main__":  # pragma: no cover
    app()
