"""The ``treeopt`` command line: a thin layer over the library (typer + rich).

Adding a command: write a function decorated with ``@app.command()`` and ``@handle_errors``, take the shared
option types below (``AcceptanceOpt``, ``LatencyOpt``, ``BudgetOpt``, ...), do the work with library calls,
build a :class:`Report` and pass it to :func:`render` (which prints either rich tables or ``--json``). User
errors are :class:`~sequoia_opt.errors.TreeoptError`: ``handle_errors`` prints them as one red line on stderr
and exits with code 2, without a traceback. Output files are written last, atomically, so a failure leaves
no file behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import torch
import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree as RichTree
from typing_extensions import Annotated

from . import __version__
from ._io import atomic_write_text, read_text_file
from .errors import TreeoptError
from .report import Report
from .tree import Tree, TreeMetadata, now_iso

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
ProfileOutputOpt = Annotated[
    Optional[Path], typer.Option("--output", "-o", help="Write the profile here (atomically); default under profiles/.")
]
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
    # a pipe or file gets wide tables (rich would cut every column to fit 80 characters)
    con = console or (Console() if sys.stdout.isatty() else Console(width=200))
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
    from . import exports

    key = fmt.strip().lower()
    if key not in FORMATS:
        raise TreeoptError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")

    def run(tree: Tree, meta: TreeMetadata, p: Any) -> tuple[str, list[str]]:
        out = exports.export(tree, key, metadata=meta, acceptance=p)
        return out.text, list(out.notes)

    return run


def _measured_on(acc: Any, curve: Any) -> dict[str, Any]:
    """What the profiles behind a tree were measured on (stored in the tree's metadata so ``run`` can warn
    when it executes the tree on another device, dtype or model pair)."""
    out: dict[str, Any] = {}
    for key, value in (("target", acc.measured.get("target")), ("draft", acc.measured.get("draft")),
                       ("device", curve.device.get("name") if curve else None),
                       ("dtype", (curve.device.get("dtype") if curve else None) or acc.measured.get("dtype"))):
        if value is not None:
            out[f"profiled_{key}"] = value
    return out


def tree_mismatch_warnings(name: str, meta: TreeMetadata, *, device: str, dtype: str, target: str,
                           draft: str) -> list[str]:
    """Warnings when a tree was solved from profiles measured on another device / dtype / pair than the
    one it is about to run on (its prediction then describes other hardware)."""
    out = []
    for key, have in (("device", device), ("dtype", dtype), ("target", target), ("draft", draft)):
        want = meta.extra.get(f"profiled_{key}")
        if want is not None and str(want).strip().lower() != str(have).strip().lower():
            out.append(f"tree {name!r} was solved from profiles measured with {key} {want!r}, but this run "
                       f"uses {have!r}: its predicted figures describe that setting")
    return out


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
    width: Annotated[
        Optional[int], typer.Option("--width", "-k", help="Expected K (entries of the acceptance vector); refuse another length.")
    ] = None,
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
        data["context_tokens"] = context if context is not None else int(curve.contexts[0])
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
        extra={"max_branching": max_branching, "budget_limit": budget, **_measured_on(acc, curve)},
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



# ---------------------------------------------------------------------------------------------- shared (models)
TargetOpt = Annotated[
    Optional[Path], typer.Option("--target", "-t", help="Target checkpoint: HF folder or .gguf (default: the demo target).")
]
DraftOpt = Annotated[
    Optional[Path], typer.Option("--draft", help="Draft checkpoint: HF folder or .gguf (default: the bundled demo draft).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu | cuda | cuda:N")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32 | bfloat16 | float16")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Attention backend: auto | torch | cuda")]
PromptsOpt = Annotated[
    Optional[Path], typer.Option("--prompts", help="Prompt file (.jsonl with 'prompt', or blank-line separated text).")
]
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="0 = greedy; > 0 = sampling.")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus mass in (0, 1], applied to target and draft.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the sampling generator.")]


@contextlib.contextmanager
def progress_bar(enabled: bool = True):
    """Yield ``progress(what, done, total)``: a rich progress bar on stderr with an estimate of time left."""
    if not enabled:
        yield lambda what, done, total: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=_err,
                  transient=True) as prog:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            key = what.split(",")[0].split(":")[0]
            if key not in tasks:
                tasks[key] = prog.add_task(what, total=total)
            prog.update(tasks[key], completed=done, total=total, description=what)

        yield update


def _interruptible(fn: F) -> F:
    """Ctrl-C: say that nothing was written (outputs are written atomically, last) and exit 130."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            _err.print("[yellow]interrupted:[/] no output file was written")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _check_run_options(backend: str, device: Any, temperature: float = 0.0, top_p: float = 1.0) -> None:
    """Refuse a bad backend, temperature or top-p before any model is loaded (TreeoptError, one line)."""
    from .attention import resolve_backend
    from .decoding import process_logits

    try:
        resolve_backend(backend, device)
        process_logits(torch.zeros(1), temperature, top_p)
    except (ValueError, RuntimeError) as err:
        raise TreeoptError(str(err)) from None


