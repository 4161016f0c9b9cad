"""Engines other than treeopt's decoder (issue 20): ``treeopt export-draft --gguf``, and what ``profile latency
--engine``, ``solve --format llama.cpp`` and ``run --engine llama.cpp`` do (those commands dispatch here
first, so their other options stay theirs). The work is :mod:`sequoia_opt.engines`; this is the thin layer."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

import typer
from typing_extensions import Annotated

from ..errors import TreeoptError
from ..report import Report
from .common import JsonOpt, _check_writable, app, check_output, handle_errors, output_file, progress_bar
from .render import render, report_console

LLAMACPP_FORMATS = ("llama.cpp", "llamacpp", "llama-cpp")


def is_llamacpp_format(fmt: Optional[str]) -> bool:
    """Whether ``solve --format`` names llama.cpp's chain settings."""
    return fmt is not None and fmt.strip().lower() in LLAMACPP_FORMATS


@app.command("export-draft")
@handle_errors
def export_draft(
    gguf: Annotated[Path, typer.Option("--gguf", parser=output_file, help="The .gguf file to write (atomically).")],
    draft: Annotated[Optional[Path], typer.Option(
        "--draft", help="Checkpoint to write: a Hugging Face folder or a .gguf (default: the bundled demo draft).")] = None,
    outtype: Annotated[str, typer.Option("--outtype", help="2-D weights as f32 | f16 | q8_0 (norms stay F32).")] = "f16",
    check: Annotated[bool, typer.Option("--check/--no-check", help="Load the file in llama.cpp afterwards, when "
                                        "llama-cpp-python is installed.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Write a draft model (or any Llama-family checkpoint treeopt loads) as a GGUF llama.cpp loads, with its
    tokenizer: what llama.cpp's speculative decoding takes as --model-draft."""
    from .._io import atomic_output_path
    from ..model.gguf_writer import OUTTYPES, describe, write_gguf
    from ..model.loaders import load_checkpoint
    from ..jobs.load import default_draft_path, model_label

    if outtype not in OUTTYPES:
        raise TreeoptError(f"--outtype {outtype!r}: choose one of {', '.join(OUTTYPES)}")
    if gguf.suffix.lower() != ".gguf":
        raise TreeoptError(f"--gguf {gguf}: the file name must end in .gguf")
    check_output(gguf, {"--draft": draft}, "--gguf")  # over its own source it would replace the weights
    src = draft if draft is not None else default_draft_path()
    model, tok = load_checkpoint(src)
    label = model_label(src)
    if Path(src).suffix.lower() == ".gguf":  # a re-export keeps the source's general.name (loaded, the stem names it)
        from ..model.gguf_loader import load_gguf_config

        label = load_gguf_config(src).name or label
    report = Report(title="treeopt export-draft")
    # written beside --gguf and checked there: a file llama.cpp refuses never replaces the one the user had
    with atomic_output_path(gguf) as tmp:
        write_gguf(tmp, model, tok, outtype=outtype, name=label)
        info = describe(tmp)
        loads = _llamacpp_loads(tmp, gguf) if check else None
    report.summary = {"source": str(src), "name": label, "written": str(gguf), **info, "outtype": outtype,
                      "parameters": model.config.num_parameters(), "vocabulary": tok.vocab_size}
    if loads is True:
        report.summary["llama.cpp loads it"] = True
    elif loads is not None:
        report.notes.append(f"not checked in llama.cpp: {loads}")
    if gguf.stem != label:
        report.notes.append(f"profiles name this draft {label!r} (general.name); the file stem is {gguf.stem!r}, "
                            f"which is what --draft FILE reports: name the file {label}.gguf to keep them equal")
    report.data = {"source": str(src), "output": str(gguf), "name": label, **info, "outtype": outtype,
                   "parameters": model.config.num_parameters(), "vocabulary": tok.vocab_size,
                   "llama_cpp_loads": True if loads is True else None,  # None: not checked (--no-check, or why)
                   **({"not_checked": loads} if isinstance(loads, str) else {})}
    render(report, as_json)


def _llamacpp_loads(tmp: Path, gguf: Path) -> bool | str:
    """Load the written ``tmp`` in llama.cpp: True when it loads, the reason when llama-cpp-python is not
    installed (nothing to check with). Raises EngineError, naming ``gguf``, when llama.cpp refuses the file."""
    from ..engines import EngineError
    from ..engines.llamacpp import check_gguf
    from ..errors import EngineNotInstalled

    try:
        check_gguf(tmp)
        return True
    except EngineNotInstalled as err:
        return str(err)
    except EngineError as err:
        raise EngineError(str(err).replace(str(tmp), str(gguf))) from None


# ---------------------------------------------------------------------------------------------- profile latency
def profile_latency_engine(engine: str, *, target: Optional[Path], draft: Optional[str], context: str,
                           max_tokens: int, max_draft_tokens: Optional[int], repeats: int, rounds: int,
                           paired: bool, threads: Optional[int], output: Optional[Path], as_json: bool,
                           other: dict[str, Any], loop: bool = True) -> None:
    """``treeopt profile latency --engine ENGINE`` for an engine other than treeopt's decoder (llama.cpp: with
    ``loop``, its chain steps timed through the decoding loop too)."""
    import os

    from ..engines import engine_name, require_engine
    from .common import _csv_ints

    name = engine_name(engine)
    given = [k for k, v in other.items() if v]
    if given:
        hint = ("; for T(b, n) through llama.cpp's batch API: treeopt tune --engine llama.cpp --batches 1,2,4"
                if "--batch" in given and name == "llama.cpp" else "")
        raise TreeoptError(f"--engine {name} times its own forward: drop {', '.join(given)} (treeopt's decoder "
                           f"options){hint}")
    contexts = _csv_ints(context, "--context")
    max_draft_tokens_given = max_draft_tokens is not None
    max_draft_tokens = 64 if max_draft_tokens is None else max_draft_tokens
    if max_tokens < 1 or max_draft_tokens < 1 or repeats < 1 or rounds < 1:
        raise TreeoptError("--max-tokens, --max-draft-tokens, --max-repeats and --rounds must be at least 1")
    if threads is not None and threads < 1:
        raise TreeoptError("--threads must be at least 1")
    if name in ("sglang", "vllm"):
        # the engines run their drafters inside the step (no c(w) of their own to time), on their own threads, and
        # have no decoding loop of treeopt's to time: these options would be accepted and change nothing
        dropped = [flag for flag, v in (("--draft", draft is not None), ("--max-draft-tokens", max_draft_tokens_given),
                                        ("--threads", threads is not None), ("--no-loop", not loop)) if v]
        if dropped:
            raise TreeoptError(f"--engine {name} times the target's forward only: drop {', '.join(dropped)} (profile "
                               "a draft model as its own --target to get its c(w))")
        profile_gpu_cli(name, target=target, contexts=contexts, max_tokens=max_tokens, repeats=repeats,
                        rounds=rounds, paired=paired, output=output, as_json=as_json)
        return
    require_engine(name)  # one line with the install command when missing, before anything loads
    from ..engines.llamacpp import profile_latency, resolve_pair
    from ..profiles import save_latency
    from ..device import device_slug
    from ..profiling.timing import token_grid

    check_output(output, {"--target": target, "--draft": draft})
    n_threads = threads or os.cpu_count() or 1
    grid, dgrid = token_grid(max_tokens), token_grid(max_draft_tokens)
    with tempfile.TemporaryDirectory(prefix="treeopt-gguf-") as tmp:
        pair = resolve_pair(target, draft, Path(tmp))
        with progress_bar() as progress:
            curve = profile_latency(pair.target, pair.draft, contexts=contexts, token_counts=grid,
                                    draft_token_counts=dgrid, n_threads=n_threads, rounds=rounds, paired=paired,
                                    max_repeats=repeats, progress=progress, target_name=pair.target_label,
                                    draft_name=pair.draft_label, loop=loop)
    out = output or (Path("profiles") / device_slug("cpu") / f"{pair.target_label}__{pair.draft_label}-llama.cpp-"
                     "latency.yaml")
    save_latency(out, curve)
    report = Report(title=f"treeopt profile latency --engine {name}")
    c0 = contexts[0]
    report.summary = {"engine": curve.engine_info.get("version"), "device": curve.device.get("name"),
                      "threads": n_threads, "target": pair.target_label, "target weights": curve.device.get("dtype"),
                      "draft": pair.draft_label, "c(1) / T(1)": curve.draft_ms(1, c0) / curve.target_ms(1, c0),
                      "step overhead (ms)": curve.step_overhead_ms, "written": str(out)}
    report.tables.append(("target forward, logits for all n positions", ["tokens", "ms", "T(n)/T(1)", "context"],
                          [[n, curve.target_ms(n, c), curve.target_ms(n, c) / curve.target_ms(1, c), c]
                           for c in contexts for n in grid]))
    report.tables.append(("draft cost c(w) (per-level)", ["tokens", "ms", "context"],
                          [[w, curve.draft_ms(w, c), c] for c in contexts for w in dgrid]))
    if curve.has_loop(c0):
        report.tables.append(("the decoding loop's step (a chain of n - 1 drafts; n = 1: plain decoding)",
                              ["tokens", "verify ms", "T(n) ms", "bookkeeping ms", "context"],
                              [[n, curve.step_target_ms(n, c), curve.target_ms(n, c), curve.step_overhead(n, c), c]
                               for c in contexts for n in grid]))
        report.summary["draft extra per forward (ms)"] = curve.draft_extra_ms(c0)
        report.summary["draft extra per step (ms)"] = curve.draft_step_extra_ms(c0)
    report.notes.extend(pair.notes)
    report.data = {"profile": curve.to_dict(), "output": str(out)}
    render(report, as_json)


# ---------------------------------------------------------------------------------------------- solve
def solve_llamacpp(*, acceptance: Optional[list[Path]], latency: Optional[list[Path]], max_depth: Optional[int],
                   context: Optional[int], output: Optional[Path], acceptance_model: str, as_json: bool,
                   other: dict[str, Any]) -> None:
    """``treeopt solve --format llama.cpp``: the hardware-aware chain (a tree of width 1) on the latency curve,
    as llama.cpp's speculative flags, with the predicted speedup and every draft length scored."""
    from .._io import atomic_write_text
    from ..engines import engine_mismatch
    from ..engines.llamacpp import chain_flags, lookup_flags, solve_chain
    from ..errors import SolverError
    from ..profiles import load_acceptance, load_latency, warn_on_mismatch
    from ..solver.depth import check_acceptance_model

    given = [k for k, v in other.items() if v]
    if given:
        raise SolverError(f"--format llama.cpp solves one drafter's chain: drop {', '.join(given)}")
    if not acceptance or len(acceptance) != 1 or not latency or len(latency) != 1:
        raise SolverError("--format llama.cpp needs one -a acceptance profile and one -l latency profile (the "
                          "chain is chosen on the curve: treeopt profile latency --engine llama.cpp)")
    max_draft = 16 if max_depth is None else max_depth
    if max_draft < 1:
        raise SolverError(f"--max-depth (the longest draft) must be at least 1, got {max_draft}")
    if context is not None and context < 0:
        raise SolverError(f"--context must be a number of tokens >= 0, got {context}")
    check_acceptance_model(acceptance_model)
    if output is not None:
        _check_writable(output)
    acc, curve = load_acceptance(acceptance[0]), load_latency(latency[0])
    report = Report(title="treeopt solve --format llama.cpp")
    report.warnings = warn_on_mismatch(acceptance=acc, latency=curve)
    w = engine_mismatch(curve, "llama.cpp", what="--format llama.cpp")
    if w:
        report.warnings.append(w)
    ch = solve_chain(acc, curve, max_draft=max_draft, context=context, acceptance_model=acceptance_model)
    drafter = str(acc.measured.get("draft") or curve.model.get("draft") or "")
    spec = _profiled_drafter(drafter)
    if spec is not None and spec.entry.engine_methods.get("llama.cpp") == "ngram-simple":
        n = int(spec.lookup_max)
        text = lookup_flags(n, ch.setting.n_max) if ch.setting.n_max else chain_flags(ch.setting)
        report.notes.append(f"prompt lookup {drafter}: llama.cpp's ngram-simple matches one n-gram size; "
                            f"size-n {n} (the longest of {drafter}), size-m the chain length")
    else:
        text = chain_flags(ch.setting)
    if ch.setting.n_max == 0:
        report.notes.append("no draft length pays on this curve: run llama.cpp without speculative decoding")
    ctx = context if context is not None else int(curve.contexts[0])
    report.summary = {"acceptance profile": acc.id, "latency profile": curve.id, "engine": curve.engine,
                      "drafter": drafter or None, "acceptance model": ch.acceptance_model, "context (tokens)": ctx,
                      "draft-max": ch.setting.n_max, "draft-min": ch.setting.n_min, "draft-p-min": ch.setting.p_min,
                      "expected tokens / step": ch.expected_tokens, "step cost (ms)": ch.cost_ms,
                      "tokens / s": ch.tokens_per_s, "plain decoding (ms / token)": ch.plain_ms_per_token,
                      "predicted speedup": ch.speedup, "flags": text}
    from ..solver.intervals import spread_metadata
    from ..solver.chains import chain_cost
    from ..tree import Tree

    for r in ch.by_length:  # each length's spread between the profile's prompts, for a new set of as many
        sp = spread_metadata(Tree.chain(r["draft_max"] + 1), acc, ch.acceptance_model,
                             chain_cost(r["draft_max"], r["expected_tokens_per_step"], curve, context))
        r.update(sp)
    pis = [r.get("speedup_spread", {}).get("prediction_interval") for r in ch.by_length]
    report.tables.append(("every draft length on this curve (p-min 0: a fixed-length chain; 95 % PI: a new prompt "
                          "set as large as the profile's)",
                          ["draft-max", "G", "cost ms", "tokens/s", "speedup", "speedup 95% PI"],
                          [[r["draft_max"], r["expected_tokens_per_step"], r["cost_ms"], r["tokens_per_s"],
                            r["speedup"], "-" if pi is None else f"{pi[0]:.3f} to {pi[1]:.3f}"]
                           for r, pi in zip(ch.by_length, pis)]))
    chosen = next(r for r in ch.by_length if r["draft_max"] == ch.setting.n_max)
    if "speedup_spread" in chosen:
        lo, hi = chosen["speedup_spread"]["prediction_interval"]
        report.summary["speedup, 95 % prediction interval"] = (f"{lo:.3f} to {hi:.3f} (a new set of "
                                                                f"{chosen['speedup_spread']['new_prompts']} prompts)")
    report.notes.append("draft-p-min 0 and draft-min 0 make llama.cpp draft exactly draft-max tokens a step, the "
                        "chain this cost model values; older llama.cpp builds spell the flags --draft-max N "
                        "--draft-min M --draft-p-min P; add -md DRAFT.gguf")
    data = {"setting": {"draft_max": ch.setting.n_max, "draft_min": ch.setting.n_min, "draft_p_min": ch.setting.p_min},
            "flags": text, "predicted": {"expected_tokens_per_step": ch.expected_tokens, "cost_ms": ch.cost_ms,
                                         "tokens_per_s": ch.tokens_per_s, "speedup": ch.speedup,
                                         "plain_ms_per_token": ch.plain_ms_per_token},
            "by_length": ch.by_length, "acceptance_profile": acc.id, "latency_profile": curve.id,
            "engine": curve.engine, "context_tokens": ctx}
    if output is not None:
        atomic_write_text(output, text + "\n")
        report.notes.append(f"wrote llama.cpp flags to {output}")
        data["output"] = str(output)
    report.data = data
    if output is None and not as_json:
        render(report, False, console=report_console(stderr=True))
        typer.echo(text)
    else:
        render(report, as_json)


# ---------------------------------------------------------------------------------------------- run
def _profiled_drafter(label: str):
    """The :class:`~sequoia_opt.drafting.registry.DrafterSpec` of a drafter a profile names by its label, when the
    label is a registered kind's text (``lookup:1-3``, ``self:6``); None for a checkpoint's name."""
    from ..drafting.registry import DRAFTERS, parse_drafter_spec

    head = label.partition(":")[0]
    if head not in DRAFTERS or DRAFTERS[head].loads_model:
        return None
    try:
        return parse_drafter_spec(label)
    except TreeoptError:
        return None


def run_llamacpp(*, tree: Optional[list[Path]], target: Optional[Path], draft: Optional[list[str]],
                 prompts: Optional[Path], max_new_tokens: int, num_prompts: Optional[int],
                 acceptance: Optional[list[Path]], latency: Optional[list[Path]], threads: Optional[int],
                 results_dir: Path, as_json: bool, other: dict[str, Any]) -> None:
    """``treeopt run --engine llama.cpp``: plain and chain speculative decoding on llama.cpp through its batch
    API, greedy output checked equal to plain decoding token for token, tokens/s and tokens/step against the
    prediction (with -a and -l)."""
    import json
    import os

    from .._io import create_files, new_run_id
    from ..engines import engine_mismatch, require_engine
    from ..engines.llamacpp import (ChainSetting, LlamaCppModel, parse_setting_file, predict_chain, resolve_pair,
                                    run_settings, server_prompt_ids)
    from ..profiles import load_acceptance, load_latency, warn_on_mismatch
    from ..prompts import demo_prompts_path, load_prompts

    given = [k for k, v in other.items() if v]
    if given:
        raise TreeoptError(f"--engine llama.cpp runs greedy chains: drop {', '.join(given)}")
    if not tree:
        raise TreeoptError("--engine llama.cpp needs --tree FILE: llama.cpp flags (treeopt solve --format llama.cpp -o) "
                           "or a chain tree")
    if draft is not None and len(draft) > 1:
        raise TreeoptError("--engine llama.cpp runs one draft model (one --draft)")
    if draft:  # a feature head is refused before its tree file is read (a tree fixed for nothing)
        from ..engines.llamacpp import check_llamacpp_drafter
        from ..jobs.load import parse_drafter_spec

        check_llamacpp_drafter(parse_drafter_spec(draft[0]))
    if max_new_tokens < 1:
        raise TreeoptError("--max-new-tokens must be at least 1")
    if threads is not None and threads < 1:
        raise TreeoptError("--threads must be at least 1")
    for opt, v in (("--acceptance", acceptance), ("--latency", latency)):
        if v is not None and len(v) > 1:
            raise TreeoptError(f"{opt} once: the profile of this pair on llama.cpp")
    settings = [(p.stem, parse_setting_file(p)) for p in tree]
    acc = load_acceptance(acceptance[0]) if acceptance else None
    curve = load_latency(latency[0]) if latency else None
    # the predictions read only the profiles: a setting they cannot price is refused before any decoding
    preds = ([predict_chain(st, acc, curve) for st in [ChainSetting(0)] + [st for _, st in settings]]
             if (acc is not None and curve is not None) else [None] * (1 + len(settings)))
    require_engine("llama.cpp")
    plist = load_prompts(prompts if prompts is not None else demo_prompts_path("eval"), limit=num_prompts)
    n_threads = threads or os.cpu_count() or 1
    report = Report(title="treeopt run --engine llama.cpp")
    if curve is not None:
        w = engine_mismatch(curve, "llama.cpp", what="run --engine llama.cpp")
        if w:
            report.warnings.append(w)
    with tempfile.TemporaryDirectory(prefix="treeopt-gguf-") as tmp, progress_bar() as progress:
        pair = resolve_pair(target, draft[0] if draft else None, Path(tmp))
        report.warnings.extend(warn_on_mismatch(acceptance=acc, latency=curve, target=pair.target_label,
                                                draft=pair.draft_label))
        from ..model.loaders import load_tokenizer

        tok = load_tokenizer(pair.target)  # its EOS set; refusals name the file (run reads two GGUFs)
        # llama.cpp's tokens, as llama-server makes them: BOS where the file adds it, even when a chat template does
        # not write it (treeopt's encode_chat adds none)
        ids = server_prompt_ids(pair.target, plist, model=pair.target_label)
        n_ctx = max(len(i) for i in ids) + max_new_tokens + max(s.n_max for _, s in settings) + 8
        with LlamaCppModel(pair.target, n_ctx=n_ctx, n_threads=n_threads) as tm, \
                LlamaCppModel(pair.draft, n_ctx=n_ctx, n_threads=n_threads) as dm:
            plain, runs = run_settings(tm, dm, ids, settings, max_new_tokens, eos_ids=tok.eos_ids, progress=progress)
    rows, out_rows = [], []
    from ..solver.intervals import PromptSpread, spread_metadata
    from ..tree import Tree

    for r, pred in zip([plain] + runs, preds):
        speedup = r.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else None
        spread = spread_metadata(Tree.chain(r.setting.n_max + 1), acc, "auto", pred, len(ids)) if pred else {}
        pi = (PromptSpread.from_dict(spread["speedup_spread"]).prediction_interval(len(ids))
              if "speedup_spread" in spread else None)
        rows.append([r.name, r.setting.n_max, r.setting.n_min, r.setting.p_min, r.tokens_per_s, speedup,
                     r.tokens_per_step, pred.expected_tokens if pred else None, pred.speedup if pred else None,
                     "-" if pi is None else f"{pi[0]:.3f} to {pi[1]:.3f}", "yes" if r.equal else "NO"])
        out_rows.append({"name": r.name, "draft_max": r.setting.n_max, "draft_min": r.setting.n_min,
                         "draft_p_min": r.setting.p_min, "tokens": r.tokens, "steps": r.steps,
                         "decode_ms": r.decode_ms, "draft_ms": r.draft_ms, "verify_ms": r.verify_ms,
                         "bookkeeping_ms": r.bookkeeping_ms, "tokens_per_s": r.tokens_per_s, "speedup": speedup,
                         "tokens_per_step": r.tokens_per_step,
                         "per_prompt_tokens_per_step": r.per_prompt_tokens_per_step,
                         "predicted_tokens_per_step": pred.expected_tokens if pred else None,
                         "predicted_speedup": pred.speedup if pred else None,
                         "predicted_speedup_interval": list(pi) if pi else None, "equal_to_plain": r.equal})
    report.summary = {"engine": "llama.cpp", "target": pair.target_label, "draft": pair.draft_label,
                      "threads": n_threads, "prompts": len(ids), "new tokens / prompt": max_new_tokens,
                      "plain tokens / s": plain.tokens_per_s,
                      "greedy equal to plain": all(r.equal for r in runs)}
    report.tables.append(("llama.cpp: plain and chain speculative decoding (decode time, prefill excluded)",
                          ["setting", "draft-max", "draft-min", "p-min", "tokens/s", "speedup", "tokens/step",
                           "predicted tokens/step", "predicted speedup", "speedup 95% PI", "= plain"], rows))
    report.notes.extend(pair.notes)
    if acc is None or curve is None:
        report.notes.append("no prediction: pass -a (acceptance) and -l (a llama.cpp latency profile)")
    if not all(r.equal for r in runs):
        report.warnings.append("a chain's greedy output differs from plain decoding (see '= plain'): llama.cpp's "
                               "batched and single-token forwards round differently where two logits tie")
    run_id = new_run_id("llamacpp")
    doc = {"format": "treeopt-run-llamacpp/1", "engine": "llama.cpp", "target": pair.target_label,
           "draft": pair.draft_label, "threads": n_threads, "prompts": str(prompts or demo_prompts_path("eval")),
           "num_prompts": len(ids), "max_new_tokens": max_new_tokens,
           "acceptance_profile": acc.id if acc else None, "latency_profile": curve.id if curve else None,
           "runs": out_rows}
    (path,) = create_files({Path(results_dir) / f"{run_id}.json": json.dumps(doc, indent=2) + "\n"})
    report.notes.append(f"wrote {path}")
    report.data = {**doc, "output": str(path)}
    render(report, as_json)


# ---------------------------------------------------------------------------------------------- GPU engines
def profile_gpu_cli(name: str, *, target: Optional[Path], contexts: list[int], max_tokens: int, repeats: int,
                    output: Optional[Path], as_json: bool, rounds: int = 3, paired: bool = True) -> None:
    """``treeopt profile latency --engine sglang|vllm``: refuse before anything loads (the engine missing: its
    install command; no CUDA; no --target), then profile and write (``--rounds``, ``--paired`` as for treeopt's
    decoder)."""
    import torch

    from ..engines import EngineError, require_engine
    from ..engines.gpu import _check_contexts, profile_gpu
    from ..profiles import save_latency
    from ..profiling.timing import token_grid
    from ..report import Report

    require_engine(name)
    if not torch.cuda.is_available():
        raise EngineError(f"--engine {name} profiles a CUDA GPU and torch sees none here")
    if target is None:
        raise EngineError(f"--engine {name} needs --target: a Hugging Face model folder (or hub name the engine "
                          "resolves locally)")
    _check_contexts(contexts)
    # -o before the engine loads the model (the default path names the GPU, known only once the engine ran)
    check_output(output, {"--target": target})
    grid = token_grid(max_tokens)
    curve = profile_gpu(name, str(target), contexts=contexts, token_counts=grid, max_repeats=repeats, rounds=rounds,
                        paired=paired)
    out = output or Path("profiles") / curve.id.split("_")[0] / f"{Path(str(target)).name}-{name}-latency.yaml"
    save_latency(out, curve)
    report = Report(title=f"treeopt profile latency --engine {name}")
    report.summary = {"engine": curve.engine_info.get("version"), "device": curve.device.get("name"),
                      "written": str(out)}
    report.tables.append(("target forward", ["tokens", "ms", "T(n)/T(1)", "context"],
                          [[n, curve.target_ms(n, c), curve.target_ms(n, c) / curve.target_ms(1, c), c]
                           for c in contexts for n in grid]))
    report.data = {"profile": curve.to_dict(), "output": str(out)}
    render(report, as_json)
