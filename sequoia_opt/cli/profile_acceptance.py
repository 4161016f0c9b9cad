"""``treeopt profile acceptance``: what the pair does, the positional acceptance vector p_1..p_K with its counts
and per-depth vectors (Sequoia section 3.1); ``--calibration``: the calibration profile dynamic trees are
predicted from."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import (BackendOpt, DeviceOpt, DraftOpt, DtypeOpt, JsonOpt, ProfileOutputOpt, PromptsOpt, SeedOpt,
                     TargetOpt, TemperatureOpt, TopPOpt, _check_run_options, _check_writable, check_output,
                     handle_errors, located_prompts, profile_app, progress_bar, setting_notes)
from .render import render


@profile_app.command("acceptance")
@handle_errors
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
    chains: Annotated[bool, typer.Option(
        "--chains", help="Measure chain acceptance instead (greedy; for treeopt tune and the engines' draft lengths): "
        "the target's greedy output with the drafter teacher-forced along it, kept per prompt, so that a chain of "
        "every length is replayed exactly (written beside the tree profile as acceptance-greedy-chains.yaml).")
    ] = False,
    interval_width: Annotated[float, typer.Option(
        "--interval-width", help="Print how many prompts of this kind give a 95 % interval of the mean of p_1 (and "
        "of the acceptance mass) this wide, from the variation between this profile's prompts.")] = 0.05,
    as_json: JsonOpt = False,
) -> None:
    """Measure the positional acceptance vector p_1..p_K with the decoder's own verifier (greedy or
    sampling), with counts, per-prompt counts, 95 % intervals (of the tokens, and between prompts) and per-depth
    vectors; with --calibration, the calibration profile of draft probability against acceptance that dynamic
    trees are predicted from. Profile a sample of your own traffic: --prompts FILE."""
    from ..jobs.load import default_acceptance_path, load_pair, parse_device, parse_dtype
    from ..profiles import save_acceptance
    from ..profiling.acceptance import (build_acceptance_profile, measure_acceptance, positional_check,
                                        record_depth_limit)
    from ..device import device_name
    from ..prompts import demo_prompts_path, encode_prompts, load_prompts

    if width < 1 or depth < 1:
        raise TreeoptError("--width and --depth must be at least 1")
    if not 0 < interval_width <= 1:
        raise TreeoptError(f"--interval-width is the width of an interval of a probability: in (0, 1], got "
                           f"{interval_width}")
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    dev, dt = parse_device(device), parse_dtype(dtype)
    _check_run_options(backend, dev, temperature, top_p)
    check_output(output, {"--prompts": prompts, "--target": target, "--draft": draft})  # before the decoding
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
        if interval_width != 0.05:  # the calibration prints no prompts-needed line: it was dropped unsaid
            raise TreeoptError("--interval-width sizes the positional measurement's intervals of p_1; the calibration "
                               "reports its reliability table's own intervals: drop --interval-width")
        from ..profiling.calibration import recording_setting

        try:
            recording_setting(calibration_steps, calibration_topk)  # its size, before any model loads
        except ValueError as err:
            raise TreeoptError(str(err)) from None
    elif (calibration_steps, calibration_topk) != (5, 4):
        raise TreeoptError("--calibration-steps / --calibration-topk shape the calibration recording: add "
                           "--calibration (or drop them)")
    if chains and (calibration or temperature != 0 or (width, depth) != (8, 4)):
        raise TreeoptError("--chains measures greedy chains along the target's output: drop --calibration, "
                           "--temperature, --width and --depth")
    if chains and spec is not None and spec.entry.reads_features:
        raise TreeoptError(f"--chains: {spec.label} needs the target's hidden states and cannot be teacher-forced; "
                           "profile it without --chains")
    pfile = prompts or demo_prompts_path("profile")
    texts = load_prompts(pfile, limit=num_prompts)
    pair = load_pair(target, spec, device=dev, dtype=dt)
    naming = located_prompts(texts, pfile)
    if chains:
        with naming:
            _profile_chains(pair, spec, texts, pfile, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
                            backend=backend, output=output, interval_width=interval_width, as_json=as_json)
        return
    if calibration:
        with naming:
            _profile_calibration(pair, spec, texts, pfile, steps=calibration_steps, topk=calibration_topk,
                                 temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                 num_prompts=num_prompts, dev=dev, dt=dt, backend=backend, output=output,
                                 as_json=as_json)
        return
    if width > pair.vocab_size:
        raise TreeoptError(f"--width {width} asks for more candidates per node than the "
                           f"{'draft' if pair.draft is not None else 'target'}'s vocabulary has "
                           f"tokens ({pair.vocab_size})")
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    out, weights = _output(output, default_acceptance_path(pair.target_name, spec, mode), pair)  # run's default
    with naming, progress_bar() as progress:
        counts = measure_acceptance(pair.target, pair.new_drafter, ids, width=width, depth=depth,
                                    temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                    eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    pair_slug = pair.slug
    prof = build_acceptance_profile(
        counts, profile_id=f"{pair_slug}_{mode}", target_name=pair.target_name, draft_name=pair.draft_name,
        temperature=temperature, top_p=top_p, depth=depth, device=device_name(dev), dtype=str(dt).removeprefix("torch."),
        prompts_file=str(pfile), num_prompts=len(ids), max_new_tokens=max_new_tokens, seed=seed,
        draft_cost_model=pair.cost_model)
    prof.measured["weights"] = weights
    record_depth_limit(prof, pair.new_drafter())  # Medusa's K heads propose depths 1..K: what is solved stops there
    save_acceptance(out, prof)
    ci = prof.confidence_interval()
    from ..solver.intervals import acceptance_spreads

    spreads = acceptance_spreads(prof)
    report = Report(title="treeopt profile acceptance")
    report.notes.extend(setting_notes(temperature=temperature, top_p=top_p, num_prompts=num_prompts,
                                      prompts_found=len(texts), prompts_file=pfile))
    if (uncovered := counts.coverage_warning()) is not None:
        report.warnings.append(uncovered)
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "draft cost model": pair.cost_model,
                      "mode": mode, "trials": counts.trials,
                      "sum p_k": float(prof.acceptance.sum()), "all rejected": prof.all_rejected,
                      "tokens / step (measurement tree)": counts.tokens / max(counts.steps, 1), "written": str(out)}
    def between(k: int) -> list:  # the interval of the mean between prompts, and for a new set of as many
        if spreads is None:
            return ["-", "-"]
        return [f"{a:.3f} to {b:.3f}" for a, b in (spreads[k].mean_interval(),
                                                   spreads[k].prediction_interval(spreads[k].prompts))]

    report.tables.append(("positional acceptance vector (95 % intervals: of the tokens, Wilson; between prompts, a "
                          "cluster bootstrap: of the mean, and for a new set of as many prompts)",
                          ["k", "p_k", "tokens low", "tokens high", "between prompts", "new prompt set", "count"],
                          [[k + 1, float(prof.acceptance[k]), float(ci[k, 0]), float(ci[k, 1]), *between(k),
                            int(counts.counts[k])] for k in range(width)]
                          + [["sum", float(prof.acceptance.sum()), None, None, *between(width), None]]))
    if spreads is not None:
        need = {"p_1": spreads[0].prompts_needed(interval_width), "sum p_k": spreads[-1].prompts_needed(interval_width)}
        report.summary["prompts"] = len(ids)
        report.summary[f"prompts for a {interval_width:g}-wide interval of the mean"] = \
            f"p_1: {need['p_1']}, sum p_k: {need['sum p_k']} (this profile: {len(ids)})"
        lo, hi = spreads[0].mean_interval()
        tlo, thi = float(ci[0, 0]), float(ci[0, 1])
        # tokens of one prompt are correlated, so the token interval is usually the narrower; with few prompts the
        # bootstrap's can be narrower still (it then understates the spread): say which it was
        which = ("the token interval {:.3f} to {:.3f} is narrower, as it treats correlated tokens as independent"
                 if thi - tlo < hi - lo else "the token interval {:.3f} to {:.3f} is wider here: few prompts "
                 "understate the spread between them").format(tlo, thi)
        report.notes.append(f"p_1 between prompts: {lo:.3f} to {hi:.3f} over {len(ids)} prompts ({which}); "
                            f"{need['p_1']} prompts of this kind give an interval {interval_width:g} wide")
    else:
        need = None
        report.notes.append("one prompt: no interval between prompts (profile several prompts of your traffic)")
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
    report.data = {"profile": prof.to_dict(), "positional_check": check, "output": str(out),
                   "between_prompts": None if spreads is None else [sp.to_dict(sp.prompts) for sp in spreads],
                   "prompts_needed": None if need is None else {"interval_width": interval_width, **need}}
    render(report, as_json)


def _output(output: Path | None, default: Path, pair) -> tuple[Path, dict]:
    """Where a profile of ``pair`` goes (``-o``, else ``default``, where the other commands look) and the weights
    it records (:func:`~sequoia_opt.jobs.load.weights_record`), checked before the decoding: the path can become a
    file, and a default path does not hold another checkpoint's profile of the same name
    (:func:`~sequoia_opt.jobs.load.check_default_profile`)."""
    from ..jobs.load import check_default_profile

    out, weights = output or default, pair.weights
    if output is None:
        check_default_profile(out, weights)
    _check_writable(out)  # the default path too, before the decoding
    return out, weights


def _profile_chains(pair, spec, texts, pfile, *, max_new_tokens, num_prompts, backend, output, interval_width,
                    as_json) -> None:
    """``profile acceptance --chains``: teacher-forced traces (:func:`~sequoia_opt.profiling.acceptance.chain_traces`),
    the chain profile (:func:`~sequoia_opt.jobs.tune.acceptance_from_traces`), written and shown with each K's
    replayed tokens per step (:class:`~sequoia_opt.solver.schedule.ChainValue`)."""
    from ..jobs.load import default_chain_acceptance_path
    from ..jobs.tune import DEFAULT_MAX_DRAFT, measure_chain_acceptance, short_traces_note
    from ..profiles import save_acceptance
    from ..prompts import encode_prompts
    from ..solver.intervals import acceptance_spreads
    from ..drafting.drafters.model import guessable_tokens
    from ..solver.schedule import ChainValue, SpecSetting

    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    ctx = pair.draft_context  # a draft model's (None: the target's, which every prompt was checked against)
    if ctx is not None and ids and min(map(len, ids)) >= ctx:
        raise TreeoptError(f"--chains: the draft's context is {ctx} tokens and the shortest prompt is "
                           f"{min(map(len, ids))}: it can guess at no position; use shorter prompts, or a draft "
                           "with a longer context")
    out, weights = _output(output, default_chain_acceptance_path(pair.target_name, spec), pair)  # where tune looks
    with progress_bar() as progress:
        prof = measure_chain_acceptance(pair, ids, prompts_file=str(pfile), max_new_tokens=max_new_tokens,
                                        max_depth=DEFAULT_MAX_DRAFT, command="treeopt profile acceptance --chains",
                                        backend=backend, progress=progress)
    if prof is None:
        raise TreeoptError(f"--chains: {pair.draft_name} cannot be teacher-forced; profile it without --chains")
    prof.measured["weights"] = weights
    save_acceptance(out, prof)
    value = ChainValue(prof, DEFAULT_MAX_DRAFT)
    report = Report(title="treeopt profile acceptance --chains")
    report.notes.extend(setting_notes(temperature=0.0, top_p=1.0, num_prompts=num_prompts, prompts_found=len(texts),
                                      prompts_file=pfile))
    if value.whole_answer_ks:
        report.notes.append(short_traces_note(value))
    if ctx is not None and prof.chain_traces:  # teacher-forced guesses past the draft's context: misses
        total = sum(len(t) for t in prof.chain_traces)
        past = sum(len(t) - min(len(t), guessable_tokens(ctx, len(p))) for t, p in zip(prof.chain_traces, ids))
        if total and past >= 0.05 * total:
            report.warnings.append(f"{past} of {total} positions ({past / total:.0%}) lie past the draft's context "
                                   f"({ctx} tokens): it guesses nothing there and they count as misses, as served "
                                   "(plain steps); use prompts + --max-new-tokens within the draft's context to "
                                   "measure its acceptance")
    report.summary = {"target": pair.target_name, "draft": pair.draft_name, "prompts": prof.measured["num_prompts"],
                      "tokens": int(prof.counts.sum()), "p_1 (every position)": float(prof.acceptance[0]),
                      "written": str(out)}
    spreads = acceptance_spreads(prof)
    if spreads is not None:
        report.summary[f"prompts for a {interval_width:g}-wide interval of the mean of p_1"] = \
            spreads[0].prompts_needed(interval_width)
    report.tables.append((f"greedy chains of K drafts, replayed on the traces (steady state; 95 % interval for a new "
                          f"set of as many prompts, {value.interval_method})",
                          ["K", "tokens / step", "low", "high", f"over {max_new_tokens}-token answers"],
                          [[k, value.g[k], value.g_lo[k], value.g_hi[k],
                            value.g[k] * value.length_factor(SpecSetting.chain(k), max_new_tokens)]
                           for k in range(1, DEFAULT_MAX_DRAFT + 1)]))
    report.acceptance = None
    report.data = {"profile": prof.to_dict(), "output": str(out),
                   "tokens_per_step": {k: value.g[k] for k in range(1, DEFAULT_MAX_DRAFT + 1)}}
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
    limit = pair.new_drafter().depth_limit  # Medusa's K heads propose depths 1..K: a deeper recording holds K
    asked = steps
    if limit is not None and steps > limit:
        steps = limit
    ids = encode_prompts(texts, pair.tokenizer, model=pair.target_name)
    mode = "greedy" if temperature == 0 else f"sampling-t{temperature:g}-p{top_p:g}"
    out, weights = _output(output, default_acceptance_path(pair.target_name, spec, mode).with_name(
        f"calibration-{mode}.yaml"), pair)
    with progress_bar() as progress:
        steps_rec = measure_calibration(pair.target, pair.new_drafter, ids, steps=steps, topk=topk,
                                        temperature=temperature, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens,
                                        eos_ids=sorted(pair.tokenizer.eos_ids), backend=backend, progress=progress)
    if not steps_rec:
        raise TreeoptError("no step drafted (every prompt is at the end of the context): nothing to calibrate")
    prof = build_calibration_profile(
        steps_rec, profile_id=f"{pair.slug}_calibration_{mode}", target_name=pair.target_name,
        draft_name=pair.draft_name, temperature=temperature, top_p=top_p, recording_steps=steps, recording_topk=topk,
        device=device_name(dev), dtype=str(dt).removeprefix("torch."), prompts_file=str(pfile), num_prompts=len(ids),
        max_new_tokens=max_new_tokens, seed=seed)
    prof.measured["weights"] = weights
    save_calibration(out, prof)
    report = Report(title="treeopt profile acceptance --calibration")
    if steps != asked:
        report.notes.append(f"recorded {steps} levels, not the {asked} of --calibration-steps: {pair.draft_name} "
                            f"proposes no deeper than depth {steps}, so the dynamic settings it can run stop there")
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