def _csv_ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TreeoptError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise TreeoptError(f"{what} must list non-negative integers, got {text!r}")
    return sorted(set(vals))


# ---------------------------------------------------------------------------------------------- profile
profile_app = typer.Typer(help="Measure the device (latency curve) and the model pair (acceptance vector).",
                          no_args_is_help=True)
app.add_typer(profile_app, name="profile")


@profile_app.command("latency")
@handle_errors
@_interruptible
def profile_latency(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="Time a random-weight model of --arch's shape (latency does not depend on weight values).")] = False,
    arch: Annotated[Optional[str], typer.Option("--arch", help="Preset name (llama-2-7b, llama-3-8b, ...) or a config.json path, with --random-weights.")] = None,
    draft_arch: Annotated[Optional[str], typer.Option("--draft-arch", help="Draft preset or config.json, with --random-weights.")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    context: Annotated[str, typer.Option("--context", help="Context lengths (tokens), comma-separated.")] = "256",
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Largest target token count n profiled.")] = 128,
    max_draft_tokens: Annotated[int, typer.Option("--max-draft-tokens", help="Largest draft width profiled.")] = 64,
    repeats: Annotated[int, typer.Option("--max-repeats", help="Most timed repeats per point and round.")] = 30,
    rounds: Annotated[int, typer.Option(
        "--rounds", help="Sweeps of the token grid; each point keeps the median of its rounds' medians.")] = 3,
    paired: Annotated[bool, typer.Option(
        "--paired/--unpaired", help="Time each n alternately with n = 1, call by call, and keep T(1) x the "
        "median ratio: the curve's shape survives a machine whose speed drifts (costs one extra 1-token "
        "forward per timed forward).")] = True,
    backend: BackendOpt = "auto",
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: torch's).")] = None,
    output: ProfileOutputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure T(n): one target forward over n tokens through the verification path (KV cache holding the
    context, prefix + tree mask), and c(w) for the draft; plus the fixed per-step overhead."""
    from .model import ModelConfig
    from .model.loaders import load_checkpoint, load_model_config
    from .pipeline import model_label, parse_device, parse_dtype
    from .profiles import save_latency
    from .profiling.device import device_slug
    from .profiling.latency import (build_latency_profile, measure_step_overhead, method_text, profile_model,
                                    random_weight_model)
    from .profiling.timing import token_grid

    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev)
    contexts = _csv_ints(context, "--context")
    if max_tokens < 1 or max_draft_tokens < 1:
        raise TreeoptError("--max-tokens and --max-draft-tokens must be at least 1")
    if repeats < 1:
        raise TreeoptError(f"--max-repeats must be at least 1, got {repeats}")
    if rounds < 1:
        raise TreeoptError(f"--rounds must be at least 1, got {rounds}")
    if not random_weights and (arch or draft_arch):
        raise TreeoptError("--arch / --draft-arch describe random-weight models: add --random-weights")
    if threads is not None:
        if threads < 1:
            raise TreeoptError("--threads must be at least 1")
        torch.set_num_threads(threads)

    def config_of(spec: str) -> ModelConfig:
        path = Path(spec)
        if path.suffix == ".json" or path.is_dir() or path.suffix == ".gguf":
            return load_model_config(path if path.suffix != ".json" else path.parent)
        return ModelConfig.preset(spec)

    if random_weights:
        if arch is None:
            raise TreeoptError("--random-weights needs --arch (a preset name or a config.json)")
        tcfg = config_of(arch)
        tmodel = random_weight_model(tcfg, device=dev, dtype=dt)
        tname = f"{tcfg.name} (random weights)"
        dmodel, dname = None, None
        if draft_arch is not None:
            dcfg = config_of(draft_arch)
            dmodel, dname = random_weight_model(dcfg, device=dev, dtype=dt, seed=1), f"{dcfg.name} (random weights)"
    else:
        from .pipeline import default_draft_path, default_target_path

        tpath = target or default_target_path()
        tmodel, _ = load_checkpoint(tpath, device=dev, dtype=dt)
        tname = model_label(tpath)
        dpath = draft or default_draft_path()
        dmodel, _ = load_checkpoint(dpath, device=dev, dtype=dt)
        dname = model_label(dpath)
    grid = token_grid(max_tokens)
    dgrid = token_grid(max_draft_tokens)
    with progress_bar(not as_json) as progress:
        ttables = profile_model(tmodel, grid, contexts, what="target", backend=backend, progress=progress,
                                rounds=rounds, paired=paired, min_repeats=min(5, repeats), max_repeats=repeats)
        dtables = None
        if dmodel is not None:
            dtables = profile_model(dmodel, dgrid, contexts, what="draft", backend=backend, progress=progress,
                                    rounds=rounds, paired=paired, min_repeats=min(5, repeats),
                                    max_repeats=repeats)
        overhead = measure_step_overhead(tmodel, dmodel if dmodel is not None else tmodel, backend=backend)
    slug = device_slug(dev)
    pid = f"{slug}_{tcfg.name if random_weights else tname}_{dt}".replace("torch.", "")
    curve = build_latency_profile(
        target_tables=ttables, draft_tables=dtables, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=tname, target_config=tmodel.config, draft_name=dname,
        draft_config=dmodel.config if dmodel is not None else None, random_weights=random_weights, profile_id=pid,
        method=method_text(rounds, paired, grid))
    out = output or Path("profiles") / slug / f"{(tcfg.name if random_weights else tname)}-latency.yaml"
    save_latency(out, curve)
    rows = [[n, curve.target_ms(n, c), curve.target_ms(n, c) / curve.target_ms(1, c), c] for c in contexts for n in grid]
    report = Report(title="treeopt profile latency")
    report.summary = {"device": curve.device.get("name"), "dtype": str(dt).removeprefix("torch."),
                      "threads": torch.get_num_threads(), "target": tname, "draft": dname,
                      "step overhead (ms)": overhead, "written": str(out)}
    report.tables.append(("target forward", ["tokens", "ms", "T(n)/T(1)", "context"], rows))
    if dtables is not None:
        report.tables.append(("draft forward", ["tokens", "ms", "context"],
                              [[w, curve.draft_ms(w, c), c] for c in contexts for w in dgrid]))
    if random_weights:
        report.notes.append("timed with RANDOM weights of the model's shape: latency does not depend on weight values")
    if dmodel is None:
        report.warnings.append("no draft profiled: draft cost recorded as 0 ms (pass --draft / --draft-arch)")
    report.data = {"profile": curve.to_dict(), "output": str(out)}
    render(report, as_json)


@profile_app.command("acceptance")
@handle_errors
@_interruptible
def profile_acceptance(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    prompts: PromptsOpt = None,
    width: Annotated[int, typer.Option("--width", "-k", help="K: candidates per node (entries of the vector).")] = 8,
    depth: Annotated[int, typer.Option("--depth", help="Depth of the measurement spine (trials per step).")] = 4,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = 64,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", help="Use only the first N prompts.")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    output: ProfileOutputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure the positional acceptance vector p_1..p_K with the decoder's own verifier (greedy or
    sampling), with counts, 95 % intervals and per-depth vectors."""
    from .pipeline import load_pair, parse_device, parse_dtype
    from .profiles import save_acceptance
    from .profiling.acceptance import build_acceptance_profile, measure_acceptance, positional_check
    from .prompts import demo_prompts_path, load_prompts

    if width < 1 or depth < 1:
        raise TreeoptError("--width and --depth must be at least 1")
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    pair = load_pair(target, draft, device=dev, dtype=dt)
    ids = [pair.tokenizer.encode(p.text) for p in texts]
    with progress_bar(not as_json) as progress:
        counts = measure_acceptance(pair.target, pair.draft, ids, width=width, depth=depth, temperature=temperature,
                                    top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                    eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    pair_slug = f"{pair.target_name}__{pair.draft_name}"
    prof = build_acceptance_profile(
        counts, profile_id=f"{pair_slug}_{mode}", target_name=pair.target_name, draft_name=pair.draft_name,
        temperature=temperature, top_p=top_p, depth=depth, device=str(dev), dtype=str(dt).removeprefix("torch."),
        prompts_file=str(pfile), num_prompts=len(ids), max_new_tokens=max_new_tokens, seed=seed)
    out = output or Path("profiles") / pair_slug / f"acceptance-{mode}.yaml"
    save_acceptance(out, prof)
    ci = prof.confidence_interval()
    report = Report(title="treeopt profile acceptance")
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "mode": mode, "trials": counts.trials,
                      "sum p_k": float(prof.acceptance.sum()), "all rejected": 1 - float(prof.acceptance.sum()),
                      "tokens / step (measurement tree)": counts.tokens / max(counts.steps, 1), "written": str(out)}
    report.tables.append(("positional acceptance vector", ["k", "p_k", "95% low", "95% high", "count"],
                          [[k + 1, float(prof.acceptance[k]), float(ci[k, 0]), float(ci[k, 1]), int(counts.counts[k])]
                           for k in range(width)]))
    check = positional_check(counts)
    if check:
        report.tables.append(("positional assumption: acceptance mass by depth vs pooled",
                              ["depth", "trials", "p_1", "mass", "pooled", "z", "consistent"],
                              [[r["depth"], r["trials"], r["p1"], r["mass"], r["pooled_mass"], r["z"],
                                "yes" if r["consistent"] else "NO"] for r in check]))
        if not all(r["consistent"] for r in check):
            report.notes.append("acceptance differs by depth beyond noise: the solver's positional assumption "
                                "(Sequoia section 3.1) holds only approximately for this pair")
    report.acceptance = None
    report.data = {"profile": prof.to_dict(), "positional_check": check, "output": str(out)}
    render(report, as_json)


# ---------------------------------------------------------------------------------------------- run
@app.command("run")
@handle_errors
@_interruptible
def run_cmd(
    tree: Annotated[list[Path], typer.Option("--tree", help="Tree file(s) to run (treeopt YAML, JSON or a Medusa choice list); repeatable.")],
    target: TargetOpt = None,
    draft: DraftOpt = None,
    prompts: PromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = 128,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", help="Use only the first N prompts.")] = None,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    compare: Annotated[bool, typer.Option("--compare", help="Also run the best chain and k-ary tree under --acceptance (and --latency).")] = False,
    acceptance: Annotated[Optional[Path], typer.Option("--acceptance", "-a", help="Acceptance profile for --compare baselines.")] = None,
    latency: LatencyOpt = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    results_dir: Annotated[Path, typer.Option("--results-dir", help="Where <run-id>.json and .csv go.")] = Path("results"),
    as_json: JsonOpt = False,
) -> None:
    """Run plain decoding and tree speculative decoding on the same prompts; report speedup, tokens per
    step against the prediction, the time split, and (greedy) exact equality with plain decoding."""
    from .pipeline import load_pair, parse_device, parse_dtype
    from .prompts import demo_prompts_path, load_prompts

    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    entries = [_load_tree_entry(p) for p in tree]
    seen: dict[str, int] = {}
    for e in entries:  # two files called tree.yaml in different folders must not share a results row name
        seen[e.name] = seen.get(e.name, 0) + 1
        if seen[e.name] > 1:
            e.name = f"{e.name}#{seen[e.name]}"
    if compare:
        entries += _baseline_entries(acceptance, latency, max(e.tree.size for e in entries),
                                     max(max(e.tree.tree_depth for e in entries), 1))
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    texts = load_prompts(prompts or demo_prompts_path("eval"), limit=num_prompts)
    pair = load_pair(target, draft, device=dev, dtype=dt)
    _check_trees_fit(entries, pair)
    ids = [pair.tokenizer.encode(p.text) for p in texts]
    from .profiling.device import device_name

    warnings = [w for e in entries for w in tree_mismatch_warnings(
        e.name, e.metadata, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        target=pair.target_name, draft=pair.draft_name)]
    report = _run_and_report(pair, entries, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, seed=seed, backend=backend, results_dir=results_dir, as_json=as_json,
                             settings={"prompts": str(prompts or "demo eval prompts")})
    report.warnings = warnings + report.warnings
    render(report, as_json)
    if report.data.get("greedy_ok") is False:
        raise typer.Exit(1)


def _load_tree_entry(path: Path):
    from .evaluation import TreeEntry
    from .exports import load_any_tree

    tree, meta = load_any_tree(path)
    return TreeEntry(name=path.stem, tree=tree, metadata=meta or TreeMetadata())


def _baseline_entries(acceptance: Optional[Path], latency: Optional[Path], budget: int, max_depth: int):
    from .evaluation import TreeEntry
    from .profiles import load_acceptance, load_latency
    from .solver import compare_baselines

    if acceptance is None:
        raise TreeoptError("--compare needs --acceptance (to pick the best chain and k-ary tree)")
    acc = load_acceptance(acceptance)
    curve = load_latency(latency) if latency else None
    out = []
    for b in compare_baselines(acc.acceptance, budget, max_depth, 32, curve):
        if b.name.startswith(("chain", "k-ary")):
            meta = TreeMetadata(budget=b.tree.size, expected_tokens_per_step=b.expected_tokens,
                                predicted_speedup=b.cost.speedup if b.cost else None, acceptance_profile=acc.id,
                                latency_profile=curve.id if curve else None, solver=f"baseline:{b.name}")
            out.append(TreeEntry(name=f"{b.name} " + " ".join(f"{k}={v}" for k, v in b.params.items()),
                                 tree=b.tree, metadata=meta))
    return out


def _check_trees_fit(entries, pair) -> None:
    """Refuse trees the draft cannot produce (wider than the vocabulary, deeper than the context)."""
    V = pair.draft.config.vocab_size
    ctx = min(pair.target.config.max_position_embeddings, pair.draft.config.max_position_embeddings)
    for e in entries:
        if e.tree.max_branching_used > V:
            raise TreeoptError(f"tree {e.name!r} has a node with {e.tree.max_branching_used} children; the draft's "
                               f"vocabulary has only {V} tokens")
        if e.tree.tree_depth >= ctx:
            raise TreeoptError(f"tree {e.name!r} has depth {e.tree.tree_depth}; the models have {ctx} positions")


def _run_and_report(pair, entries, ids, *, max_new_tokens, temperature, top_p, seed, backend, results_dir,
                    as_json, settings) -> Report:
    from .evaluation import run_trees

    with progress_bar(not as_json) as progress:
        run = run_trees(pair.target, pair.draft, entries, ids, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_p=top_p, seed=seed, eos_ids=sorted(pair.tokenizer.eos_ids),
                        backend=backend, progress=progress,
                        settings={"target": pair.target_name, "draft": pair.draft_name, **settings})
    jpath, cpath = run.save(results_dir)
    report = Report(title="treeopt run")
    plain = run.summaries[0]
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "prompts": len(ids),
                      "max new tokens": max_new_tokens, "mode": "greedy" if temperature == 0 else "sampling",
                      "plain decoding (tokens/s)": plain.tokens_per_s, "results": f"{jpath}, {cpath}"}
    rows = []
    for s in run.summaries[1:]:
        rows.append([s.tree, s.size, s.depth, s.tokens_per_step, f"{s.tps_ci95[0]:.3f}-{s.tps_ci95[1]:.3f}",
                     s.predicted_tokens_per_step, s.tokens_per_s, s.speedup, s.predicted_speedup,
                     s.draft_ms, s.verify_ms, s.bookkeeping_ms,
                     "-" if temperature else ("yes" if s.mismatches == 0 else f"NO ({s.mismatches})")])
    report.tables.append(("trees against plain decoding",
                          ["name", "nodes", "depth", "tokens/step", "95% CI", "predicted", "tokens/s", "speedup",
                           "pred. speedup", "draft ms", "verify ms", "bookkeeping ms", "= plain"], rows))
    for m in run.mismatch_details:
        report.warnings.append(f"tree {m['tree']!r} differs from plain decoding on prompt {m['prompt_index']} at "
                               f"position {m['first_mismatch']}: plain {m['plain']} vs tree {m['tree_output']}")
    report.data = {**run.to_dict(), "greedy_ok": run.greedy_ok if temperature == 0 else None,
                   "json": str(jpath), "csv": str(cpath)}
    return report


