"""``treeopt profile latency`` (what this device does: T(n) at each context length through the real verification
path, the drafter's c(w) in its own cost model, the per-step overhead; also T(b, n) with ``--batch`` and the
offload mode) and ``treeopt profile linear`` (the tuned CPU linears' plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, CudaGraphsOpt, DeviceOpt, DraftOpt, DtypeOpt, JsonOpt, ProfileOutputOpt, TargetOpt,
                     WeightsOpt, _check_run_options, _check_writable, check_output, _csv_ints, check_cuda_graphs,
                     graphed, handle_errors, note, profile_app, progress_bar, set_torch_threads)
from .render import render

#: ``--context`` when none is given (tokens); a model whose context is shorter is timed at the most it fits.
DEFAULT_CONTEXT = 256


@profile_app.command("latency")
@handle_errors
def profile_latency(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="Time a random-weight model of --arch's shape (latency does not depend on weight values).")] = False,
    arch: Annotated[Optional[str], typer.Option("--arch", help="Preset name (llama-2-7b, llama-3-8b, ...) or a config.json path, with --random-weights.")] = None,
    draft_arch: Annotated[Optional[str], typer.Option("--draft-arch", help="Draft preset or config.json, with --random-weights.")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    context: Annotated[Optional[str], typer.Option("--context", help="Context lengths (tokens), comma-separated "
                                                    f"(default {DEFAULT_CONTEXT}, or the most a short-context model "
                                                    "fits).")] = None,
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
    loop: Annotated[bool, typer.Option(
        "--loop/--no-loop", help="Also time the decoding loop's own steps at every tree size (the drafter's static "
        "tree through the runner: verify with the logits to acceptance, bookkeeping, the draft beyond c(w)), so the "
        "solver charges a step as the runner runs it.")] = True,
) -> None:
    """Measure T(n): one target forward over n tokens through the verification path (KV cache holding the
    context, prefix + tree mask), and the drafter's cost c(w) in its own cost model (a draft model or
    self:L: one forward over w tokens, per level; lookup: one proposal of w nodes); plus the fixed per-step
    overhead, and the decoding loop's own step per tree size (--loop). --engine llama.cpp | sglang | vllm: the same
    curve on that engine."""
    from ..engines import engine_name

    context_given = context is not None
    context = str(DEFAULT_CONTEXT) if context is None else context
    if engine_name(engine) != "treeopt":
        from .engine import profile_latency_engine

        profile_latency_engine(engine, target=target, draft=draft, context=context, max_tokens=max_tokens,
                               max_draft_tokens=max_draft_tokens, repeats=repeats, rounds=rounds, paired=paired,
                               threads=threads, output=output, as_json=as_json, loop=loop,
                               other={"--random-weights": random_weights, "--arch": arch, "--draft-arch": draft_arch,
                                      "--device": device != "cpu", "--dtype": dtype != "float32",
                                      "--backend": backend != "auto", "--weights": weights != "float32",
                                      "--cuda-graphs": cuda_graphs, "--batch": batch is not None,
                                      "--offload": offload})
        return
    from ..model import ModelConfig, Transformer
    from ..model.loaders import load_model_config, tune_loaded_model
    from ..model.tuned_linear import check_precision, linear_record
    from ..jobs.load import (DrafterSpec, check_drafter, default_latency_path, drafter_slug, load_pair, parse_device,
                            parse_drafter_spec, parse_dtype, precision_suffix)
    from ..profiles import save_latency
    from ..device import device_slug
    from ..profiling.latency import (build_latency_profile, measure_step_overhead, method_text, noisy_points,
                                    profile_drafter, profile_model, random_weight_model)
    from ..profiling.timing import token_grid

    check_cuda_graphs(cuda_graphs, device)
    if cuda_graphs and (batch is not None or offload):
        raise TreeoptError("--cuda-graphs times the batch-1 resident forwards: drop --batch / --offload (or it)")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev)
    check_output(output, {"--target": target, "--draft": draft, "--arch": arch,  # before the minutes of timing
                          "--draft-arch": draft_arch})
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
            # a config .json is read itself, not its folder's config.json; a shape only (random weights): a
            # quantized checkpoint's config gives its architecture (--weights int4 times its int4 linears)
            return load_model_config(path, shape_only=True)
        return ModelConfig.preset(spec_text)

    cost_model = spec.cost_model if spec is not None else "per-level"
    drafter: object = None
    dconfig = None
    draft_arch_name = None  # a random-weight draft's preset (or config) name: its part of the file name
    if random_weights:
        tcfg = config_of(arch)
        dcfg = config_of(draft_arch) if draft_arch is not None else None
        if spec is not None and spec.entry.loads_model:
            raise TreeoptError("with --random-weights a draft model is given by its shape: --draft-arch "
                               "PRESET|config.json (--draft takes self:L or lookup here)")
        if spec is not None:
            check_drafter(spec, tcfg)
        if dcfg is not None and dcfg.vocab_size != tcfg.vocab_size:  # before a minute of kernel tuning
            raise TreeoptError(f"--draft-arch {draft_arch} has a vocabulary of {dcfg.vocab_size} tokens but --arch "
                               f"{arch} has {tcfg.vocab_size}: a draft proposes the target's tokens; give a draft "
                               "shape of the target's vocabulary")
        tmodel = random_weight_model(tcfg, device=dev, dtype=dt)
        tune_loaded_model(tmodel, None, weights=weights, log=note)
        tname = f"{tcfg.name} (random weights)"
        dname = None
        if dcfg is not None:
            drafter = random_weight_model(dcfg, device=dev, dtype=dt, seed=1)
            tune_loaded_model(drafter, None, log=note)
            dname, dconfig, draft_arch_name = f"{dcfg.name} (random weights)", dcfg, dcfg.name
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
        # a draft model is timed itself; any other drafter (a feature head, self:L, lookup) by its cost probe
        model = pair.draft if isinstance(pair.draft, Transformer) else None
        drafter = model if model is not None else (pair.cost_probe() if spec is not None else None)
        make_drafter = pair.new_drafter
        dconfig = model.config if model is not None else None
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
    if not context_given:  # the default, not the user's: the most every model (and the timed loop) fits
        from ..profiling.steps import loop_positions

        fit = min(limit - widest for limit, widest, _ in positions)
        if loop and drafter is not None and not offload:
            fit = min(fit, positions[0][0] - loop_positions(0, max(grid)))
        if fit < 1:
            limit, widest, what = min(positions, key=lambda x: x[0] - x[1])
            raise TreeoptError(f"the {what} model's context of {limit} tokens leaves no context to time trees of up "
                               f"to {widest} tokens at: lower --max-tokens / --max-draft-tokens")
        if fit < contexts[0]:
            note(f"--context {fit}: the default {DEFAULT_CONTEXT} does not fit the context of the models (and the "
                 f"timed loop) with the sizes timed, up to {max(grid)} target and {max(dgrid)} draft tokens (pass "
                 "--context to choose)")
            contexts = [fit]
    for limit, widest, what in positions:
        if max(contexts) + widest > limit:
            raise TreeoptError(f"--context {max(contexts)} + {widest} tokens exceeds the {what} model's context of "
                               f"{limit} tokens: lower --context, --max-tokens or --max-draft-tokens")
    if loop and drafter is not None and not offload:  # the loop would decode past the context: refused now
        from ..profiling.steps import check_loop_fits

        check_loop_fits(max(contexts), max(grid), positions[0][0], model="the target model",
                        fixes="--max-tokens (or add --no-loop)")
    if batches is not None or offload:
        from .profile_batch import profile_latency_batch_or_offload

        profile_latency_batch_or_offload(
            batches, offload, tmodel=tmodel, draft=drafter, tname=tname, dname=dname, dev=dev, dt=dt, grid=grid,
            dgrid=dgrid, contexts=contexts, rounds=rounds, paired=paired, repeats=repeats,
            random_weights=random_weights, base=tcfg.name if random_weights else tname, output=output,
            as_json=as_json, loop=loop, weights=weights)
        return
    from ..attention import record_backends

    slug = device_slug(dev)
    base = tcfg.name if random_weights else tname
    # a random-weight shape's file is named by its presets, the target's and the draft's alike (no "(random
    # weights)": a path of spaces and parentheses that an unquoted -l broke on)
    dbase = draft_arch_name if random_weights and draft_arch_name is not None else dname
    dpart = f"__{drafter_slug(dbase)}" if dbase is not None else ""
    gpart = "_cuda-graphs" if cuda_graphs else ""
    # another precision is another curve: its own id and default file (it replaced the float32 one, same id)
    ppart = precision_suffix(dt, weights)
    if output is None and not random_weights and not cuda_graphs:  # where run --compare-drafters looks
        output = default_latency_path(tname, spec, slug, ppart)
    out = output or Path("profiles") / slug / f"{base}{dpart}{gpart.replace('_', '-')}{ppart}-latency.yaml"
    _check_writable(out)  # the default path too, before the minutes of timing
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
        loops = None
        if loop and drafter is not None:  # the runner's own step per tree size (issue 31)
            from ..profiling.steps import static_loop_decoders, time_loop

            make_dec = static_loop_decoders(tmodel, make_drafter, backend=backend, max_len=max(contexts) + 2 * max(grid)
                                            + 16)
            loops = [time_loop(make_dec, grid, c, tmodel.config.vocab_size, rounds=min(rounds, 2), progress=progress)
                     for c in contexts]
    pid = f"{slug}_{base}{dpart}_{dt}{gpart}".replace("torch.", "")
    if str(weights) != "float32":  # the dtype is in the id already; int8 / int4 weights are not
        pid += f"_{weights}"
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
        cuda_graphs=graphs, loop_tables=loops)
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
    if curve.has_loop(contexts[0]):
        report.tables.append(("the decoding loop's step (static tree of each size; n = 1: plain decoding)",
                              ["tokens", "verify ms", "T(n) ms", "bookkeeping ms", "context"],
                              [[n, curve.step_target_ms(n, c), curve.target_ms(n, c), curve.step_overhead(n, c), c]
                               for c in contexts for n in grid]))
        report.summary["draft extra per forward (ms)"] = curve.draft_extra_ms(contexts[0])
        report.summary["draft extra per step (ms)"] = curve.draft_step_extra_ms(contexts[0])
    if dtables is not None:
        unit = "nodes proposed" if one_pass else "tokens"
        report.tables.append((f"draft cost c(w) ({cost_model})", [unit, "ms", "context"],
                              [[w, curve.draft_ms(w, c), c] for c in contexts for w in dgrid]))
    if random_weights:
        report.notes.append("timed with RANDOM weights of the model's shape: latency does not depend on weight values")
    if dtables is None:
        report.warnings.append("no draft profiled: draft cost recorded as 0 ms (pass --draft / --draft-arch)")
    report.warnings.extend(noisy_points(ttables) + (noisy_points(dtables, "c") if dtables is not None else []))
    report.data = {"profile": curve.to_dict(), "output": str(out)}
    render(report, as_json)


@profile_app.command("linear")
@handle_errors
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
