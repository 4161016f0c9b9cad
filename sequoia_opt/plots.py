"""PNG figures for ``treeopt plot``: latency curve, acceptance vector, speedup against budget, the tree.

Every function draws one figure with matplotlib's Agg canvas (an explicit :class:`~matplotlib.figure.Figure`
plus :class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`; no pyplot, so no global figure state and no
display needed), renders it to memory and writes the PNG atomically (a crash leaves the old file or none,
never half a PNG). Each returns the path it wrote.

- :func:`plot_latency`: target forward T(n) and draft forward c(w) in ms against tokens, one line per
  measured context length, plus T(n)/T(1), the ratio that decides how large a tree verification can afford.
- :func:`plot_acceptance`: the positional acceptance vector p_k with 95 % Wilson intervals.
- :func:`plot_speedup_vs_budget`: the solver's predicted speedup against the node budget with the trees a
  run measured (see :class:`SpeedupPoints`, :func:`speedup_points_from_run`,
  :func:`predicted_speedup_curve`).
- :func:`plot_tree`: the tree left to right by depth (layout from :func:`tree_layout`).
- :func:`plot_all`: whatever of the above the inputs allow, under fixed file names.
"""

from __future__ import annotations

import contextvars
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib import colormaps
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ._io import atomic_write_bytes, write_all
from .errors import TreeoptError
from .profiles import AcceptanceProfile, LatencyCurve
from .profiles.common import wilson_interval
from .tree import Tree

#: File names :func:`plot_all` writes into its output folder.
LATENCY_PNG = "latency.png"
ACCEPTANCE_PNG = "acceptance.png"
SPEEDUP_PNG = "speedup_vs_budget.png"
TREE_PNG = "tree.png"

#: Trees with more nodes than this are drawn without rank labels (smaller markers instead).
TREE_LABEL_LIMIT = 64

_DPI = 110


# ---------------------------------------------------------------------------------------------- helpers
def _new_figure(width_in: float, height_in: float) -> Figure:
    """A Figure bound to an Agg canvas (no pyplot), constrained layout."""
    fig = Figure(figsize=(width_in, height_in), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


#: While :func:`plot_all` draws a set (in this thread or task): the PNGs rendered so far, ``(path, bytes)``,
#: written together at its end; None elsewhere.
_PENDING: contextvars.ContextVar[list[tuple[Path, bytes]] | None] = contextvars.ContextVar("_PENDING", default=None)


def _save(fig: Figure, path: str | Path) -> Path:
    """Render ``fig`` as PNG into memory, then write it atomically to ``path`` (inside :func:`plot_all`: keep it for
    the set's one write). Returns the path."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": "treeopt (matplotlib Agg)"})
    pending = _PENDING.get()
    if pending is not None:
        pending.append((Path(path), buf.getvalue()))
        return Path(path)
    return atomic_write_bytes(path, buf.getvalue())


def _log2_x(ax: Any) -> None:
    """Log-2 x axis labelled with plain numbers (1, 2, 4, ...)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))


