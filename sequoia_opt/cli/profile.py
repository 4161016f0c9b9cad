"""``treeopt profile latency``, ``treeopt profile acceptance`` and ``treeopt profile layers``: measure the
device (T(n), c(w), the per-step overhead), the model pair (the positional acceptance vector), and for the
self layer-skip drafter both at once over a grid of L, keeping the L with the best predicted speedup.

Two drafters (issue 16): ``treeopt profile graft`` measures a light and a strong drafter for one grafted tree
(each drafter's profiles and the pair profile, :func:`~sequoia_opt.jobs.graft.profile_graft`), and ``treeopt
profile scheduler`` trains the scheduler that decides when a grafted tree calls the strong drafter
(:func:`~sequoia_opt.profiling.graft.train_scheduler`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, CudaGraphsOpt, DeviceOpt, DraftOpt, DtypeOpt, JsonOpt, MaxBranchingOpt, MaxDepthOpt,
                     ProfileOutputOpt, PromptsOpt, SeedOpt, TargetOpt, TemperatureOpt, TopPOpt, TwoDraftsOpt,
                     WeightsOpt, _check_run_options, _check_writable, _csv_ints, _interruptible, _load_graft_tree, _print_error,
                     _two_drafters, _write_all, app, check_cuda_graphs, graphed, handle_errors, mode_slug, note,
                     progress_bar, set_torch_threads, setting_notes)
from .render import render

profile_app = typer.Typer(help="Measure the device (latency curve) and the model pair (acceptance vector); "
                          "find the best L of the self layer-skip drafter.",
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
    max_draft_tokens: Annotated[Optional[int], typer.Option(
        "--max-draft-tokens", help="Largest draft width profiled (default: 64 for a per-level drafter; "
        "--max-tokens for a one-pass drafter, which the solver charges c(n - 1)).")] = None,
    repeats: Annotated[int, typer.Option("--max-repeats", help="Most timed repeats per point and round.")] = 30,
    rounds: Annotated[int, typer.Option(
        "--rounds", help="Sweeps of the token grid; each point keeps the median of its rounds' medians.")] = 3,
    paired: Annotated[bool, typer.Option(
        "--paired/--unpaired", help="Time each n alternately with n = 1, call by call, and keep T(1) x the "
        "median ratio: the curve's shape survives a machine whose speed drifts (costs one extra 1-token "
        "forward per timed forward).")] = True,
    backend: BackendOpt = "auto",
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: torch's).")] = None,
    weights: WeightsOpt = "float32",
    output: ProfileOutputOpt = None,
    engine: Annotated[str, typer.Option(
        "--engine", help="What runs the forwards: treeopt (the bundled decoder) | llama.cpp (GGUF target and draft "
        "through llama-cpp-python, logits for all n positions) | sglang | vllm (CUDA).")] = "treeopt",
    as_json: JsonOpt = False,
    batch: Annotated[Optional[str], typer.Option(
        "--batch", help="Batch sizes, comma-separated (1,2,4,8): measure T(b, n), c(b, w) and the step overhead "
        "per batch size through the batched decoder (n tokens per sequence) and write a "
        "treeopt-latency-batch/1 profile (a draft model or none).")] = None,
    offload: Annotated[bool, typer.Option(
        "--offload", help="CUDA only: time the target with its layers streamed from pinned host memory (host->device "
        "bandwidth, per-layer copy and compute) and write T(n) of the offloaded target.")] = False,
    cuda_graphs: CudaGraphsOpt = False,
) -> None:
    """Measure T(n): one target forward over n tokens through the verification path (KV cache holding the
    context, prefix + tree mask), and the drafter's cost c(w) in its own cost model (a draft model or
    self:L: one forward over w tokens, per level; lookup: one proposal of w nodes); plus the fixed per-step
    overhead. --engine llama.cpp | sglang | vllm: the same curve on that engine."""
    from ..engines import engine_name

    if engine_name(engine) != "treeopt":
        from .engine import profile_latency_engine

        profile_latency_engine(engine, target=target, draft=draft, context=context, max_tokens=max_tokens,
                               max_draft_tokens=max_draft_tokens, repeats=repeats, rounds=rounds, paired=paired,
                               threads=threads, output=output, as_json=as_json,
                               other={"--random-weights": random_weights, "--arch": arch, "--draft-arch": draft_arch,
                                      "--device": device != "cpu", "--dtype": dtype != "float32",
                                      "--backend": backend != "auto", "--weights": weights != "float32",
                                      "--cuda-graphs": cuda_graphs})
        return
    from ..model import ModelConfig, Transformer
    from ..model.loaders import load_model_config, tune_loaded_model
    from ..model.tuned_linear import check_precision, linear_record
    from ..jobs.load import (DrafterSpec, check_drafter, drafter_slug, load_pair, parse_device, parse_drafter_spec,
                            parse_dtype)
    from ..profiles import save_latency
    from ..device import device_slug
    from ..profiling.latency import (build_latency_profile, measure_step_overhead, method_text, profile_drafter,
                                    profile_model, random_weight_model)
    from ..profiling.timing import token_grid

    check_cuda_graphs(cuda_graphs, device)
    if cuda_graphs and (batch is not None or offload):
        raise TreeoptError("--cuda-graphs times the batch-1 resident forwards: drop --batch / --offload (or it)")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev)
    check_precision(weights)
    contexts = _csv_ints(context, "--context")
    from .profile_batch import check_batch_options

    batches = check_batch_options(batch, offload, dev, draft)
    if random_weights and arch is None:
        raise TreeoptError("--random-weights needs --arch (a preset name or a config.json)")
    if random_weights and draft is not None and draft_arch is not None:
        raise TreeoptError("--draft and --draft-arch both name a drafter: pass one")
    spec: DrafterSpec | None = parse_drafter_spec(draft) if (draft is not None or not random_weights) else None
    one_pass = spec is not None and spec.cost_model == "one-pass"
    if max_draft_tokens is None:
        max_draft_tokens = max_tokens if one_pass else 64
    if max_tokens < 1 or max_draft_tokens < 1:
        raise TreeoptError("--max-tokens and --max-draft-tokens must be at least 1")
    if repeats < 1:
        raise TreeoptError(f"--max-repeats must be at least 1, got {repeats}")
    if rounds < 1:
        raise TreeoptError(f"--rounds must be at least 1, got {rounds}")
    if not random_weights and (arch or draft_arch):
        raise TreeoptError("--arch / --draft-arch describe random-weight models: add --random-weights")
    set_torch_threads(threads)

    def config_of(spec_text: str) -> ModelConfig:
        path = Path(spec_text)
        if path.suffix == ".json" or path.is_dir() or path.suffix == ".gguf":
            return load_model_config(path)  # a config .json is read itself, not its folder's config.json
        return ModelConfig.preset(spec_text)

    cost_model = spec.cost_model if spec is not None else "per-level"
    drafter: object = None
    dconfig = None
    if random_weights:
        tcfg = config_of(arch)
        dcfg = config_of(draft_arch) if draft_arch is not None else None
        if spec is not None and spec.entry.loads_model:
            raise TreeoptError("with --random-weights a draft model is given by its shape: --draft-arch "
                               "PRESET|config.json (--draft takes self:L or lookup here)")
        if spec is not None:
            check_drafter(spec, tcfg)
        tmodel = random_weight_model(tcfg, device=dev, dtype=dt)
        tune_loaded_model(tmodel, None, weights=weights, log=note)
        tname = f"{tcfg.name} (random weights)"
        dname = None
        if dcfg is not None:
            drafter = random_weight_model(dcfg, device=dev, dtype=dt, seed=1)
            tune_loaded_model(drafter, None, log=note)
            dname, dconfig = f"{dcfg.name} (random weights)", dcfg
        if cuda_graphs:  # the graphed forwards replace the eager ones everywhere below, drafters included
            tmodel, drafter = graphed(tmodel), graphed(drafter)
        if dcfg is None and spec is not None:
            from ..jobs.load import ModelPair

            pair = ModelPair(tmodel, None, None, tname, spec.label, spec)
            drafter, dname = pair.cost_probe(), spec.label
            make_drafter = pair.new_drafter
    else:
        # offload: the target's layers go to pinned host memory, so load it on the host
        pair = load_pair(target, spec, device=torch.device("cpu") if offload else dev, dtype=dt, weights=weights,
                         log=note)
        if cuda_graphs:
            import dataclasses

            pair = dataclasses.replace(pair, target=graphed(pair.target), draft=graphed(pair.draft))
        tmodel, tname, dname = pair.target, pair.target_name, pair.draft_name
        drafter = pair.draft if pair.draft is not None else (pair.cost_probe() if spec is not None else None)
        make_drafter = pair.new_drafter
        dconfig = pair.draft.config if pair.draft is not None else None
    if isinstance(drafter, torch.nn.Module):
        make_drafter = drafter  # a draft model: the decoder wraps it
    grid = token_grid(max_tokens)
    dgrid = token_grid(max_draft_tokens)
    # every size against every context before anything is timed (a late refusal would waste the target's curve)
    positions = [(tmodel.config.max_position_embeddings, max(grid), "target")]
    if isinstance(drafter, torch.nn.Module):
        positions.append((drafter.config.max_position_embeddings, max(dgrid), "draft"))
    elif drafter is not None and drafter.model is not None:
        positions.append((drafter.model.config.max_position_embeddings, max(dgrid), drafter.label))
    for limit, widest, what in positions:
        if max(contexts) + widest > limit:
            raise TreeoptError(f"--context {max(contexts)} + {widest} tokens exceeds the {what} model's context of "
                               f"{limit} tokens: lower --context, --max-tokens or --max-draft-tokens")
    if batches is not None or offload:
        from .profile_batch import profile_latency_batch_or_offload

        profile_latency_batch_or_offload(
            batches, offload, tmodel=tmodel, draft=drafter, tname=tname, dname=dname, dev=dev, dt=dt, grid=grid,
            dgrid=dgrid, contexts=contexts, rounds=rounds, paired=paired, repeats=repeats,
            random_weights=random_weights, base=tcfg.name if random_weights else tname, output=output,
            as_json=as_json)
        return
    from ..attention import record_backends

    with progress_bar() as progress:
        with record_backends() as t_att:
            ttables = profile_model(tmodel, grid, contexts, what="target", backend=backend, progress=progress,
                                    rounds=rounds, paired=paired, min_repeats=min(5, repeats), max_repeats=repeats)
        dtables = None
        with record_backends() as d_att:
            if drafter is not None:
                dtables = profile_drafter(tmodel, drafter, dgrid, contexts, backend=backend, progress=progress,
                                          rounds=rounds, paired=paired and not one_pass, min_repeats=min(5, repeats),
                                          max_repeats=repeats)
        overhead = measure_step_overhead(tmodel, make_drafter if drafter is not None else tmodel, backend=backend)
    slug = device_slug(dev)
    base = tcfg.name if random_weights else tname
    dpart = f"__{drafter_slug(dname)}" if dname is not None else ""
    gpart = "_cuda-graphs" if cuda_graphs else ""
    pid = f"{slug}_{base}{dpart}_{dt}{gpart}".replace("torch.", "")
    graphs = ({"target": tmodel.stats.as_dict(),
               "draft": drafter.stats.as_dict() if hasattr(drafter, "stats") else None} if cuda_graphs else None)
    curve = build_latency_profile(
        target_tables=ttables, draft_tables=dtables, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=tname, target_config=tmodel.config, draft_name=dname, draft_config=dconfig,
        random_weights=random_weights, profile_id=pid, method=method_text(rounds, paired, grid)
        + ("; forwards replayed from CUDA graphs" if cuda_graphs else ""),
        draft_cost_model=cost_model, linear=linear_record(tmodel),
        draft_linear=linear_record(drafter) if isinstance(drafter, Transformer) else None,
        attention={"requested": backend, "target": t_att.as_dict(),
                   "draft": d_att.as_dict() if dtables is not None else None},
        cuda_graphs=graphs)
    if output is None and not random_weights and not cuda_graphs:  # where run --compare-drafters looks by default
        from ..jobs.load import default_latency_path

        output = default_latency_path(tname, spec, slug)
    out = output or Path("profiles") / slug / f"{base}{dpart}{gpart.replace('_', '-')}-latency.yaml"
    save_latency(out, curve)
    rows = [[n, curve.target_ms(n, c), curve.target_ms(n, c) / curve.target_ms(1, c), c] for c in contexts for n in grid]
    report = Report(title="treeopt profile latency")
    report.summary = {"device": curve.device.get("name"), "dtype": str(dt).removeprefix("torch."),
                      "threads": torch.get_num_threads(), "target": tname, "draft": dname,
                      "draft cost model": cost_model if dtables is not None else None,
                      "c(1) / T(1)": (curve.draft_ms(1, contexts[0]) / curve.target_ms(1, contexts[0])
                                      if dtables is not None else None),
                      "step overhead (ms)": overhead, "written": str(out)}
    report.tables.append(("target forward", ["tokens", "ms", "T(n)/T(1)", "context"], rows))
    if dtables is not None:
        unit = "nodes proposed" if one_pass else "tokens"
        report.tables.append((f"draft cost c(w) ({cost_model})", [unit, "ms", "context"],
                              [[w, curve.draft_ms(w, c), c] for c in contexts for w in dgrid]))
    if random_weights:
        report.notes.append("timed with RANDOM weights of the model's shape: latency does not depend on weight values")
    if dtables is None:
        report.warnings.append("no draft profiled: draft cost recorded as 0 ms (pass --draft / --draft-arch)")
    report.data = {"profile": curve.to_dict(), "output": str(out)}
    render(report, as_json)


@profile_app.command("linear")
@handle_errors
@_interruptible
def profile_linear_cmd(
    target: TargetOpt = None,
    weights: WeightsOpt = "float32",
    threads: Annotated[Optional[int], typer.Option("--threads", help="torch CPU threads (default: torch's).")] = None,
    retune: Annotated[bool, typer.Option("--retune", help="Time every shape again (the cached plan is replaced), "
                                         "e.g. after a tuning on a busy machine.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Tune (or show) the CPU linear kernels of the target on this machine: per weight shape and row-count
    bucket, the median ms of each candidate kernel and the one kept. Every CPU float32 load reads this plan
    (cached per device, torch version, threads and precision)."""
    from ..model.loaders import load_checkpoint, tune_loaded_model
    from ..model.tuned_linear import ROW_BUCKETS, check_precision
    from ..jobs.load import default_target_path, model_label

    check_precision(weights)
    set_torch_threads(threads)
    tp = Path(target) if target else default_target_path()
    model, _ = load_checkpoint(tp, device="cpu", dtype=torch.float32)
    rep = tune_loaded_model(model, tp, weights=weights, log=note, use_cache=not retune)
    report = Report(title=f"CPU linear kernels of {model_label(tp)} on this machine ({weights})")
    report.summary = {"threads": torch.get_num_threads(), "plan": rep.cache,
                      "shapes timed now": len(rep.tuned_shapes), "seconds": round(rep.seconds, 1),
                      "extra weight copies (MiB)": round(rep.extra_bytes / 2**20, 1)}
    rows = []
    for shape, picks in rep.choices.items():
        times = rep.timings_ms.get(shape, {})
        for b in ROW_BUCKETS:
            t = times.get(str(b), {})
            rows.append([shape, b, picks[str(b)], ", ".join(f"{k} {v:.3f}" for k, v in sorted(t.items(), key=lambda kv: kv[1]))
                         or ("(one candidate)" if shape in rep.timings_ms or not rep.choices else "(not recorded: --retune)"),
                         (t["linear"] / t[picks[str(b)]]) if "linear" in t else None])
    report.tables.append(("kernel per weight shape (out x in) and row bucket (rows = tokens x batch; a bucket "
                          "serves counts up to it)", ["shape", "rows", "kept", "candidates (median ms)",
                                                      "F.linear / kept"], rows))
    report.data = {"precision": rep.precision, "choices": rep.choices, "timings_ms": rep.timings_ms,
                   "cache": rep.cache, "tuned_shapes": rep.tuned_shapes}
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
    calibration: Annotated[bool, typer.Option(
        "--calibration", help="Measure the calibration profile instead (treeopt-calibration/1, for solve --dynamic): "
        "per step a wide EAGLE-2 tree is drafted and every node verified; the reliability table gives acceptance "
        "against draft probability with counts, 95 % intervals and the ECE.")] = False,
    calibration_steps: Annotated[int, typer.Option(
        "--calibration-steps", help="With --calibration: levels of the recorded tree (the deepest dynamic setting "
        "solve --dynamic can predict).")] = 5,
    calibration_topk: Annotated[int, typer.Option(
        "--calibration-topk", help="With --calibration: children per expanded node and frontier width of the "
        "recorded tree (1 + k + (steps - 1) k^2 nodes verified per step).")] = 4,
    as_json: JsonOpt = False,
) -> None:
    """Measure the positional acceptance vector p_1..p_K with the decoder's own verifier (greedy or
    sampling), with counts, 95 % intervals and per-depth vectors; with --calibration, the calibration profile
    of draft probability against acceptance that dynamic trees are predicted from."""
    from ..jobs.load import default_acceptance_path, load_pair, parse_device, parse_dtype
    from ..profiles import save_acceptance
    from ..profiling.acceptance import build_acceptance_profile, measure_acceptance, positional_check
    from ..device import device_name
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    if width < 1 or depth < 1:
        raise TreeoptError("--width and --depth must be at least 1")
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    from ..jobs.load import parse_drafter_spec

    spec = parse_drafter_spec(draft)  # a bad --draft fails here, before prompts or models are read
    if calibration:
        if calibration_steps < 1 or calibration_topk < 1:
            raise TreeoptError("--calibration-steps and --calibration-topk must be at least 1")
        if spec is not None and not spec.entry.has_probs:
            raise TreeoptError(f"{spec.label} has no draft probabilities to calibrate; use a drafter that has them "
                               "(a draft model, self:L)")
        if (width, depth) != (8, 4):
            raise TreeoptError("--width / --depth shape the positional measurement; the calibration's recording tree "
                               "is --calibration-topk / --calibration-steps")
        from ..profiling.calibration import recording_setting

        try:
            recording_setting(calibration_steps, calibration_topk)  # its size, before any model loads
        except ValueError as err:
            raise TreeoptError(str(err)) from None
    elif (calibration_steps, calibration_topk) != (5, 4):
        raise TreeoptError("--calibration-steps / --calibration-topk shape the calibration recording: add "
                           "--calibration (or drop them)")
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    pair = load_pair(target, spec, device=dev, dtype=dt)
    if calibration:
        _profile_calibration(pair, spec, texts, pfile, steps=calibration_steps, topk=calibration_topk,
                             temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                             num_prompts=num_prompts, dev=dev, dt=dt, backend=backend, output=output, as_json=as_json)
        return
    if width > pair.vocab_size:
        raise TreeoptError(f"--width {width} asks for more candidates per node than the "
                           f"{'draft' if pair.draft is not None else 'target'}'s vocabulary has "
                           f"tokens ({pair.vocab_size})")
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    with progress_bar() as progress:
        counts = measure_acceptance(pair.target, pair.new_drafter, ids, width=width, depth=depth,
                                    temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                    eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    pair_slug = pair.slug
    prof = build_acceptance_profile(
        counts, profile_id=f"{pair_slug}_{mode}", target_name=pair.target_name, draft_name=pair.draft_name,
        temperature=temperature, top_p=top_p, depth=depth, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        prompts_file=str(pfile), num_prompts=len(ids), max_new_tokens=max_new_tokens, seed=seed,
        draft_cost_model=pair.cost_model)
    out = output or default_acceptance_path(pair.target_name, spec, mode)  # where run --compare-drafters looks
    save_acceptance(out, prof)
    ci = prof.confidence_interval()
    report = Report(title="treeopt profile acceptance")
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "draft cost model": pair.cost_model,
                      "mode": mode, "trials": counts.trials,
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


def _profile_calibration(pair, spec, texts, pfile, *, steps, topk, temperature, top_p, seed, max_new_tokens,
                         num_prompts, dev, dt, backend, output, as_json) -> None:
    """``profile acceptance --calibration``: record, build, write and show the calibration profile."""
    from ..profiles.calibration import save_calibration
    from ..jobs.load import default_acceptance_path
    from ..profiling.calibration import build_calibration_profile, measure_calibration
    from ..device import device_name
    from ..prompts import encode_prompts

    if topk > pair.vocab_size:
        raise TreeoptError(f"--calibration-topk {topk} is more than the vocabulary's {pair.vocab_size} tokens")
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    with progress_bar() as progress:
        steps_rec = measure_calibration(pair.target, pair.new_drafter, ids, steps=steps, topk=topk,
                                        temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                        eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    if not steps_rec:
        raise TreeoptError("no step drafted (every prompt is at the end of the context): nothing to calibrate")
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    prof = build_calibration_profile(
        steps_rec, profile_id=f"{pair.slug}_calibration_{mode}", target_name=pair.target_name,
        draft_name=pair.draft_name, temperature=temperature, top_p=top_p, recording_steps=steps, recording_topk=topk,
        device=device_name(dev), dtype=str(dt).removeprefix("torch."), prompts_file=str(pfile), num_prompts=len(ids),
        max_new_tokens=max_new_tokens, seed=seed)
    out = output or default_acceptance_path(pair.target_name, spec, mode).with_name(f"calibration-{mode}.yaml")
    save_calibration(out, prof)
    report = Report(title="treeopt profile acceptance --calibration")
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    bins = prof.bins()
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "mode": mode,
                      "recorded steps": len(prof.steps), "candidates": sum(b["count"] for b in bins),
                      "recording tree": f"{steps} levels, top-{topk}", "ECE": prof.ece(), "written": str(out)}
    report.tables.append(("reliability: acceptance against draft probability",
                          ["draft prob", "count", "reached", "mean draft prob", "acceptance", "95% low", "95% high"],
                          [[f"{b['low']:g}-{b['high']:g}", b["count"], b["reached"], b.get("mean_draft_prob"),
                            b.get("acceptance"), b.get("ci_low"), b.get("ci_high")] for b in bins]))
    report.tables.append(("by rank", ["rank", "count", "reached", "mean draft prob", "acceptance"],
                          [[r["rank"], r["count"], r["reached"], r.get("mean_draft_prob"), r.get("acceptance")]
                           for r in prof.by_rank()]))
    report.notes.append("reached: candidates weighted by the probability that their parent is reached (greedy: "
                        "children of the target's own path); acceptance is P(accepted | parent reached)")
    report.data = {k: v for k, v in prof.to_dict().items() if k != "steps"} | {"output": str(out)}
    render(report, as_json)


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
@_interruptible
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
        "and <dir>/<device>/<target>__self-L<L>-latency.yaml.")] = Path("profiles"),
    as_json: JsonOpt = False,
) -> None:
    """Find the best L for the self layer-skip drafter (--draft self:L) on this device: per L, measure the
    acceptance vector and the draft cost c(w), let the hardware-aware solver pick a tree, and keep the L with
    the highest predicted speedup. The target's T(n) is timed once. Writes the best L's acceptance and
    latency profiles."""
    from ..drafting.drafters import LayerSkipDrafter
    from ..errors import SolverError
    from ..model.loaders import load_model_config
    from ..jobs.load import ModelPair, default_target_path, load_pair, parse_device, parse_drafter_spec, parse_dtype
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
        return ModelPair(tmodel, None, pair.tokenizer, tname, f"self:{L}", parse_drafter_spec(f"self:{L}"))

    def outputs(L: int) -> tuple[Path, Path]:
        return (output_dir / pair_for(L).slug / f"acceptance-{mode}.yaml",
                output_dir / slug / f"{tname}__self-L{L}-latency.yaml")

    for L in grid:  # a path that cannot be written fails now, not after the sweep
        for path in outputs(L):
            _check_writable(path)
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


