"""One renderer for every command: a :class:`~sequoia_opt.report.Report` printed as rich tables (summary,
tables, the tree, notes, warnings on stderr) or as one ``--json`` document, from the same content."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree as RichTree

from ..report import Report
from ..tree import Tree
from .common import _err, recorded_warnings

def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    if v is None:
        return "-"
    return escape(str(v))  # a path or a setting may hold [brackets]: printed as written, not read as markup


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


def report_console(*, stderr: bool = False) -> Console:
    """The console a report is drawn on: stdout, or stderr where stdout carries an export alone (``solve --format``
    without ``-o``). A pipe or file gets wide tables (rich would cut every column to fit 80 characters); text is
    shown as typed (no ``:emoji:`` codes in paths)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, emoji=False, width=None if stream.isatty() else 200)


def render(report: Report, json_mode: bool, console: Console | None = None) -> None:
    """Print a report: rich (summary table, tables, tree, notes, warnings) or ``--json`` (``report.data``,
    falling back to the summary/tables/notes/warnings content), on ``console`` (default
    :func:`report_console`)."""
    if json_mode:
        doc = report.data or {
            "summary": report.summary,
            "tables": {t: [dict(zip(cols, row)) for row in rows] for t, cols, rows in report.tables},
        }
        # the files' warnings too (an unknown key, an implausible curve): stderr alone never reached a JSON reader
        doc = {**doc, "notes": report.notes,
               "warnings": report.warnings + [w for w in recorded_warnings() if w not in report.warnings]}
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    con = console or report_console()
    summary = Table(title=escape(report.title) if report.title else report.title, show_header=False,
                    title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    for k, v in report.summary.items():
        summary.add_row(escape(str(k)), _fmt(v))
    con.print(summary)
    for title, cols, rows in report.tables:
        t = Table(title=escape(title) if title else title, title_justify="left")
        for c in cols:
            t.add_column(escape(c), justify="right" if c not in ("name", "params", "level widths") else "left")
        for row in rows:
            t.add_row(*[_fmt(x) for x in row])
        con.print(t)
    if report.tree is not None:
        con.print(draw_tree(report.tree, report.acceptance))
    for n in report.notes:
        con.print(f"[cyan]note:[/] {escape(str(n))}", soft_wrap=True)
    for w in report.warnings:
        _err.print(f"[yellow]warning:[/] {escape(str(w))}", soft_wrap=True)
