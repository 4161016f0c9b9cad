"""``treeopt profile layers``: for the self layer-skip drafter (``--draft self:L``), acceptance and c(w) over a
grid of L with the target's T(n) once, keeping the L with the best predicted speedup."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, DeviceOpt, DtypeOpt, JsonOpt, MaxBranchingOpt, MaxDepthOpt, PromptsOpt, SeedOpt,
                     TargetOpt, TemperatureOpt, TopPOpt, _check_run_options, _check_writable,
                     handle_errors, profile_app, progress_bar, setting_notes)
from .render import render


def _powers_of_two_to(top: int) -> list[int]:
    """1, 2, 4, ... up to ``top``, and ``top`` itself: the draft widths ``profile layers`` times per L (the
    solver interpolates c(w) between them and never reads past ``top``)."""
    out, w = [], 1
    while w < top:
        out.append(w)
        w *= 2
    return out + [top]


@profile_app.command("layers")
@handle_errors
def profile_layers(
    target: TargetOpt = None,
    layers: Annotated[Optional[str], typer.Option(
        "--layers", help="L values to sweep, comma-separated, each in 1..n_layers-1 (default: 6 spread evenly, "
        "ending at n_layers-1).")] = None,
    prompts: PromptsOpt = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", help="Use only the first N prompts.")] = None,
    width: Annotated[int, typer.Option("--width", "-k", help="K: candidates per node (entries of the vector).")] = 8,
    depth: Annotated[int, typer.Option("--depth", help="Depth of the acceptance measurement spine.")] = 4,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt and L.")] = 32,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    budget: Annotated[Optional[int], typer.Option(
        "--budget", "-n", help="Largest tree size considered (nodes, root included; default and most: "
        "--max-tokens).")] = None,
    max_depth: MaxDepthOpt = 10,
    max_branching: MaxBranchingOpt = 8,
    context: Annotated[int, typer.Option("--context", help="Context length (tokens) the latency is timed and "
                                         "read at.")] = 256,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Largest target token count n timed.")] = 64,
    max_draft_tokens: Annotated[int, typer.Option(
        "--max-draft-tokens", help="Largest draft width w timed per L (w = 1, 2, 4, ... and this).")] = 64,
    repeats: Annotated[int, typer.Option("--max-repeats", help="Most timed repeats per point and round.")] = 30,
    rounds: Annotated[int, typer.Option(
        "--rounds", help="Sweeps of each token grid; each point keeps the median of its rounds' medians.")] = 3,
    paired: Annotated[bool, typer.Option(
        "--paired/--unpaired", help="Time each n alternately with n = 1 and keep T(1) x the median ratio "
        "(target and drafts alike).")] = True,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: torch's).")] = None,
    output_dir: Annotated[Path, typer.Option(
        "--output-dir", help="Where the best L's profiles go: <dir>/<target>__self-L<L>/acceptance-<mode>.yaml "
        "and <dir>/<device>/<target>__self-L<L>[-<dtype>]-latency.yaml (the dtype when not float32).")
    ] = Path("profiles"),
    as_json: JsonOpt = False,
) -> None:
    """Find the best L for the self layer-skip drafter (--draft self:L) on this device: per L, measure the
    acceptance vector and the draft cost c(w), let the hardware-aware solver pick a tree, and keep the L with
    the highest predicted speedup. The target's T(n) is timed once. Writes the best L's acceptance and
    latency profiles."""
    from ..drafting.drafters import LayerSkipDrafter
    from ..errors import SolverError
    from ..model.loaders import load_model_config
    from ..jobs.load import (ModelPair, check_default_profile, default_latency_path, default_target_path, load_pair,
                             parse_device, parse_drafter_spec, parse_dtype, precision_suffix)
    from ..profiles import save_acceptance, save_latency
    from ..profiling.acceptance import build_acceptance_profile
    from ..device import device_name, device_slug
    from ..profiling.latency import measure_step_overhead, profile_model
    from ..profiling.layers import check_layers, default_layer_grid, sweep_layers
    from ..profiling.timing import token_grid
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts
    from ..solver import choose

    # every check that needs no weights, before any model loads
    asked: list[int] | None = None
    if layers is not None:
        try:
            asked = [int(x) for x in layers.split(",") if x.strip()]
        except ValueError:
            raise TreeoptError(f"--layers must be comma-separated integers (L values), got {layers!r}") from None
        if not asked:
            raise TreeoptError("--layers lists no L: give comma-separated L values in 1..n_layers-1, or leave it "
                               "out for the default grid")
    for name, value in (("--width", width), ("--depth", depth), ("--max-new-tokens", max_new_tokens),
                        ("--max-tokens", max_tokens), ("--max-draft-tokens", max_draft_tokens),
                        ("--max-repeats", repeats), ("--rounds", rounds)):
        if value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    if num_prompts is not None and num_prompts < 1:
        raise TreeoptError(f"--num-prompts must be at least 1, got {num_prompts}")
    budget = max_tokens if budget is None else budget
    for name, value in (("--budget", budget), ("--max-depth", max_depth), ("--max-branching", max_branching)):
        if value < 1:
            raise SolverError(f"{name} must be at least 1, got {value}")
    if budget > max_tokens:
        raise TreeoptError(f"--budget {budget} exceeds --max-tokens {max_tokens}, the largest target count timed; "
                           "the solver does not extrapolate T(n) (raise --max-tokens or lower --budget)")
    if context < 0:
        raise TreeoptError(f"--context must be a number of tokens >= 0, got {context}")
    if threads is not None and threads < 1:
        raise TreeoptError("--threads must be at least 1")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    tp = Path(target) if target else default_target_path()
    cfg = load_model_config(tp)
    n_layers = cfg.n_layers
    if n_layers < 2:
        raise TreeoptError(f"the target has {n_layers} layer: a self:L draft needs at least 2 (L in 1..n_layers-1)")
    grid = check_layers(asked, n_layers, what="--layers") if asked is not None else default_layer_grid(n_layers)
    longest = context + max(max_tokens, max_draft_tokens)
    if longest > cfg.max_position_embeddings:
        raise TreeoptError(f"--context {context} + {max(max_tokens, max_draft_tokens)} tokens exceeds the target's "
                           f"context of {cfg.max_position_embeddings} tokens (lower --context or --max-tokens / "
                           "--max-draft-tokens)")
    if width > cfg.vocab_size:
        raise TreeoptError(f"--width {width} asks for more candidates per node than the vocabulary has tokens "
                           f"({cfg.vocab_size})")
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    slug = device_slug(dev)
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    if threads is not None:
        torch.set_num_threads(threads)

    pair = load_pair(tp, parse_drafter_spec(f"self:{grid[-1]}"), device=dev, dtype=dt)
    tmodel, tname = pair.target, pair.target_name

    def pair_for(L: int) -> ModelPair:
        return ModelPair(tmodel, None, pair.tokenizer, tname, f"self:{L}", parse_drafter_spec(f"self:{L}"), tp)

    def outputs(L: int) -> tuple[Path, Path]:  # the latency where profile latency writes it (another dtype: its own)
        return (output_dir / pair_for(L).slug / f"acceptance-{mode}.yaml",
                output_dir / default_latency_path(tname, parse_drafter_spec(f"self:{L}"), slug,
                                                  precision_suffix(dt)).relative_to("profiles"))

    weights = pair.weights
    for L in grid:  # a path that cannot be written fails now, not after the sweep
        for path in outputs(L):
            _check_writable(path)
        check_default_profile(outputs(L)[0], weights, "--output-dir")  # another target's of the same name
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    tgrid = token_grid(max_tokens)
    dgrid = _powers_of_two_to(max_draft_tokens)
    timing = {"min_repeats": min(5, repeats), "max_repeats": repeats}
    with progress_bar() as progress:
        ttables = profile_model(tmodel, tgrid, [context], what="target", backend=backend, progress=progress,
                                rounds=rounds, paired=paired, **timing)
        overhead = measure_step_overhead(tmodel, lambda: LayerSkipDrafter(tmodel, grid[0]), backend=backend)
        sweep = sweep_layers(
            tmodel, ids, target_tables=ttables, step_overhead_ms=overhead, layers=grid, width=width, depth=depth,
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, draft_tokens=dgrid,
            budget=budget, max_depth=max_depth, max_branching=max_branching,
            eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, context=context, target_name=tname,
            device=dev, dtype=dt, progress=progress, rounds=rounds, paired=paired, **timing)
    best = sweep.best
    L = best.num_layers
    if best.counts.trials == 0:
        raise TreeoptError(f"self:{L} recorded no verification trials (every generation stopped before a step "
                           "drafted); raise --max-new-tokens or use longer prompts. Nothing was written")
    acc_out, lat_out = outputs(L)
    prof = build_acceptance_profile(
        best.counts, profile_id=f"{pair_for(L).slug}_{mode}", target_name=tname, draft_name=f"self:{L}",
        temperature=temperature, top_p=top_p, depth=depth, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        prompts_file=str(pfile), num_prompts=len(ids), max_new_tokens=max_new_tokens, seed=seed,
        draft_cost_model="per-level", command="treeopt profile layers")
    prof.measured["weights"] = weights

    def why_none(row) -> str:
        if row.counts.trials == 0:
            return "no verification trials"
        try:
            choose(row.counts.vector(), row.curve, budget, max_depth, max_branching, context=context)
        except TreeoptError as err:
            return str(err).splitlines()[0]
        return "no choice"

    rows, data_rows, notes = [], [], []
    for r in sweep.rows:
        p = r.counts.vector() if r.counts.trials else None
        c = r.choice
        mark = "best" if r is best else ""
        rows.append([r.num_layers, float(p[0]) if p is not None else None,
                     float(p.sum()) if p is not None else None, r.c1_over_T1,
                     c.tree.size if c else None, c.tree.tree_depth if c else None, r.expected_tokens,
                     r.predicted_speedup, mark])
        if c is None:
            notes.append(f"self:{r.num_layers}: no tree chosen ({why_none(r)}); scored as plain decoding (speedup 1)")
        data_rows.append({
            "num_layers": r.num_layers, "trials": r.counts.trials, "counts": [int(x) for x in r.counts.counts],
            "acceptance": [float(x) for x in p] if p is not None else None,
            "c1_over_T1": r.c1_over_T1,
            "draft_forward_ms": {int(w): t.median_ms for w, t in zip(r.draft_tables[0].tokens,
                                                                    r.draft_tables[0].timings)},
            "tree_nodes": c.tree.size if c else None, "tree_depth": c.tree.tree_depth if c else None,
            "budget": c.budget if c else None, "max_depth": c.depth if c else None,
            "expected_tokens_per_step": r.expected_tokens, "tokens_per_s": c.tokens_per_s if c else None,
            "predicted_speedup": r.predicted_speedup, "best": r is best})
    tree_file = f"tree-self-L{L}.yaml"
    extra = "" if (dev.type == "cpu" and dt == torch.float32) else f" --device {device} --dtype {dtype}"
    sampling = "" if temperature == 0 else f" --temperature {temperature:g} --top-p {top_p:g}"
    target_arg = f" --target {tp}" if target else ""
    next_cmds = [f"treeopt solve -a {acc_out} -l {lat_out} --budget {budget} --max-depth {max_depth} "
                 f"--max-branching {max_branching} --context {context} -o {tree_file}",
                 f"treeopt run{target_arg} --draft self:{L} --tree {tree_file}{sampling}{extra}"]

    # written last: both profiles or neither (the acceptance file is put back if the latency write fails)
    previous = acc_out.read_bytes() if acc_out.is_file() else None
    save_acceptance(acc_out, prof)
    try:
        save_latency(lat_out, best.curve)
    except BaseException:
        if previous is None:
            acc_out.unlink(missing_ok=True)
        else:
            from .._io import atomic_write_bytes

            atomic_write_bytes(acc_out, previous)
        raise

    report = Report(title="treeopt profile layers")
    report.summary = {"device": best.curve.device.get("name"), "dtype": str(dt).removeprefix("torch."),
                      "threads": torch.get_num_threads(), "target": tname, "target layers": n_layers,
                      "context (tokens)": context, "mode": mode, "prompts": len(ids),
                      "T(1) (ms)": best.curve.target_ms(1, context), "step overhead (ms)": overhead,
                      "best L": L, "predicted speedup": best.predicted_speedup,
                      "acceptance profile": str(acc_out), "latency profile": str(lat_out),
                      "next": "; ".join(next_cmds)}
    report.tables.append((f"self:L sweep (budget {budget}, max depth {max_depth}, max branching {max_branching})",
                          ["L", "p_1", "sum p_k", "c(1)/T(1)", "tree nodes", "tree depth", "tokens/step",
                           "speedup", "best"], rows))
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    report.notes.extend(notes)
    report.notes.append(f"best: --draft self:{L}; next: " + " && ".join(next_cmds))
    if round(best.predicted_speedup, 9) <= 1.0:
        report.warnings.append(
            f"no L swept is predicted to beat plain decoding on this device (every L's best tree is the root alone "
            f"or slower); self:{L} was kept as the tie-break (the smallest L) and its profiles written for the record")
    report.data = {"target": tname, "n_layers": n_layers, "context": context, "mode": mode, "budget": budget,
                   "max_depth": max_depth, "max_branching": max_branching, "step_overhead_ms": overhead,
                   "target_forward_ms": {int(n): t.median_ms for n, t in zip(ttables[0].tokens, ttables[0].timings)},
                   "rows": data_rows, "best": L, "predicted_speedup": best.predicted_speedup,
                   "acceptance_profile": str(acc_out), "latency_profile": str(lat_out), "next": next_cmds}
    render(report, as_json)