# ---------------------------------------------------------------------------------------------- two drafters
def _graft_outputs(out_dir: Path | None, tlabel: str, light, strong, device_slug: str, mode: str) -> dict[str, Path]:
    """The five files ``profile graft`` writes: the default paths the other commands read (each drafter's
    latency and own acceptance profile, the pair profile), or the same layout under ``out_dir``."""
    from ..jobs.load import default_acceptance_path, default_latency_path, default_pair_acceptance_path

    paths = {"light_latency": default_latency_path(tlabel, light, device_slug),
             "strong_latency": default_latency_path(tlabel, strong, device_slug),
             "light_acceptance": default_acceptance_path(tlabel, light, mode),
             "strong_acceptance": default_acceptance_path(tlabel, strong, mode),
             "pair_acceptance": default_pair_acceptance_path(tlabel, light, strong, mode)}
    if out_dir is not None:
        paths = {k: out_dir / p.relative_to("profiles") for k, p in paths.items()}
    return paths


def _conditional_table(pair) -> tuple[str, list[str], list[list]]:
    """The pair profile's outcome probabilities per depth row (as the solver reads them: sparse deep depths
    pooled into the last row, shown as ``d+``)."""
    counts = pair.depth_counts()
    deepest = max(pair.counts_by_depth)
    rows = []
    for r, row in enumerate(counts):
        n = int(row.sum())
        label = str(r + 1) if r < len(counts) - 1 or deepest == r + 1 else f"{r + 1}+"
        rows.append([label, n, *[float(c) / n if n else None for c in row]])
    return (f"pair profile: acceptance per depth, {pair.light_width} light candidates then {pair.strong_width} strong "
            "ones next to them (the strong's conditional vector)", ["depth", "trials", *pair.outcome_labels()], rows)


