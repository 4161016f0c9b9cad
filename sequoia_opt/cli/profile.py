"""``treeopt profile latency`` and ``treeopt profile acceptance``: measure the device (T(n), c(w), the
per-step overhead) and the model pair (the positional acceptance vector)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, DeviceOpt, DraftOpt, DtypeOpt, JsonOpt, ProfileOutputOpt, PromptsOpt, SeedOpt,
                     TargetOpt, TemperatureOpt, TopPOpt, _check_run_options, _csv_ints, _interruptible, app,
                     handle_errors, progress_bar, setting_notes)
from .render import render

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
    output: ProfileOutputOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Measure T(n): one target forward over n tokens through the verification path (KV cache holding the
    context, prefix + tree mask), and the drafter's cost c(w) in its own cost model (a draft model or
    self:L: one forward over w tokens, per level; lookup: one proposal of w nodes); plus the fixed per-step
    overhead."""
    from ..model import ModelConfig
    from ..model.loaders import load_model_config
    from ..pipeline import (DrafterSpec, check_drafter, drafter_slug, load_pair, parse_device, parse_drafter_spec,
                            parse_dtype)
    from ..profiles import save_latency
    from ..profiling.device import device_slug
    from ..profiling.latency import (build_latency_profile, measure_step_overhead, method_text, profile_drafter,
                                    profile_model, random_weight_model)
    from ..profiling.timing import token_grid

    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev)
    contexts = _csv_ints(context, "--context")
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
    if threads is not None:
        if threads < 1:
            raise TreeoptError("--threads must be at least 1")
        torch.set_num_threads(threads)

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
        if spec is not None and spec.kind == "model":
            raise TreeoptError("with --random-weights a draft model is given by its shape: --draft-arch "
                               "PRESET|config.json (--draft takes self:L or lookup here)")
        if spec is not None:
            check_drafter(spec, tcfg)
        tmodel = random_weight_model(tcfg, device=dev, dtype=dt)
        tname = f"{tcfg.name} (random weights)"
        dname = None
        if dcfg is not None:
            drafter = random_weight_model(dcfg, device=dev, dtype=dt, seed=1)
            dname, dconfig = f"{dcfg.name} (random weights)", dcfg
        elif spec is not None:
            from ..pipeline import ModelPair

            pair = ModelPair(tmodel, None, None, tname, spec.label, spec)
            drafter, dname = _drafter_to_time(pair), spec.label
            make_drafter = pair.new_drafter
    else:
        pair = load_pair(target, spec, device=dev, dtype=dt)
        tmodel, tname, dname = pair.target, pair.target_name, pair.draft_name
        drafter, make_drafter = _drafter_to_time(pair), pair.new_drafter
        dconfig = pair.draft.config if pair.draft is not None else None
    if isinstance(drafter, torch.nn.Module):
        make_drafter = drafter  # a draft model: the decoder wraps it
    grid = token_grid(max_tokens)
    dgrid = token_grid(max_draft_tokens)
    with progress_bar() as progress:
        ttables = profile_model(tmodel, grid, contexts, what="target", backend=backend, progress=progress,
                                rounds=rounds, paired=paired, min_repeats=min(5, repeats), max_repeats=repeats)
        dtables = None
        if drafter is not None:
            dtables = profile_drafter(tmodel, drafter, dgrid, contexts, backend=backend, progress=progress,
                                      rounds=rounds, paired=paired and not one_pass, min_repeats=min(5, repeats),
                                      max_repeats=repeats)
        overhead = measure_step_overhead(tmodel, make_drafter if drafter is not None else tmodel, backend=backend)
    slug = device_slug(dev)
    base = tcfg.name if random_weights else tname
    dpart = f"__{drafter_slug(dname)}" if dname is not None and spec is not None and spec.kind != "model" else ""
    pid = f"{slug}_{base}{dpart}_{dt}".replace("torch.", "")
    curve = build_latency_profile(
        target_tables=ttables, draft_tables=dtables, step_overhead_ms=overhead, device=dev, dtype=dt,
        target_name=tname, target_config=tmodel.config, draft_name=dname, draft_config=dconfig,
        random_weights=random_weights, profile_id=pid, method=method_text(rounds, paired, grid),
        draft_cost_model=cost_model)
    out = output or Path("profiles") / slug / f"{base}{dpart}-latency.yaml"
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


def _drafter_to_time(pair) -> object:
    """What :func:`~sequoia_opt.profiling.latency.profile_drafter` times for a pair's drafter."""
    spec = pair.drafter
    if spec is None or spec.kind == "model":
        return pair.draft
    if spec.kind == "self":
        return ("self", spec.num_layers)
    return ("lookup", pair.new_drafter)


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
    from ..pipeline import load_pair, parse_device, parse_dtype
    from ..profiles import save_acceptance
    from ..profiling.acceptance import build_acceptance_profile, measure_acceptance, positional_check
    from ..prompts import demo_prompts_path, load_prompts

    if width < 1 or depth < 1:
        raise TreeoptError("--width and --depth must be at least 1")
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    from ..pipeline import parse_drafter_spec

    spec = parse_drafter_spec(draft)  # a bad --draft fails here, before prompts or models are read
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    pair = load_pair(target, spec, device=dev, dtype=dt)
    if width > pair.vocab_size:
        raise TreeoptError(f"--width {width} asks for more candidates per node than the draft's vocabulary has "
                           f"tokens ({pair.vocab_size})")
    ids = [pair.tokenizer.encode(p.text) for p in texts]
    with progress_bar() as progress:
        counts = measure_acceptance(pair.target, pair.new_drafter, ids, width=width, depth=depth,
                                    temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                    eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    pair_slug = pair.slug
    prof = build_acceptance_profile(
        counts, profile_id=f"{pair_slug}_{mode}", target_name=pair.target_name, draft_name=pair.draft_name,
        temperature=temperature, top_p=top_p, depth=depth, device=str(dev), dtype=str(dt).removeprefix("torch."),
        prompts_file=str(pfile), num_prompts=len(ids), max_new_tokens=max_new_tokens, seed=seed,
        draft_cost_model=pair.cost_model)
    out = output or Path("profiles") / pair_slug / f"acceptance-{mode}.yaml"
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
