"""``treeopt run``: plain and tree speculative decoding on the same prompts, speedup and tokens per step
against the prediction, and (greedy) token-for-token equality with plain decoding."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from ..tree import TreeMetadata
from .common import (BackendOpt, DeviceOpt, DraftOpt, DtypeOpt, JsonOpt, LatencyOpt, PromptsOpt, SeedOpt,
                     TargetOpt, TemperatureOpt, TopPOpt, _check_run_options, _interruptible, _load_tree_entry, app,
                     handle_errors, progress_bar, setting_notes)
from .render import render


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
    from ..pipeline import load_pair, parse_device, parse_dtype
    from ..prompts import demo_prompts_path, load_prompts

    from ..pipeline import parse_drafter_spec

    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    spec = parse_drafter_spec(draft)  # a bad --draft fails before anything is read
    entries = [_load_tree_entry(p) for p in tree]
    seen: dict[str, int] = {}
    for e in entries:  # two files called tree.yaml in different folders must not share a results row name
        seen[e.name] = seen.get(e.name, 0) + 1
        if seen[e.name] > 1:
            e.name = f"{e.name}#{seen[e.name]}"
    if not compare and (acceptance is not None or latency is not None):
        raise TreeoptError("--acceptance / --latency choose the --compare baselines; add --compare (or drop them)")
    baseline_notes: list[str] = []
    if compare:
        extra, baseline_notes = _baseline_entries(acceptance, latency, max(e.tree.size for e in entries),
                                                  max(max(e.tree.tree_depth for e in entries), 1))
        entries += extra
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    pfile = prompts or demo_prompts_path("eval")
    texts = load_prompts(pfile, limit=num_prompts)
    settings_notes = setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                   prompts_found=len(texts), prompts_file=pfile)
    pair = load_pair(target, spec, device=dev, dtype=dt)
    _check_trees_fit(entries, pair)
    ids = [pair.tokenizer.encode(p.text) for p in texts]
    from ..profiling.device import device_name

    warnings = [w for e in entries for w in tree_mismatch_warnings(
        e.name, e.metadata, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        target=pair.target_name, draft=pair.draft_name)]
    report = _run_and_report(pair, entries, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, seed=seed, backend=backend, results_dir=results_dir, as_json=as_json,
                             settings={"prompts": str(prompts or "demo eval prompts")})
    report.warnings = warnings + report.warnings
    report.notes = baseline_notes + settings_notes + report.notes
    if compare:
        report.data["baseline_notes"] = baseline_notes
    render(report, as_json)
    if report.data.get("greedy_ok") is False:
        raise typer.Exit(1)


def _baseline_entries(acceptance: Optional[Path], latency: Optional[Path], budget: int,
                      max_depth: int) -> tuple[list, list[str]]:
    """The best chain and k-ary tree within ``budget`` nodes and ``max_depth`` (the largest tree's size and
    depth), scored under the acceptance profile (and latency profile). Returns ``(entries, notes)``: when
    the latency profile stops short of ``budget`` tokens the baselines are chosen within what it measured,
    and a note says so (it goes to the output and the JSON)."""
    from ..evaluation import TreeEntry
    from ..profiles import load_acceptance, load_latency
    from ..solver import compare_baselines

    if acceptance is None:
        raise TreeoptError("--compare needs --acceptance (to pick the best chain and k-ary tree)")
    acc = load_acceptance(acceptance)
    curve = load_latency(latency) if latency else None
    notes = []
    if curve is not None and budget > curve.max_target_tokens():
        measured = curve.max_target_tokens()
        notes.append(f"--compare baselines limited to {measured} nodes (asked: {budget}, the largest tree): latency "
                     f"profile {curve.id!r} was measured up to {measured} target tokens; profile more tokens "
                     f"(treeopt profile latency --max-tokens {budget}) to compare at the trees' size")
        budget = measured
    out = []
    for b in compare_baselines(acc.acceptance, budget, max_depth, 32, curve):
        if b.name.startswith(("chain", "k-ary")):
            if b.note:
                notes.append(b.note)
            meta = TreeMetadata(budget=b.tree.size, expected_tokens_per_step=b.expected_tokens,
                                predicted_speedup=b.cost.speedup if b.cost else None, acceptance_profile=acc.id,
                                latency_profile=curve.id if curve else None, solver=f"baseline:{b.name}")
            out.append(TreeEntry(name=f"{b.name} " + " ".join(f"{k}={v}" for k, v in b.params.items()),
                                 tree=b.tree, metadata=meta))
    return out, notes


def _check_trees_fit(entries, pair) -> None:
    """Refuse trees the draft cannot produce (a node with more children than the vocabulary has tokens).
    A tree deeper than what the context has left is not refused: the decoder clips it, step by step, to the
    levels that fit (see :class:`~sequoia_opt.decoding.SpeculativeDecoder`)."""
    V = pair.vocab_size
    for e in entries:
        if e.tree.max_branching_used > V:
            raise TreeoptError(f"tree {e.name!r} has a node with {e.tree.max_branching_used} children; the "
                               f"vocabulary has only {V} tokens")


def _run_and_report(pair, entries, ids, *, max_new_tokens, temperature, top_p, seed, backend, results_dir,
                    as_json, settings) -> Report:
    from ..evaluation import run_trees

    with progress_bar() as progress:
        run = run_trees(pair.target, pair.new_drafter, entries, ids, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_p=top_p, seed=seed, eos_ids=sorted(pair.tokenizer.eos_ids),
                        backend=backend, progress=progress,
                        settings={"target": pair.target_name, "draft": pair.draft_name,
                                  "draft_cost_model": pair.cost_model, **settings})
    jpath, cpath = run.save(results_dir)
    report = Report(title="treeopt run")
    plain = run.summaries[0]
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "prompts": len(ids),
                      "max new tokens": max_new_tokens, "mode": "greedy" if temperature == 0 else "sampling",
                      "plain decoding (tokens/s)": plain.tokens_per_s, "results": f"{jpath}, {cpath}"}
    rows = []
    for s in run.summaries[1:]:
        rows.append([s.tree, s.size, s.depth, s.tokens_per_step, f"{s.tps_ci95[0]:.3f} to {s.tps_ci95[1]:.3f}",
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
