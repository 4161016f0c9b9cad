"""``treeopt solve --batch 1,4,16,...``: the hardware-aware tree per batch size from a per-batch latency profile
(``treeopt profile latency --batch``), printed as a table and written as one plan file a server reads
(:mod:`sequoia_opt.solver.batch`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from ..errors import SolverError
from ..report import Report
from .render import render, report_console

#: --format values that give an engine setting per batch range (the yaml / json tree formats do not apply).
ENGINE_FORMATS = ("sglang", "vllm", "tensorrt-llm", "medusa")


def solve_batch(batch: str, acceptance: Path, latency: Optional[Path], *, budget: int, max_depth: int,
                max_branching: int, context: Optional[int], output: Optional[Path], fmt: Optional[str],
                acceptance_model: str, as_json: bool, width: Optional[int] = None) -> None:
    """Every check first (one line, exit 2), then one :func:`choose` per batch size, the table and the plan.
    ``width``: the entries the acceptance profile must have (``--width``), or None."""
    from .. import exports
    from ..profiles import warn_on_mismatch
    from .common import load_acceptance_width
    from ..jobs.tune import load_given_latency
    from ..profiles.batch import check_starts_at_one, parse_batches
    from ..solver.batch import choose_per_batch, plan_document, save_plan
    from ..solver.depth import solve_profile

    batches = parse_batches(batch)
    check_starts_at_one(batches, f"--batch {batch}")  # tree_for_batch(1) must answer
    if latency is None:
        raise SolverError("--batch chooses a tree per batch size from T(b, n): pass --latency PROFILE "
                          "(treeopt profile latency --batch 1,2,4,...)")
    key = None
    if fmt is not None:
        try:
            key = exports.normalise_format(fmt)
        except exports.ExportError:
            key = fmt
        if key not in ENGINE_FORMATS:
            raise SolverError(f"--batch with --format takes an engine format ({', '.join(ENGINE_FORMATS)}): one "
                              f"setting per batch range goes into the plan file; got {fmt!r}")
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    prof = load_given_latency(Path(latency), context or 0)  # a batch profile, a T(b, n) table or a batch-1 curve
    for b in batches:
        prof.curve(b)  # refuses a batch size the profile did not measure, before solving
    acc = load_acceptance_width(acceptance, width)
    sol, model_used = solve_profile(acc, budget, max_depth, max_branching, acceptance_model)
    p = acc.acceptance
    chs = choose_per_batch(p, prof, batches, budget, max_depth, max_branching, context=context, solution=sol)
    engine: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    # the exports' own lines (a release that no longer takes trees, a tree's head count), each once with the
    # batch sizes it is about
    said: dict[tuple[str, str], list[int]] = {}
    if key is not None:
        for c in chs:
            if c.tree.size < 2:
                engine[c.batch] = {key: None}
                notes.append(f"batch {c.batch}: the best tree is root-only, run the engine without speculation")
                continue
            ex = exports.export(c.tree, key, acceptance=p)
            for kind, lines in (("warning", ex.warnings), ("note", ex.notes)):
                for line in lines:
                    said.setdefault((kind, line), []).append(c.batch)
            text = ex.text.strip()
            engine[c.batch] = {key: json.loads(text) if text.startswith("{") else text}
    speculating = [c.batch for c in chs if c.tree.size > 1]
    labelled = {(k, line): line if bs == speculating else f"batch {', '.join(map(str, bs))}: {line}"
                for (k, line), bs in said.items()}  # a line every speculating batch size shares needs no label
    notes.extend(t for (k, _), t in labelled.items() if k == "note")
    ctx = context if context is not None else int(prof.curve(batches[0]).contexts[0])
    doc = plan_document(chs, acceptance_profile=acc.id, latency_profile=prof.id, context=ctx, engine=engine)
    report = Report(title="treeopt solve --batch")
    report.warnings = warn_on_mismatch(acceptance=acc, latency=prof.curve(batches[0])) + [
        t for (k, _), t in labelled.items() if k == "warning"]
    report.summary = {"acceptance profile": acc.id, "latency profile": prof.id, "acceptance model": model_used,
                      "context (tokens)": ctx or "none recorded (a T(b, n) table)",
                      "batch sizes": ",".join(map(str, batches))}
    report.tables.append((
        "hardware-aware tree per batch size (rates predicted)",
        ["batch", "range", "nodes", "depth", "G", "step ms", "tok/s per seq", "tok/s total", "plain tok/s total",
         "speedup"],
        [[e["batch"], f"{e['batch_range'][0]}-{e['batch_range'][1]}", e["nodes"], e["depth"],
          e["expected_tokens_per_step"], e["step_cost_ms"], e["tokens_per_s_per_sequence"], e["tokens_per_s_total"],
          e["batch"] * e["plain_tokens_per_s_per_sequence"], e["speedup"]] for e in doc["entries"]]))
    lowered = [c for c in chs if c.budget_limit < budget]
    if lowered:
        notes.append("budget lowered to the largest measured n at batch " + ", ".join(
            f"{c.batch} ({c.budget_limit})" for c in lowered))
    report.notes.extend(notes)
    if output is not None:
        save_plan(output, doc)
        report.notes.append(f"wrote the batch plan (treeopt-batch-trees/1) to {output}")
    report.data = doc | ({"output": str(output)} if output is not None else {})
    if key is not None and output is None and not as_json:
        # --format without -o: stdout carries the settings per batch range alone (as one tree's export does);
        # the report goes to stderr
        render(report, False, console=report_console(stderr=True))
        settings = [{"batch_range": e["batch_range"], key: e["engine"][key]} for e in doc["entries"]]
        typer.echo(yaml.safe_dump(settings, sort_keys=False, default_flow_style=None), nl=False)
    else:
        render(report, as_json)
