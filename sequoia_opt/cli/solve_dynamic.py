"""``treeopt solve --dynamic CAL.yaml -l LAT.yaml``: predict every dynamic-tree setting (EAGLE-2, entropy,
best-first) from a calibration profile, choose the hardware-aware best, print the table, and export it (the
``treeopt-dynamic/1`` file; SGLang flags and TensorRT-LLM EAGLE-3 settings for the best ``eagle`` setting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from .._io import atomic_write_text
from ..errors import SolverError
from ..report import Report
from .render import render, report_console


def solve_dynamic(calibration: Path, latency: Optional[list[Path]], acceptance: Optional[list[Path]], *,
                  budget: Optional[int], max_depth: Optional[int], policies: Optional[str], context: Optional[int],
                  output: Optional[Path], fmt: Optional[str], as_json: bool, max_branching: Optional[int] = None,
                  acceptance_model: str = "auto", width: Optional[int] = None) -> None:
    """``treeopt solve --dynamic CALIBRATION``: every dynamic-tree setting of the grid predicted from the
    calibration profile (tokens per step) and the latency curve (ms), the best per policy chosen and written as a
    ``treeopt-dynamic/1`` setting or an engine's flags. ``max_branching`` (default 32), ``acceptance_model`` and
    ``width`` (the entries the -a profile must have) shape the static DP tree ``acceptance`` adds, as
    ``treeopt solve`` would solve it. Raises TreeoptError / SolverError (one line, exit 2)."""
    from .. import exports
    from ..profiles.calibration import calibration_warnings, load_calibration, same_pair
    from ..dynamic import POLICY_NAMES
    from ..drafting.registry import head_engine_methods
    from ..profiles import load_latency
    from .common import load_acceptance_width
    from ..solver import choose
    from ..solver.dynamic import choose_dynamic, setting_grid

    if not latency or len(latency) != 1:
        raise SolverError("--dynamic needs one --latency profile (T(n) of the target, c(w) of the drafter)")
    if acceptance and len(acceptance) > 1:
        raise SolverError("--dynamic compares with one static tree: give at most one --acceptance")
    try:
        key = exports.normalise_format(fmt) if fmt else "yaml"
    except exports.ExportError:  # its list of formats names static-tree ones too: say what --dynamic writes
        key = None
    if key not in exports.DYNAMIC_EXPORT_FORMATS:
        raise SolverError(f"--dynamic writes {', '.join(exports.DYNAMIC_EXPORT_FORMATS)}, not {fmt!r}")
    pols = tuple(p.strip() for p in policies.split(",")) if policies is not None else POLICY_NAMES
    if not any(pols):
        raise SolverError(f"--policy names no rule; choose from {', '.join(POLICY_NAMES)} (or drop --policy)")
    bad = [p for p in pols if p not in POLICY_NAMES]
    if bad:
        raise SolverError(f"unknown --policy {', '.join(bad)}; choose from {', '.join(POLICY_NAMES)}")
    if key in ("sglang", "tensorrt-llm") and "eagle" not in pols:
        raise SolverError(f"{key} runs the eagle rule only: include eagle in --policy")
    if budget is not None and budget < 2:
        raise SolverError(f"--budget counts the root: a dynamic tree needs at least 2 nodes, got {budget}")
    if max_depth is not None and max_depth < 1:
        raise SolverError(f"--max-depth must be at least 1, got {max_depth}")
    if max_branching is not None and max_branching < 1:
        raise SolverError(f"--max-branching must be at least 1, got {max_branching}")
    from ..solver.depth import check_acceptance_model

    check_acceptance_model(acceptance_model)
    cal = load_calibration(calibration)
    curve = load_latency(latency[0])
    acc = load_acceptance_width(acceptance[0], width) if acceptance else None
    same_pair(cal, curve, acc)
    report = Report(title="treeopt solve --dynamic")
    report.warnings.extend(calibration_warnings(cal, acc=acc))
    top_n = curve.max_target_tokens(context)
    limit = budget if budget is not None else min(64, top_n)
    if limit > top_n:
        report.notes.append(f"--budget {limit} is past the latency profile's largest measured token count {top_n}: "
                            f"clamped to {top_n} (T(n) is never extrapolated)")
        limit = top_n
    rec = cal.recording
    if max_depth is not None and max_depth > rec["steps"]:
        report.notes.append(f"--max-depth {max_depth} is deeper than the calibration recorded ({rec['steps']} levels):"
                            f" clamped to {rec['steps']} (record deeper with profile acceptance --calibration-steps)")
    grid = setting_grid(cal, policies=pols, max_budget=limit, max_steps=max_depth)
    if not grid:
        raise SolverError(f"no dynamic setting fits budget {limit} and depth {max_depth}")
    ch = choose_dynamic(cal, curve, grid, context=context)
    report.notes.extend(ch.notes)
    best = ch.best
    rows: list[list[Any]] = []
    shown = {}
    for r in ch.rows:  # the best of each (policy, budget), not every tie
        k = (r.setting.policy, r.setting.budget)
        if k not in shown:
            shown[k] = r
    static = static_model = None
    if acc is not None:  # the static tree as treeopt solve finds and scores it: its limits and value model
        from ..solver.depth import solve_profile
        from ..solver.hardware import SINGLE_DEFAULTS

        depth = max_depth or SINGLE_DEFAULTS["max_depth"]
        branching = max_branching or SINGLE_DEFAULTS["max_branching"]
        sol, static_model = solve_profile(acc, limit, depth, branching, acceptance_model)
        static = choose(acc.acceptance, curve, limit, depth, branching, context=context, solution=sol)
    for r in sorted(shown.values(), key=lambda r: -r.tokens_per_s):
        s = r.setting
        rows.append([s.policy, s.steps, s.topk, s.budget, r.tokens_per_step, r.replay, r.tree_size, r.forwards,
                     r.draft_ms, r.target_ms, r.tokens_per_s, r.speedup, r.coverage])
    if static is not None:
        rows.append([f"static DP ({static_model} acceptance)", static.tree.tree_depth, static.tree.max_branching_used, static.tree.size,
                     static.expected_tokens, None, static.tree.size, None, None, None, static.tokens_per_s,
                     static.speedup, None])
    report.tables.append((
        "dynamic settings (best per policy and budget; predicted: recorded draft trees valued by the calibration "
        "curve; replay: by the recorded acceptances)",
        ["policy", "steps", "topk", "budget", "tokens/step", "replay", "nodes", "draft fwd", "draft ms",
         "target ms", "tokens/s", "speedup", "coverage"], rows))
    best_eagle = ch.best_of("eagle")
    report.summary = {
        "calibration profile": cal.id, "latency profile": curve.id, "ECE": cal.ece(),
        "recorded steps": len(cal.steps), "settings scored": len(ch.rows),
        "chosen": best.label, "predicted tokens / step": best.tokens_per_step,
        "predicted tokens / s": best.tokens_per_s, "predicted speedup": best.speedup,
    }
    if static is not None:
        report.summary["static DP tree speedup"] = static.speedup
        report.summary["static DP acceptance model"] = static_model
    if best.speedup < 1.0:
        report.warnings.append(f"no dynamic setting beats plain decoding on this latency curve (the best, "
                               f"{best.label}, predicts {best.speedup:.2f}x): serve without speculation"
                               + (f", or the static DP tree ({static.speedup:.2f}x)" if static is not None
                                  and static.speedup > 1.0 else "") + "; its setting is still exported")
    elif static is not None and static.speedup > best.speedup:
        report.warnings.append(f"the static DP tree ({static.speedup:.2f}x predicted) beats the best dynamic "
                               f"setting ({best.label}, {best.speedup:.2f}x)")
    data: dict[str, Any] = {"chosen": best.to_dict(), "rows": [r.to_dict() for r in ch.rows], "notes": ch.notes}
    if static is not None:
        data["static"] = {"choices": static.tree.choices(), "acceptance_model": static_model,
                          "expected_tokens_per_step": static.expected_tokens, "speedup": static.speedup}
    provenance = {"calibration_profile": cal.id, "latency_profile": curve.id,
                  "target": cal.measured.get("target"), "draft": cal.measured.get("draft"),
                  "temperature": cal.temperature}  # run warns when it decodes otherwise
    methods = head_engine_methods(cal.measured.get("draft"))  # a feature head: the engines' own method for it
    if best_eagle is not None:
        for engine in ("sglang", "tensorrt-llm"):
            try:
                data[engine] = exports.export_dynamic(best_eagle.setting, engine, methods=methods).text
            except exports.ExportError as e:
                report.notes.append(str(e))
        if "sglang" in data:
            report.summary["SGLang flags (best eagle)"] = json.loads(data["sglang"])["cli_flags"]
        if best_eagle is not best:
            report.notes.append(f"engines run the eagle rule: their setting is the best eagle one, "
                                f"{best_eagle.label} ({best_eagle.speedup:.3f}x predicted)")
    target = best if key in ("yaml", "json") else best_eagle
    exp = exports.export_dynamic(target.setting, key, predicted=target.to_dict(), provenance=provenance,
                                 methods=methods)
    report.notes.extend(exp.notes)
    report.warnings.extend(exp.warnings)  # a stand-in the engine would try to load (SGLang's head path)
    data["export"] = {"format": key, "text": exp.text, "notes": list(exp.notes), "warnings": list(exp.warnings)}
    if output is not None:
        atomic_write_text(output, exp.text)
        report.summary["written"] = str(output)
        data["output"] = str(output)
    report.data = data
    if fmt is not None and output is None and not as_json:  # stdout carries the export alone, the report stderr
        render(report, False, console=report_console(stderr=True))
        typer.echo(exp.text, nl=False)
    else:
        render(report, as_json)
