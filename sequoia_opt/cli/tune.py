"""``treeopt tune --engine {vllm,sglang,tensorrt-llm,llama.cpp,treeopt}``: how far to speculate at each batch size,
in the engine's own settings (:mod:`sequoia_opt.jobs.tune` does the work; :mod:`sequoia_opt.solver.schedule`
solves, :mod:`sequoia_opt.plan_exports` writes each engine's settings)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from .._io import atomic_write_texts
from ..report import Report
from .common import DraftOpt, JsonOpt, TargetOpt, app, check_output, handle_errors, output_file, progress_bar
from .render import render


@app.command("tune")
@handle_errors
def tune(
    engine: Annotated[str, typer.Option("--engine", "-e", help="vllm | sglang | tensorrt-llm | llama.cpp | treeopt")],
    target: TargetOpt = None,
    draft: DraftOpt = None,
    batches: Annotated[Optional[str], typer.Option(
        "--batches", help="Batch sizes to solve, comma-separated (default: every batch size the --latency profile or "
        "table has; 1,2,4,8,16 when tune measures).")] = None,
    latency: Annotated[Optional[Path], typer.Option(
        "--latency", "-l", help="T(b, n): a treeopt-latency-batch/1 profile, an engine's latency profile (batch 1), or "
        "a CSV table batch,tokens,target_ms[,draft_ms][,overhead_ms]. Default for llama.cpp and treeopt: measured "
        "here (or reused from profiles/).")] = None,
    acceptance: Annotated[Optional[Path], typer.Option(
        "--acceptance", "-a", help="The drafter's acceptance profile (default for llama.cpp and treeopt: measured here "
        "or reused).")] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", help="A calibration profile: values EAGLE envelopes (--shape envelope).")] = None,
    shape: Annotated[str, typer.Option("--shape", help="chain (a draft length per batch size) | envelope (EAGLE "
                                        "steps / topk / draft tokens: SGLang, TensorRT-LLM) | tree (a static tree per "
                                        "batch size: treeopt's decoder)")] = "chain",
    max_draft: Annotated[Optional[int], typer.Option(
        "--max-draft", help="The longest chain considered, or a tree's drafted tokens at most (--shape tree; default: "
        "what the profile measured, at most 8).")] = None,
    context: Annotated[Optional[int], typer.Option(
        "--context", help="Context length (tokens) latency is measured and read at, for llama.cpp and treeopt: "
        "the mean context of a served step, your prompts' tokens plus half the answer (default 128; a GPU engine's "
        "T(b, n) is read as given).")] = None,
    release: Annotated[Optional[str], typer.Option(
        "--release", help="The engine release to export for (refused when it does not take the setting).")] = None,
    method: Annotated[Optional[str], typer.Option(
        "--method", help="The engine's drafting method in vLLM's names: draft_model | ngram | eagle | eagle3 | mtp | "
        "medusa "
        "(default: the drafter measured: --draft, else the one the acceptance profile names).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="The draft checkpoint to name in the export.")] = None,
    max_batch: Annotated[Optional[int], typer.Option(
        "--max-batch", help="The engine's largest batch: the last range ends there (a --plan's too; one ending past "
        "it is refused; without --batches, the table's batch sizes past it are left out); SGLang's "
        "--max-running-requests.")] = None,
    prompts: Annotated[Optional[Path], typer.Option(
        "--prompts", help="Prompts the acceptance is measured on (default: the demo's profile prompts).")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", help="Prompts used for acceptance.")] = 8,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per prompt for acceptance.")] = 48,
    threads: Annotated[int, typer.Option("--threads", help="CPU threads for measuring.")] = 1,
    rounds: Annotated[int, typer.Option("--rounds", help="Timing rounds per (batch, tokens).")] = 2,
    acceptance_model: Annotated[str, typer.Option(
        "--acceptance-model", help="auto | replay | positional | by-depth (auto: chains replayed on the profile's "
        "teacher-forced traces where it has them).")] = "auto",
    min_gain: Annotated[float, typer.Option(
        "--min-gain", help="Speculate only where the predicted lead over plain decoding exceeds this fraction "
        "(0.05 = 5 %); a smaller lead keeps plain decoding at that batch size.")] = 0.0,
    output_tokens: Annotated[Optional[int], typer.Option(
        "--output-tokens", help="The requests' typical answer length (tokens): rates over answers that long, whose "
        "last step's drafted tokens past the end are wasted (default: the steady state of long answers).")] = None,
    refine: Annotated[int, typer.Option(
        "--refine", help="Rounds of bisection on the batch size: where two neighbouring batch sizes choose different "
        "settings, time T(b, n) at their midpoint and solve again (llama.cpp and treeopt, measured here; a given "
        "profile gets a note naming the batch sizes to add). 0: off; at most 8.")] = 1,
    rows: Annotated[str, typer.Option(
        "--rows", help="How treeopt's decoder's T(b, n) times the rows of a batch: spread (at contexts spread as a "
        "batch of the --prompts would be, mean --context: its padded KV cache attends over the longest row) | "
        "uniform (every row at --context).")] = "spread",
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", parser=output_file,
        help="Write the engine's settings here (vLLM: the --speculative-config JSON; TensorRT-LLM: "
        "the extra_llm_api_options YAML; SGLang: the adaptive config JSON for EAGLE chains, else the flags per range; "
        "llama.cpp: the flags per -np; treeopt: the treeopt-schedule/1 plan). Where speculation pays at no batch "
        "size the GPU engines run without a speculative setting: nothing is written, and engine settings already "
        "there (an earlier plan's) are removed; any other file there is kept.")] = None,
    schedule: Annotated[Optional[Path], typer.Option(
        "--schedule", parser=output_file,
        help="Also write the treeopt-schedule/1 plan (every batch size's prediction) here.")] = None,
    plan: Annotated[Optional[Path], typer.Option(
        "--plan", help="A treeopt-schedule/1 plan to predict and export instead of solving one.")] = None,
    profiles_dir: Annotated[Path, typer.Option("--profiles-dir", help="Where profiles are looked for and written.")] =
    Path("profiles"),
    as_json: JsonOpt = False,
) -> None:
    """Choose how far to speculate at each batch size from measured curves, and print it in the engine's settings:
    runs what is missing of profile -> solve, then prints the settings, the predicted table per batch size and the
    command that checks it."""
    from ..jobs.tune import GPU_ENGINES, TuneOptions, batch_sizes_text, check_options
    from ..jobs.tune import tune as run_tune
    from ..profiles.batch import parse_batches
    from ..errors import OutputError
    from ..solver.schedule import FIRST_IS_LONGEST_RULE, schedule_text
    from ..plan_exports import check_settings_name, looks_like_engine_settings

    opts = check_options(TuneOptions(
        engine=engine, target=target, draft=draft,
        batches=None if batches is None else parse_batches(batches, "--batches"), latency=latency,
        acceptance=acceptance, calibration=calibration, shape=shape, max_draft=max_draft,
        context=128 if context is None else context,
        release=release, method=method, model=model, max_batch=max_batch, prompts=prompts, num_prompts=num_prompts,
        max_new_tokens=max_new_tokens, threads=threads, rounds=rounds, acceptance_model=acceptance_model,
        min_gain=min_gain, output_tokens=output_tokens,
        profiles_dir=profiles_dir, plan=plan, refine=refine, rows=rows))
    inputs = {"--latency": latency, "--acceptance": acceptance, "--calibration": calibration, "--plan": plan,
              "--prompts": prompts, "--target": target, "--draft": None if draft is None else str(draft)}
    for flag, path in (("-o", output), ("--schedule", schedule)):
        check_output(path, inputs, flag)
    if output is not None:
        check_settings_name(opts.engine, output)
    if output is not None and schedule is not None and Path(output).resolve() == Path(schedule).resolve():
        raise OutputError(f"-o and --schedule both name {output}: the engine's settings and the plan are two files")
    with progress_bar() as progress:
        res = run_tune(opts, progress)
    plan, settings = res.plan, res.settings
    report = Report(title=f"treeopt tune --engine {opts.engine}")
    if context is not None and opts.engine in GPU_ENGINES:
        report.warnings.append(f"--context {context} is not used for {opts.engine}: its T(b, n) is read as given "
                               "(a table has no context column; measure it at the context you serve)")
    stops = plan.stops_paying_above
    # measured batch sizes below the last that pays where it does not: "pays up to 128" hid plain decoding at 32-64
    paying = [r.batch for r in plan.rows if r.best.setting.speculates]
    holes = [r.batch for r in plan.rows if paying and r.batch < paying[-1] and not r.best.setting.speculates]
    hole_text = f" (but not at batch {', '.join(map(str, holes))})" if holes else ""
    slower = [r.batch for r in plan.rows if r.best.setting.speculates and r.best.speedup < 1.0]
    if slower:  # TensorRT-LLM's rule can run batch 1 below plain so that larger batch sizes may draft
        hole_text += (f"; batch {', '.join(map(str, slower))} speculates below plain decoding under the engine's "
                      f"rule ({FIRST_IS_LONGEST_RULE})")
    own_paying = [r.batch for r, own in zip(plan.rows, plan.own_best) if own.setting.speculates]
    report.summary = {
        "engine": opts.engine, "drafter": res.schedule.get("drafter"), **{k: v for k, v in res.profiles.items()},
        "speculation": (f"pays at no batch size under the engine's rule ({FIRST_IS_LONGEST_RULE}; "
                        f"without it, it would at {batch_sizes_text(own_paying)}): none"
                        if stops == 0 and own_paying else
                        "pays at no batch size measured: none" if stops == 0 else
                        f"stops paying above batch {stops}{_ranges_past(plan, stops)}{hole_text}"
                        if stops is not None else
                        f"pays up to the largest batch predicted ({plan.rows[-1].batch}){hole_text}"),
        "ranges": "; ".join(f"{r.lo}-{r.hi}: {r.setting.label}" for r in plan.ranges)}
    if settings is not None:
        report.summary["releases"] = settings.releases
        report.summary["rules read in"] = settings.checked
    rows = []
    for r in plan.rows:
        b = r.best
        lo, hi = b.interval
        rows.append([r.batch, b.setting.label, b.cost.expected_tokens, b.cost.cost_ms, b.tokens_per_s_per_request,
                     _span(lo, hi), b.tokens_per_s_total, _span(r.batch * lo, r.batch * hi),
                     r.plain.tokens_per_s_total, b.speedup])
    over = (f"over {plan.output_tokens}-token answers" if plan.output_tokens is not None
            else "steady state of long answers")
    report.tables.append((f"predicted per batch size (the plan's setting; {over}; intervals 95 %)",
                          ["batch", "setting", "tokens/step", "step ms", "tok/s per request", "interval",
                           "tok/s total", "interval", "plain tok/s total", "speedup"], rows))
    if res.peers:
        names = list(res.peers)
        report.tables.append(("predicted total tok/s: the plan against the peers' rules",
                              ["batch", "plan", *names],
                              [[r.batch, r.best.tokens_per_s_total, *[res.peers[n].get(r.batch) for n in names]]
                               for r in plan.rows]))
    if settings is not None:
        text, command, what = settings.text.rstrip(), settings.command, f"{opts.engine} settings"
        if "adaptive.json" in settings.extra_files:  # SGLang's tiers: printed as the file holds them, flags apart
            text = settings.extra_files["adaptive.json"].rstrip()
            what = (f"{opts.engine} settings: the --speculative-adaptive-config file "
                    f"({output if output is not None else 'adaptive.json'}), with the flags below")
            if output is not None:  # -o is where that file goes
                command = command.replace("adaptive.json", shlex.quote(str(output)))
        elif output is not None:  # TensorRT-LLM's extra options: the file -o writes
            command = command.replace("THIS.yaml", shlex.quote(str(output)))
        report.notes.append(f"{what}:\n{text}")
        report.notes.append(f"start it with: {command}")
        report.notes.extend(settings.notes)
        report.warnings.extend(settings.warnings)
    report.notes.extend(res.notes)
    report.warnings.extend(res.warnings)
    plan_file = output if opts.engine == "treeopt" and output is not None else schedule
    check = res.check.replace("PLAN.yaml", shlex.quote(str(plan_file))) if plan_file is not None else res.check
    if output is not None:  # the GPU engines' check reads the settings file: the one -o wrote
        check = re.sub(r"\bOUT\b", lambda _: shlex.quote(str(output)), check)
    if plan_file is None and "PLAN.yaml" in check:
        check += " (write PLAN.yaml with --schedule PLAN.yaml)"
    where = " (in a checkout of treeopt: benchmarks/ is not installed with the package)" if check.startswith(
        "python benchmarks/") else ""
    if settings is not None and settings.nothing_to_set:  # no settings file to check: the engine runs plainly
        report.notes.append(f"nothing to start with speculation on {opts.engine}: it runs without it (plain "
                            "decoding), " + ("as the plan given does at every batch size" if opts.plan is not None
                                            else "which the plan predicts fastest at every batch size measured"
                                            + (" under the engine's rule (see speculation above)"
                                               if own_paying else "")))
    else:
        report.notes.append(f"check it{where}: {check}")
    if opts.engine == "treeopt":
        f = shlex.quote(str(plan_file)) if plan_file is not None else "PLAN.yaml"
        pair = "".join(f" {flag} {shlex.quote(str(v))}" for flag, v in (("--target", opts.target),
                                                                          ("--draft", opts.draft)) if v is not None)
        if res.profiles.get("latency", "").startswith(("measured:", "reused:")):
            pair += f" --threads {opts.threads}"  # the threads T(b, n) was timed with (a reused one: the same)
        if opts.prompts is not None:  # the user's prompts, not the demo's (which may not fit their model)
            pair += f" --prompts {shlex.quote(str(opts.prompts))}"
        live = (f"treeopt run{pair} --policy adaptive-schedule:{f} (re-ranked from the acceptance the requests "
                "show), or " if plan.shape == "chain" else "")
        report.notes.append(f"serve it with treeopt's decoder: {live}treeopt run{pair} --policy schedule:{f} (as "
                            "solved)" + (" (write PLAN.yaml with --schedule PLAN.yaml)" if plan_file is None else ""))
    files: dict[Path, str] = {}  # every output's text first: then written as one unit (both or neither)
    written = {}
    stale: Path | None = None  # settings at -o this plan must not leave behind: judged under the write's locks
    why = ""
    if output is not None:
        if opts.engine == "treeopt":
            files[output] = schedule_text(output, res.schedule)
        elif opts.engine == "sglang" and "adaptive.json" in settings.extra_files:
            files[output] = settings.extra_files["adaptive.json"]
            report.notes.append(f"pass it as --speculative-adaptive-config {output}")
        elif settings.nothing_to_set:  # a comment in a file the engine parses as JSON / YAML would break it
            why = settings.nothing_to_set_reason + (
                f" (under the engine's rule; without it, {batch_sizes_text(own_paying)} would speculate)"
                if own_paying else "")
            stale = output.resolve()  # through a link: the file the engine reads
        else:
            files[output] = settings.text
        if output in files:
            written["output_file"] = str(output)
    if schedule is not None:
        files[schedule] = schedule_text(schedule, res.schedule)
        written["schedule_file"] = str(schedule)
    if stale is not None and stale.is_file() and looks_like_engine_settings(stale) \
            and not os.access(stale.parent, os.W_OK | os.X_OK):
        # before anything is written: a file that cannot be removed stops the run with every path as it was
        raise OutputError(f"cannot remove {output}: its folder is not writable")
    removed: list[Path] = []

    def earlier_settings(path: Path) -> bool:  # an earlier plan's (or a tune beside this one's): it would keep the
        if looks_like_engine_settings(path):  # engine speculating; any other file there is kept
            removed.append(path)
            return True
        return False

    # the stale settings go in the same unit, after the writes (a failed write leaves them in place), judged and
    # removed inside the folders' locks (a tune running beside this one never ends with its spec beside this plan)
    atomic_write_texts(files, remove=[stale] if stale is not None else [], remove_if=earlier_settings)
    if removed:
        written["removed_file"] = str(output)
        report.warnings.append(f"removed {output} (an earlier setting): {why}")
    elif stale is not None and stale.is_file():
        report.warnings.append(f"nothing written to {output}, and the file there was kept: it holds no engine "
                               f"settings treeopt writes (remove it if it was one): {why}")
    elif stale is not None:
        report.warnings.append(f"nothing written to {output}: {why}")
    for k, v in written.items():
        if k != "removed_file":
            report.notes.append(f"wrote {v}")
    report.data = {"summary": report.summary, "schedule": res.schedule, "profiles": res.profiles, "peers": res.peers,
                   "check": check,
                   "settings": None if settings is None else {"text": settings.text, "data": settings.data,
                                                              "releases": settings.releases,
                                                              "command": settings.command}, **written}
    render(report, as_json)


def _ranges_past(plan, stops: int) -> str:
    """Where the settings speculate past ``stops`` (the last measured batch size that pays): a range runs its
    measured size's setting up to the next measured size, so the headline says so, not only the measurement."""
    hi = max((r.hi for r in plan.ranges if r.setting.speculates), default=None)
    if hi is None or hi <= stops:
        return ""
    return (f" (measured; the settings speculate up to batch {hi}: batch {hi + 1}, the next size solved, runs "
            "none; solve sizes between to place the switch)")


def _span(lo: float, hi: float) -> str:
    """An interval (tokens/s) as the table shows it: one notation for both ends (thousands as integers, as the
    table's point figures print), and "-" where the interval is a point (no spread was measured behind it)."""
    if hi <= lo:
        return "-"
    if hi >= 1000:
        return f"{lo:.0f}-{hi:.0f}"
    return f"{lo:.4g}-{hi:.4g}"
