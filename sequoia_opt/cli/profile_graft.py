"""``treeopt profile graft`` (a light and a strong drafter for one grafted tree: each drafter's profiles and the
pair profile, :func:`~sequoia_opt.jobs.graft.profile_graft`) and ``treeopt profile scheduler`` (the scheduler
that decides when a grafted tree calls the strong drafter, :func:`~sequoia_opt.profiling.graft.train_scheduler`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import torch
import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, DeviceOpt, DtypeOpt, JsonOpt, PromptsOpt, SeedOpt, TargetOpt, TemperatureOpt, TopPOpt,
                     TwoDraftsOpt, _check_run_options, _check_writable, _load_graft_tree, _print_error,
                     _two_drafters, check_output, handle_errors, mode_slug, output_file, profile_app, progress_bar,
                     setting_notes)
from .render import render


# ---------------------------------------------------------------------------------------------- two drafters
def _graft_outputs(out_dir: Path | None, tlabel: str, light, strong, device_slug: str, mode: str,
                   precision: str = "") -> dict[str, Path]:
    """The five files ``profile graft`` writes: the default paths the other commands read (each drafter's
    latency and own acceptance profile, the pair profile), or the same layout under ``out_dir``; ``precision``
    (:func:`~sequoia_opt.jobs.load.precision_suffix`) names a curve timed in another dtype than float32."""
    from ..jobs.load import default_acceptance_path, default_latency_path, default_pair_acceptance_path

    paths = {"light_latency": default_latency_path(tlabel, light, device_slug, precision),
             "strong_latency": default_latency_path(tlabel, strong, device_slug, precision),
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
    from ..jobs.load import (check_default_profile, default_draft_path, default_target_path, load_drafters, model_label,
                             parse_device, parse_dtype, precision_suffix, weights_record)
    from .._io import write_all
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
        if spec.entry.reads_features:  # a feature head: its checks (hidden size, vocabulary, layers) first
            spec.entry.check(spec, tcfg)
        elif spec.entry.loads_model:
            dcfg = load_model_config(spec.path if spec.path is not None else default_draft_path())
            limits.append((dcfg.max_position_embeddings, f"{spec.label} draft"))
    for limit, what in limits:
        if context + max_tokens > limit:
            raise TreeoptError(f"--context {context} + {max_tokens} tokens exceeds the {what} model's context of "
                               f"{limit} tokens: lower --context or --max-tokens")
    mode = mode_slug(temperature, top_p)
    slug = device_slug(dev)
    tlabel = model_label(tp)
    files = _graft_outputs(out_dir, tlabel, light, strong, slug, mode, precision_suffix(dt))
    for path in files.values():  # a path that cannot be written fails now, not after the measurements
        _check_writable(path)
    if out_dir is None:  # a default path holding another checkpoint's profile of the same name is not replaced
        for key, spec in (("light_acceptance", light), ("strong_acceptance", strong)):
            check_default_profile(files[key], weights_record(tp, spec), "--out-dir")
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
    write_all([(files["light_latency"], lambda p: save_latency(p, prof.light_curve)),
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
    # the scheduler trains on the prompts just profiled (else it would on the demo's)
    prompts_arg = f" --prompts {shlex.quote(str(prompts))} --num-prompts {num_prompts}" if prompts else ""
    next_cmds = [f"treeopt solve --pair-acceptance {files['pair_acceptance']} -a {files['light_acceptance']} -a "
                 f"{files['strong_acceptance']} -l {files['light_latency']} -l {files['strong_latency']} "
                 "-o graft-tree.yaml",
                 f"treeopt profile scheduler{target_arg} --tree graft-tree.yaml --draft {light.spec} --draft "
                 f"{strong.spec} -l {files['light_latency']}{prompts_arg}{sampling}{extra}",
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
        "--output", "-o", parser=output_file,
        help="Write the scheduler here (atomically); default: scheduler-<mode>.yaml in the pair "
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
    check_output(out, {"--tree": tree, "--latency": latency, "--prompts": prompts, "--target": target,
                       "--draft": [str(d) for d in draft or []]})
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