# ---------------------------------------------------------------------------------------------- plot
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
    from .plots import plot_all, predicted_speedup_curve
    from .profiles import load_acceptance, load_latency

    if not any((latency, acceptance, run, tree)):
        raise TreeoptError("nothing to plot: pass --latency, --acceptance, --run and/or --tree")
    curve = load_latency(latency) if latency else None
    acc = load_acceptance(acceptance) if acceptance else None
    run_doc = None
    if run is not None:
        text = read_text_file(run, error=TreeoptError, what="run results file")
        try:
            run_doc = json.loads(text)
        except json.JSONDecodeError as err:
            raise TreeoptError(f"cannot read run results file {run}: {str(err).splitlines()[0]}") from None
    t = _load_tree_entry(tree).tree if tree else None
    predicted = None
    if curve is not None and acc is not None:
        predicted = predicted_speedup_curve(acc.acceptance, curve, curve.max_target_tokens(), max_depth,
                                            max(acc.width, 1))
    paths = plot_all(out_dir, latency=curve, acceptance=acc, run=run_doc, tree=t, predicted=predicted)
    report = Report(title="treeopt plot", summary={"written": ", ".join(str(p) for p in paths)})
    report.data = {"written": [str(p) for p in paths]}
    render(report, as_json)


# ---------------------------------------------------------------------------------------------- demo
@app.command("demo")
@handle_errors
@_interruptible
def demo_cmd(
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per evaluation prompt.")] = 64,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Evaluation prompts (held out from profiling).")] = 6,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller profiles and runs (a smoke test of the pipeline).")] = False,
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where profiles, the tree, results and plots go.")] = Path("results/demo"),
    backend: BackendOpt = "auto",
    as_json: JsonOpt = False,
) -> None:
    """The main job on the bundled demo pair: profile this device and the pair, solve, run on held-out
    prompts, and print predicted against measured figures."""
    from .demo import run_demo
    from .pipeline import parse_device

    _check_run_options(backend, parse_device(device))
    with progress_bar(not as_json) as progress:
        result = run_demo(device=device, dtype=dtype, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
                          quick=quick, out_dir=out_dir, backend=backend, progress=progress)
    report = result.report
    render(report, as_json)
    if result.greedy_ok is False:
        raise typer.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    app()