def _finite(x: Any) -> float | None:
    """``x`` as a finite float, or None (missing, null, NaN, inf, not a number)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


# ---------------------------------------------------------------------------------------------- latency
def plot_latency(curve: LatencyCurve, path: str | Path, *, title: str | None = None) -> Path:
    """Draw a latency profile: three panels, all with a log-2 x axis in tokens.

    1. Target forward T(n) in ms against n, the tokens fed to one verification forward (n = tree size),
       one line per measured context length (tokens). Where the profile has spreads (p90 - p10 of the timed
       repeats, in ms, as the profilers write them) they are drawn as a band of median +- spread / 2.
    2. Draft forward c(w) in ms against w, the tokens in one draft forward, same conventions.
    3. T(n) / T(n_min) (dimensionless; n_min is the smallest measured count, normally 1): how much dearer
       verifying n tokens is than verifying one. Where this stays near 1 a larger tree is almost free; where
       it climbs, every extra node must earn its cost in expected tokens. This is what sets the budget.

    The title names the profile id, the device and whether the data is an example. Returns ``path``.
    """
    curves = curve.to_dict()["curves"]
    fig = _new_figure(15.0, 4.6)
    ax_t, ax_d, ax_r = fig.subplots(1, 3)
    for i, cur in enumerate(curves):
        colour = f"C{i % 10}"
        label = f"context {cur['context_tokens']} tokens"
        t_tok = np.asarray(cur["target"]["tokens"], dtype=float)
        t_ms = np.asarray(cur["target"]["target_forward_ms"], dtype=float)
        t_sp = cur["target"].get("target_forward_spread_ms")
        d_tok = np.asarray(cur["draft"]["tokens"], dtype=float)
        d_ms = np.asarray(cur["draft"]["draft_forward_ms"], dtype=float)
        d_sp = cur["draft"].get("draft_forward_spread_ms")
        for ax, x, y, sp in ((ax_t, t_tok, t_ms, t_sp), (ax_d, d_tok, d_ms, d_sp)):
            ax.plot(x, y, "o-", color=colour, ms=3.5, lw=1.5, label=label)
            if sp is not None:
                half = np.asarray(sp, dtype=float) / 2
                ax.fill_between(x, np.maximum(y - half, 0), y + half, color=colour, alpha=0.2, lw=0)
                if x.size == 1:
                    ax.errorbar(x, y, yerr=half, color=colour, capsize=3)
        if t_ms[0] > 0:
            ax_r.plot(t_tok, t_ms / t_ms[0], "o-", color=colour, ms=3.5, lw=1.5, label=label)
    firsts = {int(c["target"]["tokens"][0]) for c in curves}  # each line is divided by its own first point
    n_min = str(firsts.pop()) if len(firsts) == 1 else "n_min"
    ax_t.set(title="target forward T(n)", xlabel="tokens per forward n (tree size)", ylabel="ms per forward")
    ax_d.set(title="draft forward c(w)", xlabel="tokens per draft forward w (level width)", ylabel="ms per forward")
    ax_r.set(
        title=f"T(n) / T({n_min}): cost of verifying n tokens",
        xlabel="tokens per forward n (tree size)",
        ylabel=f"ratio to T({n_min})",
    )
    ax_r.axhline(1.0, color="0.4", lw=0.8, ls=":")
    ax_r.axhline(2.0, color="0.6", lw=0.8, ls=":")
    ax_r.text(0.02, 0.96, "near 1: a bigger tree is almost free\nrising: each node must pay for itself",
              transform=ax_r.transAxes, va="top", fontsize=8, color="0.3")
    for ax in (ax_t, ax_d, ax_r):
        _log2_x(ax)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="major", alpha=0.3)
    ax_t.legend(fontsize=8, loc="upper left")
    dev = (curve.device or {}).get("name")
    head = title or f"latency profile {curve.id}" + (f" on {dev}" if dev else "")
    head += f"  (step overhead {curve.step_overhead_ms:g} ms)"
    if curve.example:
        head += "  EXAMPLE DATA, not measured"
    fig.suptitle(head, fontsize=11)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------- acceptance
def acceptance_intervals(profile: AcceptanceProfile) -> tuple[np.ndarray, tuple[float, float], str] | None:
    """The acceptance figure's 95 % error bars: ``(ci, rest_ci, label)``, ``ci`` (K, 2) (low, high) of each p_k,
    ``rest_ci`` of 1 - sum p_k, and the legend's name for them; None for a profile without counts.

    Between prompts where the profile keeps counts per prompt from at least 2 prompts (the interval of the mean
    over prompts of this kind, :meth:`~sequoia_opt.solver.intervals.PromptSpread.mean_interval` of
    :func:`~sequoia_opt.solver.intervals.acceptance_spreads`, which the solver's predictions carry: a prompt's
    trials are correlated, so an interval over pooled tokens is far too narrow for new prompts); else the Wilson
    score interval of the pooled counts, labelled so.
    """
    K = len(profile.acceptance)
    pc = profile.prompt_counts
    if pc is not None and np.asarray(pc).shape[0] >= 2:
        from .solver.intervals import acceptance_spreads

        spreads = acceptance_spreads(profile)  # K + 1: each p_k, then sum p_k
        ci = np.array([sp.mean_interval() for sp in spreads[:K]])
        lo, hi = spreads[K].mean_interval()
        return ci, (max(0.0, 1.0 - hi), min(1.0, 1.0 - lo)), f"95% interval between prompts ({spreads[0].prompts})"
    if profile.counts is None:
        return None
    rci = wilson_interval(float(profile.counts[-1]), float(profile.counts.sum()))
    return profile.confidence_interval(), rci, "95% Wilson interval (pooled tokens)"


def plot_acceptance(profile: AcceptanceProfile, path: str | Path, *, title: str | None = None) -> Path:
    """Draw a positional acceptance vector (Sequoia, section 3.1).

    Bars: p_k, the probability that the k-th candidate (k = 1..K, rank k-1) is the accepted one, with 95 %
    intervals as error bars: between prompts when the profile keeps its counts per prompt (the interval of the
    mean over prompts of this kind, :func:`~sequoia_opt.solver.intervals.acceptance_spreads`: what the solver's
    predictions carry; a prompt's trials are correlated, so a token-count interval is far too narrow for new
    prompts), else Wilson score intervals of the pooled counts, labelled so. A hatched grey bar after them is
    the remainder 1 - sum p_k (every candidate rejected; its interval from the sum's). When the profile
    has per-depth vectors they are drawn over the bars as lines with markers, one per depth (depth 1 =
    children of the root). The title names the profile, the pair, the mode and the number of samples.
    Returns ``path``.
    """
    p = np.asarray(profile.acceptance, dtype=float)
    K = p.size
    k = np.arange(1, K + 1)
    rest = max(0.0, 1.0 - float(p.sum()))
    fig = _new_figure(max(6.5, min(16.0, 3.0 + 0.45 * (K + 1))), 4.6)
    ax = fig.subplots()
    ax.bar(k, p, color="C0", alpha=0.85, label="p_k (all depths)" if profile.by_depth else "p_k")
    ax.bar([K + 1], [rest], color="0.75", hatch="//", edgecolor="0.45", label="all rejected  1 - sum p_k")
    tops = np.append(p, rest)  # where the value labels go: above the bar or its interval
    bars = acceptance_intervals(profile)
    if bars is not None:
        ci, rci, label = bars
        err = np.clip(np.stack([p - ci[:, 0], ci[:, 1] - p]), 0, None)
        ax.errorbar(k, p, yerr=err, fmt="none", ecolor="black", capsize=3, lw=1, label=label)
        ax.errorbar([K + 1], [rest], yerr=[[max(rest - rci[0], 0)], [max(rci[1] - rest, 0)]], fmt="none",
                    ecolor="black", capsize=3, lw=1)
        tops = np.maximum(tops, np.append(ci[:, 1], rci[1]))
    if K <= 16:
        for x, y, top in zip(list(k) + [K + 1], list(p) + [rest], tops):
            ax.annotate(f"{y:.3f}", (x, top), xytext=(0, 3), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7, color="0.25")
    if profile.by_depth:
        depths = sorted(profile.by_depth)
        for j, d in enumerate(depths):
            v = np.asarray(profile.by_depth[d], dtype=float)
            ax.plot(np.arange(1, v.size + 1), v, "o-", ms=3.5, lw=1.2, color=f"C{(j + 1) % 10}",
                    label=f"depth {d}")
    ax.set_xticks(list(k) + [K + 1], [str(x) for x in k] + ["none"])
    if K > 20:
        for lbl in ax.get_xticklabels()[:-1]:
            if (int(lbl.get_text()) - 1) % 4:
                lbl.set_visible(False)
    ax.set(xlabel="candidate position k (rank k-1 among a parent's draft proposals)",
           ylabel="probability the k-th candidate is accepted")
    ymax = max([float(tops.max()), 0.05] + [float(np.max(v)) for v in profile.by_depth.values()])
    ax.set_ylim(0, min(1.05, ymax * 1.25 + 0.02))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right", title=f"sum p_k = {p.sum():.3f}, all rejected = {rest:.3f}",
              title_fontsize=8)
    m = profile.measured or {}
    bits = [f"acceptance {profile.id}"]
    if m.get("target") or m.get("draft"):
        bits.append(f"{m.get('draft', '?')} -> {m.get('target', '?')}")
    if m.get("mode"):
        mode = str(m["mode"])
        if mode == "sampling" and m.get("temperature") is not None:
            mode += f" T={m['temperature']:g}" + (f" top-p={m['top_p']:g}" if m.get("top_p") is not None else "")
        bits.append(mode)
    ns = profile.num_samples
    bits.append(f"n={ns}" if ns is not None else "no counts (no intervals)")
    head = title or ", ".join(bits)
    if profile.example:
        head += "  EXAMPLE DATA"
    import textwrap

    # wrapped: a long profile id and pair names were clipped at both edges
    ax.set_title("\n".join(textwrap.wrap(head, 78, break_on_hyphens=False)), fontsize=10)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------- speedup
@dataclass(frozen=True)
class TreePoint:
    """One tree that a run measured (or a tree the solver predicted), placed at its size.

    Attributes:
        name: display name (e.g. ``"solved"``, ``"chain"``).
        size: nodes including the root (the x position, in the same units as the budget).
        speedup: measured speedup over plain decoding (ratio), None when not measured.
        predicted_speedup: the tree's predicted speedup (ratio), None when unknown.
        tokens_per_step: measured mean tokens per step; tps_ci95: its 95 % interval (low, high).
        predicted_tokens_per_step: G from the tree's metadata (tokens per step).
    """

    name: str
    size: int
    speedup: float | None = None
    predicted_speedup: float | None = None
    tokens_per_step: float | None = None
    tps_ci95: tuple[float, float] | None = None
    predicted_tokens_per_step: float | None = None


@dataclass
class SpeedupPoints:
    """Input of :func:`plot_speedup_vs_budget`.

    Attributes:
        predicted: ``(budget, predicted_speedup)`` pairs for the solver's line, budget in nodes including
            the root (e.g. from :func:`predicted_speedup_curve`: the best DP-optimal tree at each budget).
        trees: measured (and per-tree predicted) points, e.g. from :func:`speedup_points_from_run`.
        label: legend text for the predicted line.
        title: figure title (None: a default).
    """

    predicted: list[tuple[int, float]] = field(default_factory=list)
    trees: list[TreePoint] = field(default_factory=list)
    label: str = "predicted (DP-optimal tree at each budget)"
    title: str | None = None


def speedup_points_from_run(run_json: Mapping[str, Any]) -> SpeedupPoints:
    """Turn a ``treeopt-run/1`` report (the dict ``RunReport.to_dict()`` writes to ``results/<run-id>.json``)
    into :class:`SpeedupPoints`: one :class:`TreePoint` per tree in ``summaries`` (plain decoding, which is
    the speedup-1 reference, is left out) with its measured speedup, tokens per step and 95 % interval, and
    the predicted speedup / tokens per step its YAML carried. ``predicted`` is left empty (a run report holds
    no solver curve; pass one from :func:`predicted_speedup_curve`).

    Raises TreeoptError when the mapping has no ``summaries`` list.
    """
    summaries = run_json.get("summaries") if isinstance(run_json, Mapping) else None
    if not isinstance(summaries, list):
        raise TreeoptError("run report has no 'summaries' list (expected a treeopt-run/1 JSON document)")
    trees: list[TreePoint] = []
    for i, s in enumerate(summaries):
        if not isinstance(s, Mapping):
            raise TreeoptError(f"run report summaries[{i}] is not a mapping")
        name = str(s.get("tree", f"tree {i}"))
        if name == "plain":
            continue
        size = s.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TreeoptError(f"run report summaries[{i}] ({name}): 'size' must be a node count >= 1, got {size!r}")
        ci = s.get("tps_ci95")
        ci_t = None
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            lo, hi = _finite(ci[0]), _finite(ci[1])
            if lo is not None and hi is not None:
                ci_t = (lo, hi)
        trees.append(TreePoint(
            name=name, size=size, speedup=_finite(s.get("speedup")),
            # the steady state, as the solver's curve it is drawn against (the run's figure is scaled to its
            # generation lengths: TreeSummary.predicted_speedup); files written before have only the one
            predicted_speedup=_finite(s.get("predicted_speedup_steady", s.get("predicted_speedup"))),
            tokens_per_step=_finite(s.get("tokens_per_step")), tps_ci95=ci_t,
            predicted_tokens_per_step=_finite(s.get("predicted_tokens_per_step")),
        ))
    run_id = run_json.get("run_id")
    return SpeedupPoints(trees=trees, title=f"run {run_id}: speedup against budget" if run_id else None)


def predicted_speedup_curve(
    acceptance: Sequence[float] | AcceptanceProfile,
    curve: LatencyCurve,
    max_budget: int,
    max_depth: int,
    max_branching: int = 32,
    *,
    context: int | None = None,
    budgets: Sequence[int] | None = None,
) -> list[tuple[int, float]]:
    """The solver's predicted speedup at each budget: for every budget m (nodes incl. root), the best over
    budgets m' <= m and depth limits d = 1..``max_depth`` of the DP-optimal tree's predicted speedup under
    ``curve`` (the cost model of :mod:`sequoia_opt.solver.hardware`). Trees needing a draft forward outside the
    measured draft counts are skipped, as :func:`~sequoia_opt.solver.hardware.choose` skips them (narrower than
    the smallest as wider than the largest: c(w) is never extrapolated); budgets with no scorable tree are left
    out.

    ``budgets`` defaults to :func:`~sequoia_opt.solver.hardware.budget_grid` up to ``max_budget`` (capped at
    the largest measured target count). Returns ``[(budget, speedup), ...]`` sorted by budget.
    """
    from .solver.dp import solve_dp
    from .solver.hardware import budget_grid, draft_outside, step_cost

    p = acceptance.acceptance if isinstance(acceptance, AcceptanceProfile) else acceptance
    top = min(int(max_budget), curve.max_target_tokens(context))
    grid = sorted({int(b) for b in (budgets if budgets is not None else budget_grid(top, curve.target_tokens(context)))
                   if 1 <= int(b) <= top})
    if not grid:
        return []
    sol = solve_dp(p, grid[-1], max_depth, max_branching)
    ms = [m for m in grid for _ in range(max_depth)]
    ds = [d for _ in grid for d in range(1, max_depth + 1)]
    widths_all = sol.level_widths_many(ms, ds)
    max_draft, min_draft = curve.max_draft_tokens(context), curve.min_draft_tokens(context)
    best: dict[int, float] = {}
    for j, (m, d) in enumerate(zip(ms, ds)):
        row = widths_all[j]
        nz = np.nonzero(row)[0]
        widths = [int(x) for x in row[: int(nz[-1]) + 1]]
        if draft_outside(widths, curve.cost_model, min_draft, max_draft):  # c(w) is never extrapolated
            continue
        s = step_cost(widths, float(sol.table[m, d]), curve, context).speedup
        if s > best.get(m, -math.inf):
            best[m] = s
    # a budget is an upper bound: what a smaller budget achieves is available at a larger one too
    out, run = [], -math.inf
    for m, s in sorted(best.items()):
        run = max(run, s)
        out.append((m, run))
    return out


def plot_speedup_vs_budget(
    points: SpeedupPoints | Mapping[str, Any] | Sequence[tuple[int, float]], path: str | Path
) -> Path:
    """Draw speedup over plain decoding (ratio) against the node budget / tree size (nodes incl. root,
    log-2 x axis).

    Drawn: the solver's predicted speedup as a line (``points.predicted``, the best at the budget marked
    with a star), each measured tree as a filled marker labelled with its name, the tree's own prediction as
    a hollow marker of the same colour joined to it by a thin line (so the gap between predicted and measured
    is visible), and a dotted line at 1 (plain decoding). When trees carry tokens per step, a second panel
    shows measured tokens per step with its 95 % interval against the predicted G.

    ``points`` is a :class:`SpeedupPoints`, a mapping with the same keys (``trees`` as TreePoint or dicts),
    or a plain list of ``(budget, predicted_speedup)`` pairs. Raises TreeoptError when there is nothing to
    draw. Returns ``path``.
    """
    pts = _as_points(points)
    if not pts.predicted and not pts.trees:
        raise TreeoptError("nothing to plot: no predicted curve and no measured trees")
    have_tps = any(t.tokens_per_step is not None or t.predicted_tokens_per_step is not None for t in pts.trees)
    fig = _new_figure(13.0 if have_tps else 7.5, 4.8)
    axes = fig.subplots(1, 2 if have_tps else 1)
    ax = axes[0] if have_tps else axes
    ax.axhline(1.0, color="0.4", lw=0.8, ls=":", label="plain decoding (1x)")
    if pts.predicted:
        pr = sorted((int(b), float(s)) for b, s in pts.predicted)
        xb, ys = zip(*pr)
        ax.plot(xb, ys, "-", color="0.15", lw=1.6, marker="." if len(pr) < 40 else None, label=pts.label)
        j = int(np.argmax(ys))
        ax.plot([xb[j]], [ys[j]], "*", color="gold", mec="0.2", ms=14, zorder=5,
                label=f"best predicted: {ys[j]:.2f}x at {xb[j]} nodes")
    for i, t in enumerate(pts.trees):
        colour = f"C{i % 10}"
        if t.predicted_speedup is not None:
            ax.plot([t.size], [t.predicted_speedup], "o", mfc="none", mec=colour, mew=1.5, ms=8)
        if t.speedup is not None:
            ax.plot([t.size], [t.speedup], "o", color=colour, ms=7, label=f"{t.name} ({t.size} nodes)")
            ax.annotate(t.name, (t.size, t.speedup), xytext=(5, 4 + 9 * (i % 2)), textcoords="offset points",
                        fontsize=8, color=colour)
        if t.speedup is not None and t.predicted_speedup is not None:
            ax.plot([t.size, t.size], [t.speedup, t.predicted_speedup], "-", color=colour, lw=0.8, alpha=0.7)
    if any(t.predicted_speedup is not None for t in pts.trees):
        ax.plot([], [], "o", mfc="none", mec="0.3", mew=1.5, label="tree's predicted speedup")
    _log2_x(ax)
    measured = any(t.speedup is not None for t in pts.trees)
    ax.set(xlabel="budget / tree size (nodes incl. root)", ylabel="speedup over plain decoding (x)",
           title="speedup: predicted (line, hollow) vs measured (filled)" if measured else
           "speedup predicted per budget (no run given: nothing measured)")
    ax.set_ylim(0, 1.06 * ax.get_ylim()[1])  # headroom: the best-predicted star sat on the top edge, half cut
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7.5, loc="best")
    if have_tps:
        ax2 = axes[1]
        for i, t in enumerate(pts.trees):
            colour = f"C{i % 10}"
            if t.predicted_tokens_per_step is not None:
                ax2.plot([t.size], [t.predicted_tokens_per_step], "o", mfc="none", mec=colour, mew=1.5, ms=8)
            if t.tokens_per_step is not None:
                yerr = None
                if t.tps_ci95 is not None:
                    yerr = [[max(t.tokens_per_step - t.tps_ci95[0], 0)], [max(t.tps_ci95[1] - t.tokens_per_step, 0)]]
                ax2.errorbar([t.size], [t.tokens_per_step], yerr=yerr, fmt="o", color=colour, ms=7, capsize=3,
                             label=t.name)
        ax2.plot([], [], "o", mfc="none", mec="0.3", mew=1.5, label="predicted G")
        _log2_x(ax2)
        ax2.set(xlabel="tree size (nodes incl. root)", ylabel="tokens per step",
                title="tokens per step: measured (95% interval) vs predicted G (hollow)")
        ax2.set_ylim(bottom=0)
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=7.5, loc="best")
    if pts.title:
        fig.suptitle(pts.title, fontsize=11)
    return _save(fig, path)


def _as_points(points: Any) -> SpeedupPoints:
    if isinstance(points, SpeedupPoints):
        return points
    if isinstance(points, Mapping):
        trees = [t if isinstance(t, TreePoint) else TreePoint(**dict(t)) for t in points.get("trees", [])]
        return SpeedupPoints(
            predicted=[(int(b), float(s)) for b, s in points.get("predicted", [])], trees=trees,
            label=points.get("label", SpeedupPoints.label), title=points.get("title"),
        )
    try:
        return SpeedupPoints(predicted=[(int(b), float(s)) for b, s in points])
    except (TypeError, ValueError):
        raise TreeoptError(
            "speedup points must be SpeedupPoints, a mapping or a list of (budget, speedup) pairs"
        ) from None


# ---------------------------------------------------------------------------------------------- tree
def tree_layout(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates for drawing ``tree`` left to right: ``(x, y)``, each ``(n,)`` float64.

    ``x`` is the depth. Leaves take ``y = 0, 1, 2, ...`` in depth-first order with children in rank order
    (so the rank-0 path comes first); every internal node sits at the mean ``y`` of its children, so
    children are centred on their parent and subtrees never overlap.
    """
    n = tree.size
    x = tree.depth.astype(np.float64)
    y = np.zeros(n, dtype=np.float64)
    children = tree.children
    next_leaf = 0
    stack = [0]
    while stack:  # pre-order DFS, rank 0 first: fixes the leaf order
        v = stack.pop()
        if not children[v]:
            y[v] = next_leaf
            next_leaf += 1
        else:
            stack.extend(reversed(children[v]))
    for v in range(n - 1, -1, -1):  # children have larger indices than parents (canonical order)
        if children[v]:
            y[v] = float(np.mean(y[list(children[v])]))
    return x, y


