"""``treeopt solve``: the DP-optimal tree for an acceptance profile, the hardware-aware choice of budget and
depth from a latency profile, baselines side by side, and the exports for serving engines.

With ``--pair-acceptance`` (two drafters, issue 16): two ``-a`` and two ``-l`` (the light drafter's, then the
strong one's) and the pair profile give the hardware-aware grafted tree
(:func:`~sequoia_opt.jobs.graft.plan_graft`), written as ``treeopt-tree/2``, beside the baselines under the same
cost model: each drafter alone and SpecInfer's merge of their own trees."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from typing_extensions import Annotated

from .._io import atomic_write_text
from ..errors import ProfileError, TreeoptError
from ..report import Report
from ..solver.hardware import SINGLE_DEFAULTS, check_budget_measured, run_costs
from ..tree import Tree, TreeMetadata, now_iso
from .common import ContextOpt, FormatOpt, JsonOpt, OutputOpt, app, check_output, handle_errors
from .render import render, report_console

def _exporter(fmt: str) -> Callable[[Tree, TreeMetadata, Any], Any]:
    """Resolve the output format before any work is done (so a bad format writes nothing); returns a
    function giving the :class:`~sequoia_opt.exports.Export` of a tree."""
    from .. import exports

    try:
        key = exports.normalise_format(fmt)
    except exports.ExportError:
        raise TreeoptError(f"unknown --format {fmt!r}; choose one of {', '.join(exports.EXPORT_FORMATS)}, "
                           "llama.cpp") from None

    def run(tree: Tree, meta: TreeMetadata, p: Any, drafter: str | None = None) -> Any:
        from ..drafting.registry import head_engine_methods

        return exports.export(tree, key, metadata=meta, acceptance=p, methods=head_engine_methods(drafter))

    return run


def _measured_on(acc: Any, curve: Any) -> dict[str, Any]:
    """What the profiles behind a tree were measured on (stored in the tree's metadata so ``run`` can warn
    when it executes the tree on another device, dtype or model pair, or other weights of one name)."""
    out: dict[str, Any] = {}
    if curve is not None and curve.engine != "treeopt":
        out["profiled_engine"] = curve.engine
    for key, value in (("target", acc.measured.get("target")), ("draft", acc.measured.get("draft")),
                       ("draft_cost_model", curve.cost_model if curve else acc.measured.get("draft_cost_model")),
                       ("device", curve.device.get("name") if curve else None),
                       ("dtype", (curve.device.get("dtype") if curve else None) or acc.measured.get("dtype")),
                       ("omp_wait_policy", curve.device.get("omp_wait_policy") if curve else None),
                       ("temperature", acc.measured.get("temperature")),
                       ("top_p", acc.measured.get("top_p")),
                       ("threads", curve.device.get("threads")
                        if curve and curve.device.get("type") == "cpu" else None)):
        if value is not None:
            out[f"profiled_{key}"] = value
    if isinstance(acc.measured.get("weights"), dict):  # which checkpoints: run compares their fingerprints
        out["profiled_weights"] = acc.measured["weights"]
    return out


AcceptancesOpt = Annotated[Optional[list[Path]], typer.Option(
    "--acceptance", "-a", help="Acceptance profile (treeopt-acceptance/1 YAML); with --pair-acceptance given twice: "
    "the light drafter's, then the strong one's.")]
LatenciesOpt = Annotated[Optional[list[Path]], typer.Option(
    "--latency", "-l", help="Latency profile (treeopt-latency/1 YAML); enables the hardware-aware choice. With "
    "--pair-acceptance given twice: the light drafter's, then the strong one's.")]
PairAcceptanceOpt = Annotated[Optional[Path], typer.Option(
    "--pair-acceptance", help="Pair profile of a light and a strong drafter (treeopt-acceptance-pair/1, treeopt "
    "profile graft): solve the grafted tree both grow, from it and two -a / -l (light first).")]


@app.command()
@handle_errors
def solve(
    acceptance: AcceptancesOpt = None,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", "-n", help="Largest tree size considered (nodes, root included; default 128; with "
        "--pair-acceptance the largest target token count both latency profiles measured).")] = None,
    max_depth: Annotated[Optional[int], typer.Option(
        "--max-depth", "-d", help="Depth limit D, the root is depth 0 (default 16; with --pair-acceptance 8).")] = None,
    latency: LatenciesOpt = None,
    max_branching: Annotated[Optional[int], typer.Option(
        "--max-branching", "-b", help="Most children per node B (default 32; with --pair-acceptance 8).")] = None,
    pair_acceptance: PairAcceptanceOpt = None,
    dynamic: Annotated[Optional[Path], typer.Option(
        "--dynamic", help="Calibration profile (treeopt-calibration/1, treeopt profile acceptance --calibration): "
        "predict every dynamic-tree setting (EAGLE-2, entropy, best-first) with -l, print the table and export the "
        "hardware-aware best (--format yaml|json|sglang|tensorrt-llm); -a adds the static DP tree for comparison.")] = None,
    policy: Annotated[Optional[str], typer.Option(
        "--policy", help="With --dynamic: the rules to score, comma-separated (eagle,entropy,best-first; default all).")] = None,
    plan: Annotated[str, typer.Option(
        "--plan", help="With --pair-acceptance, the tree written: auto (the best predicted tokens/s with the strong "
        "drafter called every step; may hold one drafter's nodes) | graft (the best tree holding both drafters' "
        "nodes: what a scheduler, treeopt profile scheduler, calls the strong drafter of only where it pays) | "
        "merge (each drafter's own best tree, the strong one grafted at the root).")] = "auto",
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
    batch: Annotated[Optional[str], typer.Option(
        "--batch", help="Batch sizes, comma-separated (1,4,16): the hardware-aware tree per batch size from a "
        "treeopt-latency-batch/1 profile (-l), printed as a table; -o writes one plan file for a server, "
        "--format ENGINE adds that engine's setting per batch range.")] = None,
    run_prompts: Annotated[Optional[int], typer.Option(
        "--run-prompts", help="Size of the prompt set the tree will be measured on: the prediction interval shown "
        "(and stored in the tree) is for a new set of that many prompts (default: as many as the profile's).")] = None,
) -> None:
    """Find the speculation tree with the most expected tokens per second (or per step without --latency).
    With --pair-acceptance: the grafted tree of a light and a strong drafter, against each alone and their
    SpecInfer merge."""
    from ..errors import SolverError
    from ..profiles import load_latency, warn_on_mismatch
    from .common import load_acceptance_width
    from ..solver import choose, compare_baselines
    from ..solver.depth import ValueModel, check_acceptance_model, solve_profile

    if run_prompts is not None and run_prompts < 1:
        raise SolverError(f"--run-prompts must be at least 1, got {run_prompts}")
    if run_prompts is not None and (batch is not None or dynamic is not None or pair_acceptance is not None):
        raise SolverError("--run-prompts sizes the prediction interval of one drafter's static tree: drop it with "
                          "--batch, --dynamic or --pair-acceptance")
    if fmt is not None and not fmt:  # --format "$FMT" with FMT unset: `fmt or "yaml"` below read it as no --format,
        _exporter(fmt)  # and YAML went into -o tree.json; refused as ' ' is: one line naming the formats
    if output is not None and str(output) == "-":  # the Unix spelling of standard output: --format without -o
        if batch is not None or pair_acceptance is not None:
            raise SolverError("-o -: a batch plan or a grafted tree is written to a file only; give a file name")
        output, fmt = None, fmt or "yaml"
    check_output(output, {"--acceptance": acceptance, "--latency": latency, "--dynamic": dynamic,
                          "--pair-acceptance": pair_acceptance})
    if output is not None and output.suffix.lower() == ".json" and pair_acceptance is not None:
        raise SolverError(f"-o {output}: a grafted tree (treeopt-tree/2) is written as YAML only; name the file .yaml")
    if batch is not None:
        if dynamic is not None or pair_acceptance is not None or compare:
            raise SolverError("--batch solves one drafter's static tree per batch size: drop --dynamic, "
                              "--pair-acceptance and --compare")
        given = [k for k, v in (("--policy", policy is not None), ("--plan", plan != "auto")) if v]
        if given:  # the dynamic rules and the grafted plan have no batch table: they were dropped without a word
            raise SolverError(f"--batch solves one drafter's static tree per batch size: drop {', '.join(given)}")
        if not acceptance or len(acceptance) > 1 or (latency and len(latency) > 1):
            raise SolverError("--batch takes one --acceptance and one --latency profile")
        from .solve_batch import solve_batch

        solve_batch(batch, acceptance[0], latency[0] if latency else None,
                    budget=SINGLE_DEFAULTS["budget"] if budget is None else budget,  # lowered per batch size there
                    max_depth=SINGLE_DEFAULTS["max_depth"] if max_depth is None else max_depth,
                    max_branching=SINGLE_DEFAULTS["max_branching"] if max_branching is None else max_branching,
                    context=context, output=output, fmt=fmt, acceptance_model=acceptance_model, width=width,
                    as_json=as_json)
        return
    from .engine import is_llamacpp_format

    if is_llamacpp_format(fmt):
        from .engine import solve_llamacpp

        solve_llamacpp(acceptance=acceptance, latency=latency, max_depth=max_depth, context=context, output=output,
                       acceptance_model=acceptance_model, as_json=as_json,
                       other={"--dynamic": dynamic, "--pair-acceptance": pair_acceptance, "--budget": budget,
                              "--max-branching": max_branching, "--compare": compare, "--width": width,
                              "--policy": policy, "--plan": plan != "auto"})
        return
    if fmt is None and output is not None and output.suffix.lower() == ".json" and pair_acceptance is None:
        fmt = "json"  # -o tree.json: the JSON export its name says (a grafted tree: refused above)
    if dynamic is not None:
        if pair_acceptance is not None:
            raise SolverError("--dynamic and --pair-acceptance solve different things: give one")
        given = [k for k, v in (("--compare", compare), ("--plan", plan != "auto")) if v]
        if given:  # no baselines, no grafted plan: they were dropped without a word
            raise SolverError(f"--dynamic scores dynamic-tree settings: drop {', '.join(given)}")
        given = [k for k, v in (("--width", width is not None), ("--max-branching", max_branching is not None),
                                ("--acceptance-model", acceptance_model != "auto")) if v]
        if given and not acceptance:
            raise SolverError(f"with --dynamic, {', '.join(given)} shape the static DP tree -a adds: add -a "
                              "ACCEPTANCE.yaml (or drop them)")
        from .solve_dynamic import solve_dynamic

        solve_dynamic(dynamic, latency, acceptance, budget=budget, max_depth=max_depth, policies=policy,
                      context=context, output=output, fmt=fmt, as_json=as_json, max_branching=max_branching,
                      acceptance_model=acceptance_model, width=width)
        return
    if policy is not None:
        raise SolverError("--policy chooses dynamic rules: add --dynamic CALIBRATION.yaml (or drop --policy)")
    if not acceptance:
        raise SolverError("Missing option '--acceptance' / '-a': an acceptance profile (treeopt profile acceptance), "
                          "or --dynamic CALIBRATION.yaml (see 'treeopt solve --help')")
    if pair_acceptance is not None:
        _solve_graft(pair_acceptance, acceptance, latency, budget=budget, max_depth=max_depth,
                     max_branching=max_branching, context=context, output=output, fmt=fmt, width=width,
                     acceptance_model=acceptance_model, as_json=as_json, plan=plan)
        return
    if plan != "auto":
        raise SolverError("--plan chooses which grafted tree to write: add --pair-acceptance (or drop --plan)")
    for opt, given in (("--acceptance", acceptance), ("--latency", latency)):
        if given is not None and len(given) > 1:
            raise SolverError(f"{opt} was given {len(given)} times: one profile solves one drafter's tree; a light "
                              "and a strong drafter's (two -a, two -l, light first) solve a grafted tree with "
                              "--pair-acceptance PAIR.yaml")
    acceptance = acceptance[0]
    latency = latency[0] if latency else None
    budget_given = budget is not None
    budget = SINGLE_DEFAULTS["budget"] if budget is None else budget
    max_depth = SINGLE_DEFAULTS["max_depth"] if max_depth is None else max_depth
    max_branching = SINGLE_DEFAULTS["max_branching"] if max_branching is None else max_branching
    export = _exporter(fmt or "yaml")
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    if context is not None and latency is None:
        raise SolverError("--context selects where to read the latency profile: pass --latency too (or drop it)")
    if context is not None and context < 0:
        raise SolverError(f"--context must be a number of tokens >= 0, got {context}")
    check_acceptance_model(acceptance_model)
    acc = load_acceptance_width(acceptance, width)
    curve = load_latency(latency) if latency is not None else None
    p = acc.acceptance
    report = Report(title="treeopt solve")
    limit = acc.depth_limit
    if limit is not None and limit < max_depth:
        report.notes.append(f"max depth {limit} (asked {max_depth}): profile {acc.id!r} measured a drafter that "
                            f"proposes depths 1..{limit} only (Medusa's {limit} heads); a deeper tree would be cut "
                            "every step")
        max_depth = limit
    if curve is not None and not budget_given and curve.max_target_tokens(context) < budget:
        measured = curve.max_target_tokens(context)
        report.notes.append(f"budget {measured} (the default is {budget}): latency profile {curve.id!r} was measured "
                            f"up to {measured} target tokens, and T(n) is never extrapolated (--budget sets it)")
        budget = measured
    if curve is not None:  # refuse a budget T(n) was not measured for before the DP (minutes at 50,000 nodes)
        try:
            check_budget_measured(budget, curve, context)
        except ProfileError as err:  # the file the user gave, not only the id inside it
            raise ProfileError(f"{latency}: {err}") from None
    report.warnings = warn_on_mismatch(acceptance=acc, latency=curve)
    if curve is not None:  # a tree is only as good as the curve of the engine that serves it (issue 20)
        from .. import exports
        from ..engines import FORMAT_ENGINES, engine_mismatch

        key = exports.normalise_format(fmt or "yaml")
        w = engine_mismatch(curve, FORMAT_ENGINES.get(key, key), what=f"--format {key}")
        if w:
            report.warnings.append(w)
    report.acceptance = p
    data: dict[str, Any] = {
        "acceptance_profile": acc.id,
        "latency_profile": curve.id if curve else None,
        "budget_limit": budget,
        "max_depth": max_depth,
        "max_branching": max_branching,
    }

    sol, model_used = solve_profile(acc, budget, max_depth, max_branching, acceptance_model)
    vm = ValueModel.of_profile(acc, model_used)  # every G this command prints: the solved tree's and the baselines'
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
                f"best choices (DP-optimal tree per budget and depth limit; G: {vm.label})",
                ["budget", "max depth", "nodes", "G", "draft ms", "target ms", "cost ms", "tokens/s", "speedup"],
                [
                    [a.budget, a.depth, a.size, a.cost.expected_tokens, a.cost.draft_ms, a.cost.target_ms,
                     a.cost.cost_ms, a.cost.tokens_per_s, a.cost.speedup]
                    for a in ch.alternatives
                ],
            )
        )
        if ch.skipped:
            report.notes.append(f"{ch.skipped} candidates skipped: their draft forwards fall outside the measured "
                                "draft counts")
    spreads = _prediction_spreads(tree, acc, model_used, ch.alternatives[0].cost if curve is not None else None,
                                  run_prompts, report, data)

    if compare:
        base = compare_baselines(p, budget, max_depth, max_branching, curve, context=context,
                                 best_first_budget=chosen_budget, by_depth=vm.rows)
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
        report.tables.append((f"baselines (G: {vm.label}, as the solved tree; same cost model)", cols, rows))

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
               **vm.run_checks(tree), **run_costs(tree, curve, context), **_measured_on(acc, curve), **spreads},
    )
    data["tree"] = {"choices": tree.choices(), "metadata": meta.to_dict()}
    out = None
    if output is not None or fmt is not None:
        out = export(tree, meta, p, acc.measured.get("draft"))  # a feature head: the engine's method named
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
        render(report, False, console=report_console(stderr=True))
        typer.echo(out.text, nl=False)
    else:
        render(report, as_json)


def _prediction_spreads(tree: Tree, acc: Any, model: str, cost: Any, run_prompts: Optional[int], report: Report,
                        data: dict[str, Any]) -> dict[str, Any]:
    """The solved tree's intervals between prompts (:func:`~sequoia_opt.solver.intervals.spread_metadata`): tokens
    per step, and the speedup with a step cost, each with the interval of the mean and the prediction interval for
    a new set of ``run_prompts`` prompts (default: the profile's count), added to the report's summary and
    ``data``. Returns the tree metadata entries (what ``treeopt run`` rescales to its own prompt count); empty, with
    a note, for a profile without per-prompt counts."""
    from ..solver.intervals import PromptSpread, spread_metadata

    out = spread_metadata(tree, acc, model, cost, run_prompts)
    if not out:
        report.notes.append(f"acceptance profile {acc.id!r} keeps no per-prompt counts (written before treeopt kept "
                            "them, or from one prompt): no interval between prompts; re-measure it with treeopt "
                            "profile acceptance --prompts FILE")
        return {}
    g = PromptSpread.from_dict(out["tokens_per_step_spread"])
    for key, what in (("tokens_per_step_spread", "tokens / step"), ("speedup_spread", "speedup")):
        if key in out:
            d = out[key]
            lo, hi = d["prediction_interval"]
            report.summary[f"{what}, 95 % prediction interval"] = f"{lo:.3f} to {hi:.3f} (a new set of " \
                                                                  f"{d['new_prompts']} prompts)"
            lo, hi = d["mean_interval"]
            report.summary[f"{what}, 95 % interval of the mean"] = f"{lo:.3f} to {hi:.3f} ({d['prompts']} profile " \
                                                                   "prompts)"
    need = (f"; an interval of the mean 0.1 tokens/step wide needs {g.prompts_needed(0.1)} profile prompts of this "
            "kind") if g.sd > 0 else ""  # a root-only tree's figure does not vary
    report.notes.append(f"intervals between prompts: a cluster bootstrap over the profile's {g.prompts} prompts (their "
                        "tokens are correlated, so prompts are resampled, not tokens); the prediction interval adds a "
                        f"new set's own variation{need}")
    data["intervals"] = out
    return out


#: A grafted tree's limits when none is given (the graft DP runs per depth limit and grafting set: a smaller
#: default than one drafter's).
GRAFT_DEFAULTS = {"max_depth": 8, "max_branching": 8}


def _solve_graft(pair_path: Path, acceptance: list[Path], latency: Optional[list[Path]], *, budget: Optional[int],
                 max_depth: Optional[int], max_branching: Optional[int], context: Optional[int],
                 output: Optional[Path], fmt: Optional[str], width: Optional[int], acceptance_model: str,
                 as_json: bool, plan: str = "auto") -> None:
    """``treeopt solve --pair-acceptance``: every check and the profiles' agreement first (one line, exit 2,
    nothing written), then :func:`~sequoia_opt.jobs.graft.plan_graft` and the report: the chosen grafted tree,
    the best candidates, and the baselines (each drafter alone, the SpecInfer merge) under the same cost
    model. The tree is written as ``treeopt-tree/2`` (-o, or ``--format yaml`` to stdout).

    Raises:
        SolverError / ProfileError: not two -a and two -l, an option a grafted tree does not take, profiles
            that do not name the pair's drafters in order, limits the profiles cannot score.
    """
    from .. import exports
    from ..errors import ProfileError, SolverError
    from ..jobs.compare import check_drafter_profiles
    from ..jobs.graft import GraftProfiles, plan_graft
    from ..profiles import load_acceptance, load_latency, load_pair_acceptance, warn_on_mismatch
    from ..tree import drafter_tree_to_yaml, save_drafter_tree

    if plan not in ("auto", "graft", "merge"):
        raise SolverError(f"--plan {plan!r}: choose auto, graft or merge")
    n_lat = len(latency or [])
    if len(acceptance) != 2 or n_lat != 2:
        raise SolverError(f"--pair-acceptance grafts two drafters: pass two -a and two -l, the light drafter's then the "
                          f"strong one's (got {len(acceptance)} -a and {n_lat} -l)")
    if fmt is not None:
        try:
            key = exports.normalise_format(fmt)
        except exports.ExportError:
            key = None
        if key != "yaml":
            raise SolverError(f"--format {fmt}: a grafted tree is written as treeopt-tree/2 YAML only (the engines' "
                              "formats hold one drafter's tree)")
    if width is not None:
        raise SolverError("--width checks one acceptance profile's length; drop it with --pair-acceptance")
    if acceptance_model != "auto":
        raise SolverError("--acceptance-model chooses one drafter's value model; a grafted tree's is the pair profile's "
                          "(drop it with --pair-acceptance)")
    max_depth = GRAFT_DEFAULTS["max_depth"] if max_depth is None else max_depth
    max_branching = GRAFT_DEFAULTS["max_branching"] if max_branching is None else max_branching
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value is not None and value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    if context is not None and context < 0:
        raise SolverError(f"--context must be a number of tokens >= 0, got {context}")
    pair = load_pair_acceptance(pair_path)
    accs = [load_acceptance(a) for a in acceptance]
    curves = [load_latency(lat) for lat in latency]
    names, models = pair.drafters, pair.cost_models
    for name, cost_model, acc, curve in zip(names, models, accs, curves):
        try:
            check_drafter_profiles(name, cost_model, acc, curve)
        except ProfileError as err:
            raise ProfileError(f"{err} (pair profile {pair.id!r} names light {names[0]!r} and strong {names[1]!r}: "
                               "pass -a and -l in that order)") from None
    if budget is None:
        budget = min(c.max_target_tokens(context) for c in curves)
    report = Report(title="treeopt solve --pair-acceptance")
    for acc, curve in zip(accs, curves):
        for w in warn_on_mismatch(acceptance=acc, latency=curve):
            if w not in report.warnings:
                report.warnings.append(w)
    for acc in accs:
        for key in ("target", "temperature", "top_p"):
            have, want = acc.measured.get(key), pair.measured.get(key)
            if have is not None and want is not None and str(have) != str(want):
                report.warnings.append(f"acceptance profile {acc.id!r} was measured with {key} {have!r}, the pair "
                                       f"profile {pair.id!r} with {want!r}: the model mixes two settings")
    profiles = GraftProfiles(names[0], names[1], models[0], models[1], curves[0], curves[1], accs[0], accs[1], pair)
    plans = plan_graft(profiles, budget=budget, max_depth=max_depth, max_branching=max_branching, context=context)
    ch, dtree = plans.choice, plans.choice.dtree
    fix = deeper_measurement_advice(pair, dtree.tree_depth)
    for x in plans.extrapolated:  # what the value model did not measure, and how it was valued
        deeper = dtree.tree_depth > x["measured_depth"]
        (report.warnings if deeper else report.notes).append(
            f"value model: {x['text']}" + (f"; the chosen tree reaches depth {dtree.tree_depth}, deeper than that "
                                           f"measurement: profile {fix}" if deeper else ""))
    ctx = context if context is not None else int(curves[0].contexts[0])
    meta = plans.metadata["graft"]
    if plan != "auto":  # a tree holding both drafters, for a scheduler, whether or not it wins called every step
        from ..jobs.graft import scheduled_candidates
        from ..solver.graft import drafter_costs_ms, graft_expected_tokens, graft_step_cost

        want = {"graft": "solver graft", "merge": "merge as graft"}[plan]
        found = dict(scheduled_candidates(plans)).get(want)
        if found is None:
            raise SolverError(f"--plan {plan}: no tree holding both drafters' nodes fits these limits and profiles "
                              f"(the strong drafter adds nothing the DP keeps; or, for merge, a drafter's own best "
                              f"tree is the root alone or the light tree's root has other than the "
                              f"{pair.light_width} children the pair profile measured)")
        g = graft_expected_tokens(found, plans.acceptance)
        cost = graft_step_cost(found, curves[0], curves, context, expected_tokens=g)
        ch = dataclasses.replace(ch, dtree=found, plan=f"{plan} (--plan)", budget=found.size, depth=found.tree_depth,
                                 expected_tokens=g, cost=cost, drafter_ms=drafter_costs_ms(found, curves, context))
        dtree = found
        meta = dataclasses.replace(meta, budget=found.size, max_depth=found.tree_depth, expected_tokens_per_step=g,
                                   predicted_speedup=cost.speedup, extra={
                                       **meta.extra, "graft_plan": plan,
                                       "light_part_expected_tokens_per_step": graft_expected_tokens(
                                           found.light_only()[0], plans.acceptance)})
    meta.extra.update({"max_branching": max_branching, "budget_limit": budget, "context_tokens": ctx,
                       "light_latency_profile": curves[0].id})
    # what run compares with its own (tree_mismatch_warnings), as for a one-drafter tree (_measured_on: the pair
    # profile and the light drafter's curve), less what names one drafter (its name, cost model, weights, engine:
    # graft_weights records the three models' weights); the light profile's where the pair's does not say
    on = _measured_on(pair, curves[0])
    for key in ("draft", "draft_cost_model", "weights", "engine"):
        on.pop(f"profiled_{key}", None)
    for key in ("target", "temperature", "top_p"):
        if on.get(f"profiled_{key}") is None and accs[0].measured.get(key) is not None:
            on[f"profiled_{key}"] = accs[0].measured[key]
    meta.extra.update(on)

    def cells(name: str, nodes, per, depth, g, cost, tps, speedup) -> list:
        return [name, nodes, " ".join(map(str, per)), depth, g, cost, tps, speedup]

    rows = [cells(f"graft ({ch.plan}, chosen)", dtree.size, dtree.drafter_counts, dtree.tree_depth,
                  ch.expected_tokens, ch.cost.cost_ms, ch.tokens_per_s, ch.speedup)]
    for b in plans.baselines:
        rows.append(cells(b["name"], b["size"], b["nodes_per_drafter"], b["depth"], b["expected_tokens"],
                          b["cost_ms"], b["tokens_per_s"], b["speedup"]))
        if b.get("note"):
            report.notes.append(b["note"])
    report.summary = {
        "pair profile": pair.id, "light drafter": names[0], "strong drafter": names[1],
        "acceptance profiles": f"{accs[0].id}, {accs[1].id}", "latency profiles": f"{curves[0].id}, {curves[1].id}",
        "context (tokens)": ctx, "plan": ch.plan, "graft depths": list(ch.graft_depths), "nodes": dtree.size,
        "nodes per drafter": ", ".join(f"{n} {c}" for n, c in zip(names, dtree.drafter_counts)),
        "depth": dtree.tree_depth, "level widths": list(dtree.level_widths),
        "expected tokens / step": ch.expected_tokens, "step cost (ms)": ch.cost.cost_ms,
        "tokens / s": ch.tokens_per_s, "plain decoding (ms / token)": ch.plain_ms_per_token,
        "predicted speedup": ch.speedup}
    report.tables.append(("grafted tree against the baselines (one cost model: each drafter pays for the nodes it "
                          "processes, the target for the whole tree)",
                          ["name", "nodes", "nodes per drafter", "depth", "G", "cost ms", "tokens/s", "speedup"], rows))
    report.tables.append(("best candidates (DP-optimal grafted tree per budget, depth limit and grafting set)",
                          ["plan", "budget", "max depth", "graft depths", "nodes", "G", "cost ms", "tokens/s",
                           "speedup"],
                          [[c["plan"], c["budget"], c["max_depth"], " ".join(map(str, c["graft_depths"])) or "-",
                            c["nodes"], c["expected_tokens_per_step"], c["cost_ms"], c["tokens_per_s"], c["speedup"]]
                           for c in ch.candidates[:5]]))
    if ch.skipped:
        report.notes.append(f"{ch.skipped} candidates skipped: their draft widths exceed a measured draft curve")
    singles = [b for b in plans.baselines if b["name"] in ("light alone", "strong alone") and b["tokens_per_s"]]
    best = max(singles, key=lambda b: b["tokens_per_s"], default=None)
    if plan != "auto" and best is not None:
        report.notes.append(f"--plan {plan}: with the strong drafter called every step this tree predicts "
                            f"{ch.tokens_per_s:.4g} tokens/s against {best['name']}'s {best['tokens_per_s']:.4g}; "
                            "a scheduler (treeopt profile scheduler --tree ...) calls it only where it pays")
    elif ch.plan == "graft" and best is not None:
        report.notes.append(f"grafting pays here: predicted {ch.tokens_per_s:.4g} tokens/s against {best['name']}'s "
                            f"{best['tokens_per_s']:.4g} ({ch.tokens_per_s / best['tokens_per_s'] - 1:+.1%})")
    elif ch.plan != "graft":
        holds = ("the root alone: plain decoding, which no speculation beats here" if ch.dtree.tree.size < 2 else
                 "that drafter's nodes alone")
        report.notes.append(f"grafting does not pay on this hardware under these profiles: the best plan is {ch.plan} "
                            f"(the tree written holds {holds})")
    data: dict[str, Any] = {
        "pair_acceptance_profile": pair.id, "drafters": list(names), "cost_models": list(models),
        "acceptance_profiles": [a.id for a in accs], "latency_profiles": [c.id for c in curves],
        "budget_limit": budget, "max_depth": max_depth, "max_branching": max_branching, "context_tokens": ctx,
        "choice": {"plan": ch.plan, "budget": ch.budget, "max_depth": ch.depth, "graft_depths": list(ch.graft_depths),
                   "nodes": dtree.size, "depth": dtree.tree_depth, "nodes_per_drafter": list(dtree.drafter_counts),
                   "level_widths": list(dtree.level_widths), "expected_tokens_per_step": ch.expected_tokens,
                   "drafter_ms": list(ch.drafter_ms), "cost_ms": ch.cost.cost_ms, "tokens_per_s": ch.tokens_per_s,
                   "speedup": ch.speedup},
        "plain_ms_per_token": ch.plain_ms_per_token, "candidates": ch.candidates,
        "candidates_scored": ch.considered, "candidates_skipped": ch.skipped, "baselines": plans.baselines,
        "tree": {**dtree.to_dict(), "metadata": meta.to_dict()}}
    text = drafter_tree_to_yaml(dtree, meta)
    if output is not None:
        save_drafter_tree(output, dtree, meta)
        report.notes.append(f"wrote treeopt-tree/2 to {output}")
        data["output"] = str(output)
    report.tree = dtree.tree
    report.data = data
    if fmt is not None and output is None and not as_json:  # as one drafter's --format without -o: stdout = the tree
        render(report, False, console=report_console(stderr=True))
        typer.echo(text, nl=False)
    else:
        render(report, as_json)


def deeper_measurement_advice(pair, depth: int) -> str:
    """What to profile when a grafted tree of ``depth`` reaches past the rows the pair profile ``pair`` measured
    (:class:`~sequoia_opt.profiles.PairAcceptanceProfile`): more trials per depth where its spines reached
    ``depth`` but too few trials kept a row of its own there (a depth keeps one from
    :data:`~sequoia_opt.profiles.pair.PAIR_MIN_TRIALS` trials), else a deeper spine. It always said "a deeper spine",
    also to a user whose 2-prompt profile had spines of depth 3."""
    from ..profiles.pair import PAIR_MIN_TRIALS

    spine = max(pair.counts_by_depth)  # the deepest level the spines reached
    if spine >= depth:
        return (f"more trials per depth (treeopt profile graft --num-prompts / --max-new-tokens: a depth keeps its "
                f"own row from {PAIR_MIN_TRIALS} trials; the spines reached depth {spine})")
    return "a deeper spine (treeopt profile graft --depth)"