@profile_app.command("graft")
@handle_errors
@_interruptible
def profile_graft_cmd(
    target: TargetOpt = None,
    draft: TwoDraftsOpt = None,
    prompts: PromptsOpt = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Profile prompts used (the first N).")] = 8,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt, in each "
                                                "acceptance measurement.")] = 64,
    width: Annotated[int, typer.Option("--width", "-k", help="K: candidates per node of each drafter's own "
                                       "acceptance vector.")] = 4,
    light_width: Annotated[int, typer.Option("--light-width", "-A", help="A: the light drafter's candidates per "
                                             "spine node of the pair measurement.")] = 1,
    strong_width: Annotated[int, typer.Option("--strong-width", "-B", help="B: the strong drafter's candidates "
                                              "grafted next to them (its conditional vector's length).")] = 3,
    depth: Annotated[int, typer.Option("--depth", help="D: depth of the measurement spines (the pair's and each "
                                       "drafter's own).")] = 6,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Largest target token count n and draft width w "
                                            "timed (the largest tree solve can consider).")] = 32,
    context: Annotated[int, typer.Option("--context", help="Context length (tokens) the latency is timed at.")] = 256,
    repeats: Annotated[int, typer.Option("--max-repeats", help="Most timed repeats per point and round.")] = 5,
    rounds: Annotated[int, typer.Option(
        "--rounds", help="Sweeps of the token grid; each point keeps the median of its rounds' medians.")] = 3,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    out_dir: Annotated[Optional[Path], typer.Option(
        "--out-dir", help="Write the five profiles under this folder, in the layout of profiles/ (default: "
        "profiles/, where solve and run --compare-drafters look).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Profile a light and a strong drafter for grafting (one tree grown by both): the target's T(n) once,
    each drafter's c(w) and own acceptance vector, and the pair profile (the strong drafter's acceptance next
    to the light's candidates). Writes five profiles, all or none, after every measurement succeeded."""
    from ..jobs.graft import GraftProfileSettings, profile_graft
    from ..model.loaders import load_model_config
    from ..jobs.load import default_draft_path, default_target_path, load_drafters, model_label, parse_device, parse_dtype
    from ..profiles import save_acceptance, save_latency, save_pair_acceptance
    from ..device import device_slug
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    light, strong = _two_drafters(draft, "profile graft")
    for name, value in (("--num-prompts", num_prompts), ("--max-new-tokens", max_new_tokens), ("--width", width),
                        ("--light-width", light_width), ("--strong-width", strong_width), ("--depth", depth),
                        ("--max-tokens", max_tokens), ("--max-repeats", repeats), ("--rounds", rounds)):
        if value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    if context < 0:
        raise TreeoptError(f"--context must be a number of tokens >= 0, got {context}")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    tp = Path(target) if target else default_target_path()
    tcfg = load_model_config(tp)
    if max(width, light_width + strong_width) > tcfg.vocab_size:
        raise TreeoptError(f"--width {width} / -A {light_width} + -B {strong_width} ask for more candidates per node "
                           f"than the vocabulary has tokens ({tcfg.vocab_size})")
    limits = [(tcfg.max_position_embeddings, "target")]
    for spec in (light, strong):
        if spec.entry.loads_model:
            dcfg = load_model_config(spec.path if spec.path is not None else default_draft_path())
            limits.append((dcfg.max_position_embeddings, f"{spec.label} draft"))
    for limit, what in limits:
        if context + max_tokens > limit:
            raise TreeoptError(f"--context {context} + {max_tokens} tokens exceeds the {what} model's context of "
                               f"{limit} tokens: lower --context or --max-tokens")
    mode = mode_slug(temperature, top_p)
    slug = device_slug(dev)
    tlabel = model_label(tp)
    files = _graft_outputs(out_dir, tlabel, light, strong, slug, mode)
    for path in files.values():  # a path that cannot be written fails now, not after the measurements
        _check_writable(path)
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    settings = GraftProfileSettings(max_tokens=max_tokens, context=context, latency_rounds=rounds,
                                    latency_repeats=repeats, width=width, depth=depth, light_width=light_width,
                                    strong_width=strong_width, pair_depth=depth, prompts=len(texts),
                                    new_tokens=max_new_tokens)
    lpair, spair = load_drafters(tp, [light, strong], device=dev, dtype=dt)
    ids = encode_prompts(texts, lpair.tokenizer, model=lpair.target_name)
    with progress_bar() as progress:
        prof = profile_graft(lpair.target, lpair, spair, ids, settings=settings, temperature=temperature, top_p=top_p,
                             seed=seed, eos_ids=sorted(lpair.tokenizer.eos_ids), backend=backend, device_label=slug,
                             prompts_file=str(pfile), progress=progress)
    for acc in (prof.light_acceptance, prof.strong_acceptance):
        if acc.num_samples == 0:
            raise TreeoptError(f"{acc.measured.get('draft')} recorded no verification trials (every generation "
                               "stopped before a step drafted); raise --max-new-tokens or use longer prompts. "
                               "Nothing was written")
    # written last, all five or none (a failed write puts back the files already written)
    _write_all([(files["light_latency"], lambda p: save_latency(p, prof.light_curve)),
                (files["strong_latency"], lambda p: save_latency(p, prof.strong_curve)),
                (files["light_acceptance"], lambda p: save_acceptance(p, prof.light_acceptance)),
                (files["strong_acceptance"], lambda p: save_acceptance(p, prof.strong_acceptance)),
                (files["pair_acceptance"], lambda p: save_pair_acceptance(p, prof.pair))])

    pair = prof.pair
    drafters = []
    for role, spec, curve, acc in (("light", light, prof.light_curve, prof.light_acceptance),
                                   ("strong", strong, prof.strong_curve, prof.strong_acceptance)):
        drafters.append({"role": role, "drafter": spec.label, "cost_model": spec.cost_model,
                         "c1_over_T1": curve.draft_ms(1, context) / curve.target_ms(1, context),
                         "trials": int(acc.num_samples), "p_1": float(acc.acceptance[0]),
                         "sum_p": float(acc.acceptance.sum())})
    extra = "" if (dev.type == "cpu" and dt == torch.float32) else f" --device {device} --dtype {dtype}"
    sampling = "" if temperature == 0 else f" --temperature {temperature:g} --top-p {top_p:g}"
    target_arg = f" --target {tp}" if target else ""
    next_cmds = [f"treeopt solve --pair-acceptance {files['pair_acceptance']} -a {files['light_acceptance']} -a "
                 f"{files['strong_acceptance']} -l {files['light_latency']} -l {files['strong_latency']} "
                 "-o graft-tree.yaml",
                 f"treeopt profile scheduler{target_arg} --tree graft-tree.yaml --draft {light.spec} --draft "
                 f"{strong.spec} -l {files['light_latency']}{sampling}{extra}",
                 f"treeopt run{target_arg} --draft {light.spec} --draft {strong.spec} --tree graft-tree.yaml "
                 f"[--scheduler FILE]{sampling}{extra}"]
    report = Report(title="treeopt profile graft")
    report.summary = {"device": prof.light_curve.device.get("name"), "dtype": str(dt).removeprefix("torch."),
                      "threads": torch.get_num_threads(), "target": tlabel, "light drafter": light.label,
                      "strong drafter": strong.label, "mode": mode, "prompts": len(ids),
                      "context (tokens)": context, "T(1) (ms)": prof.light_curve.target_ms(1, context),
                      "pair trials": int(sum(pair.trials_by_depth.values())),
                      "pair tokens / step (measurement tree)": pair.measured.get("tokens_per_step")}
    report.tables.append(("each drafter alone (its own acceptance vector and draft cost)",
                          ["role", "drafter", "cost model", "c(1)/T(1)", "trials", "p_1", "sum p_k"],
                          [[d["role"], d["drafter"], d["cost_model"], d["c1_over_T1"], d["trials"], d["p_1"],
                            d["sum_p"]] for d in drafters]))
    title, cols, rows = _conditional_table(pair)
    report.tables.append((title, cols, rows))
    report.tables.append(("written", ["profile", "file"], [[k.replace("_", " "), str(v)] for k, v in files.items()]))
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    report.notes.append("next: " + " && ".join(next_cmds))
    report.data = {"target": tlabel, "light": light.label, "strong": strong.label, "mode": mode,
                   "settings": {"max_tokens": max_tokens, "context": context, "width": width, "depth": depth,
                                "light_width": light_width, "strong_width": strong_width, "prompts": len(ids),
                                "max_new_tokens": max_new_tokens, "rounds": rounds, "max_repeats": repeats},
                   "drafters": drafters, "pair_profile": pair.to_dict(),
                   "conditional": [dict(zip(cols, r)) for r in rows],
                   "files": {k: str(v) for k, v in files.items()}, "next": next_cmds}
    render(report, as_json)


@profile_app.command("scheduler")
@handle_errors
@_interruptible
def profile_scheduler(
    tree: Annotated[Path, typer.Option("--tree", help="The grafted tree (treeopt-tree/2 naming the two drafters, "
                                       "light first; treeopt solve --pair-acceptance writes it).")],
    latency: Annotated[Path, typer.Option(
        "--latency", "-l", help="The light drafter's latency profile (the target's T(n), the per-step overhead): "
        "prices each call of the strong drafter in the light-only tree's tokens.")],
    target: TargetOpt = None,
    draft: TwoDraftsOpt = None,
    prompts: PromptsOpt = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Profile prompts decoded (the first N); the "
                                             "card scores held-out prompts among them.")] = 16,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt.")] = 64,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    seed: SeedOpt = 0,
    context: Annotated[Optional[int], typer.Option(
        "--context", help="Context length (tokens) to read T(n) at; default: the smallest measured.")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write the scheduler here (atomically); default: scheduler-<mode>.yaml in the pair "
        "profile's folder under profiles/.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Train the graft scheduler (when to call the strong drafter) for a grafted tree: decode the profile
    prompts with the strong drafter called at every step, price each call (extra accepted tokens against its
    cost in the light-only tree's tokens), fit a logistic model on cheap features of the light drafter's part,
    and save it with its card. Exit 1 without writing when it cannot be trained (the strong drafter pays at
    every step or at none: run the tree without --scheduler, or with the light drafter alone)."""
    from ..drafting.policies import FEATURE_NAMES, save_scheduler
    from ..errors import ProfileError
    from ..jobs.graft import scheduled_prediction
    from ..jobs.load import default_pair_acceptance_path, default_target_path, load_drafters, model_label, \
        parse_device, parse_dtype
    from ..profiles import load_latency
    from ..profiling.graft import collect_scheduler_samples, require_sklearn, train_scheduler
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    require_sklearn()  # before minutes of sampling
    light, strong = _two_drafters(draft, "profile scheduler")
    for name, value in (("--num-prompts", num_prompts), ("--max-new-tokens", max_new_tokens)):
        if value < 1:
            raise TreeoptError(f"{name} must be at least 1, got {value}")
    dtree, meta = _load_graft_tree(tree, light, strong)
    if 1 not in dtree.drafter[1:]:
        raise TreeoptError(f"tree {tree} has no strong node (its plan is the light drafter's alone): there is no call "
                           "of the strong drafter to schedule")
    curve = load_latency(latency)
    timed = curve.model.get("draft")
    if timed is not None and str(timed).strip().lower() != light.label.lower():
        raise ProfileError(f"latency profile {curve.id!r} timed drafter {timed!r}, not the light drafter "
                           f"{light.label!r}: pass the light drafter's latency profile")
    if context is not None and context < 0:
        raise TreeoptError(f"--context must be a number of tokens >= 0, got {context}")
    if dtree.size > curve.max_target_tokens(context):
        raise ProfileError(f"tree {tree} has {dtree.size} nodes but latency profile {curve.id!r} was measured up to "
                           f"{curve.max_target_tokens(context)} target tokens: profile more tokens (--max-tokens)")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    tp = Path(target) if target else default_target_path()
    tlabel = model_label(tp)
    mode = mode_slug(temperature, top_p)
    out = output or default_pair_acceptance_path(tlabel, light, strong, mode).parent / f"scheduler-{mode}.yaml"
    _check_writable(out)
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    lpair, spair = load_drafters(tp, [light, strong], device=dev, dtype=dt)
    ids = encode_prompts(texts, lpair.tokenizer, model=lpair.target_name)
    with progress_bar() as progress:
        samples = collect_scheduler_samples(lpair.target, lpair.new_drafter, spair.new_drafter, dtree.tree,
                                            dtree.drafter, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                            top_p=top_p, seed=seed, eos_ids=sorted(lpair.tokenizer.eos_ids),
                                            backend=backend, progress=progress)
    try:
        sched = train_scheduler(samples, curve, pair={"target": tlabel, "light": light.label, "strong": strong.label},
                                context=context, seed=seed,
                                extra_card={"mode": mode, "prompts_file": str(pfile), "max_new_tokens": max_new_tokens,
                                            "tree": str(tree), "command": "treeopt profile scheduler"})
    except ProfileError as err:  # one class (or too few steps): a learned scheduler would say nothing
        _print_error(f"{err} (no scheduler was written)")
        raise typer.Exit(1) from None
    predicted = None
    g_light = meta.extra.get("light_part_expected_tokens_per_step")
    if meta.expected_tokens_per_step is not None and g_light is not None:
        g, rate = scheduled_prediction(meta.expected_tokens_per_step, float(g_light), samples, sched)
        predicted = {"tokens_per_step": g, "call_rate": rate, "static_tokens_per_step": meta.expected_tokens_per_step,
                     "tree_choices": dtree.tree.choices(), "tree_drafter": list(dtree.drafter)}
        sched.card["predicted"] = predicted
    save_scheduler(out, sched)

    card = sched.card
    report = Report(title="treeopt profile scheduler")
    report.summary = {"target": tlabel, "light drafter": light.label, "strong drafter": strong.label, "mode": mode,
                      "tree": f"{tree} ({dtree.size} nodes)", "steps sampled": card.get("samples"),
                      "prompts": card.get("prompts"), "held-out prompts": len(card.get("held_out_prompts", [])),
                      "r (light-only tokens / ms)": card.get("r_tokens_per_ms"),
                      "predicted tokens / step (scheduled)": predicted["tokens_per_step"] if predicted else None,
                      "predicted call rate": predicted["call_rate"] if predicted else None,
                      "written": str(out)}
    keys = ["steps", "call_rate", "oracle_call_rate", "accuracy", "value_kept", "value_always", "mean_value_tokens"]
    report.tables.append(("card: its decisions against the offline oracle (value kept: 1 = the oracle, 0 = never "
                          "calling)", ["set", *keys],
                          [[which, *[card.get(k, {}).get(x) for x in keys]] for which, k in
                           (("training", "train"), ("held out", "held_out"))]))
    report.tables.append(("logistic model: call the strong drafter when sigmoid(bias + w . features) >= threshold",
                          ["feature", "weight"], [[f, w] for f, w in zip(FEATURE_NAMES, sched.weights)]
                          + [["bias", sched.bias], ["threshold", sched.threshold]]))
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    report.notes.append(f"next: treeopt run --draft {light.spec} --draft {strong.spec} --tree {tree} --scheduler {out}")
    report.data = {"scheduler": sched.to_dict(), "output": str(out), "samples": len(samples)}
    render(report, as_json)