def plot_tree(
    tree: Tree,
    path: str | Path,
    acceptance: Sequence[float] | AcceptanceProfile | None = None,
    *,
    title: str | None = None,
) -> Path:
    """Draw a speculation tree left to right: x = depth (0 = root, the last committed token), y = the
    :func:`tree_layout` leaf order (rank 0 on top), edges parent -> child.

    Node labels are ranks (the root is ``R``) up to :data:`TREE_LABEL_LIMIT` nodes; larger trees (drawn
    sensibly up to a few hundred nodes) get smaller markers and no labels. With ``acceptance`` (a vector
    p_1..p_K or an :class:`AcceptanceProfile`) each node is coloured by its path probability, the chance it
    is reached and accepted (Sequoia section 3.1), with a colour bar, and the title gives G (expected tokens
    per step); without it nodes are coloured by rank. Returns ``path``.
    """
    x, y = tree_layout(tree)
    n = tree.size
    leaves = int(y.max()) + 1 if n > 1 else 1
    levels = tree.tree_depth + 1
    height = float(np.clip(0.9 + 0.2 * leaves, 3.5, 16.0))
    width = float(np.clip(2.5 + 1.0 * levels, 5.0, 16.0))
    fig = _new_figure(width, height)
    ax = fig.subplots()
    if n > 1:
        segs = [((x[tree.parent[i]], y[tree.parent[i]]), (x[i], y[i])) for i in range(1, n)]
        ax.add_collection(LineCollection(segs, colors="0.55", linewidths=0.9 if n <= TREE_LABEL_LIMIT else 0.5,
                                         zorder=1))
    labels = n <= TREE_LABEL_LIMIT
    px_per_leaf = height * _DPI / max(leaves, 1)
    size = 210.0 if labels else float(np.clip((0.7 * px_per_leaf * 72 / _DPI) ** 2, 4.0, 60.0))
    p = None
    if acceptance is not None:
        p = acceptance.acceptance if isinstance(acceptance, AcceptanceProfile) else np.asarray(acceptance, float)
    if p is not None:
        prob = tree.path_probabilities(p)
        positive = prob[prob > 0]
        low = float(positive.min()) if positive.size else 1.0
        cmap = colormaps["viridis"].with_extremes(under="0.85", bad="0.85")  # probability 0: light grey
        if low < 0.05:  # spans decades: a log scale shows the structure (linear would be all dark)
            norm, scale = LogNorm(vmin=max(low, 1e-4), vmax=1.0), "log scale"
        else:
            norm, scale = Normalize(vmin=0.0, vmax=1.0), "linear"
        shown = np.where(prob > 0, prob, np.nan)
        sc = ax.scatter(x, y, c=shown, cmap=cmap, norm=norm, s=size, edgecolors="0.2", linewidths=0.5,
                        zorder=2, plotnonfinite=True)
        cb = fig.colorbar(sc, ax=ax, shrink=0.8 if height > 5 else 1.0)
        cb.set_label(f"path probability, P(node accepted) ({scale})", fontsize=8)
    else:
        rank = np.asarray(tree.rank)
        cmap = colormaps["tab10"]
        ax.scatter(x, y, c=np.minimum(rank, 9), cmap=cmap, vmin=0, vmax=9, s=size, edgecolors="0.2",
                   linewidths=0.5, zorder=2)
        if n > 1:
            for r in range(min(int(rank[1:].max()), 9) + 1):
                label = f"rank {r}" + ("+" if r == 9 else "")
                ax.scatter([], [], color=cmap(r / 9), edgecolors="0.2", s=30, label=label)
            ax.legend(title="node colour", fontsize=7, title_fontsize=7, loc="upper right", frameon=False)
    if labels:
        text_colour = "white" if p is not None else "black"
        for i in range(n):
            lbl = "R" if i == 0 else str(tree.rank[i])
            colour = text_colour
            if p is not None and (prob[i] <= 0 or norm(prob[i]) > 0.6):
                colour = "black"
            ax.text(x[i], y[i], lbl, ha="center", va="center", fontsize=7, color=colour, zorder=3)
    ax.set_xlim(-0.5, max(levels - 0.5, 0.5))
    ax.set_ylim(leaves - 0.5, -0.5)  # rank 0 path on top
    ax.set_xticks(range(levels))
    ax.set_xlabel("depth (0 = root, the last committed token)")
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    head = title or f"tree: {n} nodes, depth {tree.tree_depth}"
    widths = list(tree.level_widths)
    shown_w = ", ".join(str(w) for w in widths[:16]) + (", ..." if len(widths) > 16 else "")
    head += f"\nlevel widths [{shown_w}]"
    if p is not None:
        head += f", G = {float(prob.sum()):.3f} tokens/step"
        if np.any(prob <= 0):
            head += " (grey: probability 0, rank past the vector)"
    if not labels:
        head += f"  (labels hidden above {TREE_LABEL_LIMIT} nodes)"
    ax.set_title(head, fontsize=9.5)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------- all
def _as_run_dict(run: Any) -> dict[str, Any]:
    if isinstance(run, Mapping):
        return dict(run)
    if hasattr(run, "to_dict"):
        return run.to_dict()
    if isinstance(run, (str, Path)):
        try:
            return json.loads(Path(run).read_text(encoding="utf-8"))
        except OSError as err:
            raise TreeoptError(f"cannot read run report {run}: {err.strerror}") from None
        except json.JSONDecodeError as err:
            raise TreeoptError(f"run report {run} is not valid JSON ({err.msg}, line {err.lineno})") from None
    raise TreeoptError(f"run must be a run report dict, a RunReport or a JSON path, got {type(run).__name__}")


def plot_all(
    out_dir: str | Path,
    *,
    latency: LatencyCurve | None = None,
    acceptance: AcceptanceProfile | None = None,
    run: Mapping[str, Any] | str | Path | Any | None = None,
    tree: Tree | None = None,
    predicted: Sequence[tuple[int, float]] | None = None,
) -> list[Path]:
    """Draw whatever the inputs allow into ``out_dir`` (created if missing) under fixed names:

    - ``latency.png`` from ``latency`` (:func:`plot_latency`),
    - ``acceptance.png`` from ``acceptance`` (:func:`plot_acceptance`),
    - ``speedup_vs_budget.png`` from ``run`` (a ``treeopt-run/1`` dict, a RunReport or the JSON's path)
      and/or ``predicted`` (``(budget, predicted_speedup)`` pairs) (:func:`plot_speedup_vs_budget`),
    - ``tree.png`` from ``tree``, coloured by ``acceptance`` when given (:func:`plot_tree`).

    Every figure is drawn in memory first, then the set is written as one unit
    (:func:`~sequoia_opt._io.write_all`): a stop or a failed write leaves the folder's old PNGs, never some new
    beside some old. Returns the written paths in that order (empty when nothing was given).

    Raises:
        OutputError: a PNG the OS refuses to write (the set is put back as it was).
    """
    out = Path(out_dir)
    pts = None  # read before anything is drawn: a bad run file must not leave the other PNGs replaced
    if run is not None or predicted:
        pts = speedup_points_from_run(_as_run_dict(run)) if run is not None else SpeedupPoints()
        if predicted:
            pts.predicted = [(int(b), float(s)) for b, s in predicted]
    pending: list[tuple[Path, bytes]] = []
    token = _PENDING.set(pending)
    try:
        if latency is not None:
            plot_latency(latency, out / LATENCY_PNG)
        if acceptance is not None:
            plot_acceptance(acceptance, out / ACCEPTANCE_PNG)
        if pts is not None and (pts.predicted or pts.trees):
            plot_speedup_vs_budget(pts, out / SPEEDUP_PNG)
        if tree is not None:
            plot_tree(tree, out / TREE_PNG, acceptance)
    finally:
        _PENDING.reset(token)
    return write_all([(path, lambda p, data=data: atomic_write_bytes(p, data)) for path, data in pending])
