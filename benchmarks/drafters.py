"""Every shipped drafter on the demo pair, this device: profile -> solve -> run, predicted against measured.

Runs the demo pipeline (``sequoia_opt.jobs.demo.run_demo``: the target's T(n) timed once; per drafter its c(w) in
its own cost model, its greedy acceptance on the *profile* prompts, its hardware-aware tree; then one
``run_trees`` call on the held-out *eval* prompts (Python source: code) with one plain baseline) and reports,
per drafter (the bundled draft model, prompt lookup, self:L at the sweep's best L):

* its acceptance vector (pooled, and per depth) and the acceptance model the solver used;
* c(1) / T(1);
* the chosen tree (nodes, depth, level widths);
* predicted vs measured tokens per step (and the relative error; for comparison, the same tree's prediction
  under the pooled, positional vector) and predicted vs measured speedup over plain decoding;
* tokens/s, and whether greedy output equalled plain decoding on every prompt.

Speeds are ratios against the plain baseline of the same run (a shared machine drifts; never compare absolute
tokens/s across runs). Prints a markdown table and writes ``results/drafters/<date>.json`` (and the demo's
files under ``results/drafters/<date>/``) atomically::

    python benchmarks/drafters.py                    # ~10 min on 2 CPU cores
    python benchmarks/drafters.py --quick            # smoke test, ~1.5 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sequoia_opt._io import create_files, new_run_id
from sequoia_opt.jobs.demo import DemoSettings, run_demo
from sequoia_opt.profiles import load_acceptance
from sequoia_opt.tree import load_tree, now_iso


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the demo's --quick sizes (smoke test)")
    ap.add_argument("--num-prompts", type=int, default=None, help="eval prompts (default: the demo's 6)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per eval prompt (default 64)")
    ap.add_argument("--self-layers", default=None, help="L values swept for self:L, comma-separated "
                    "(default: 3 spread over 1..n_layers-1)")
    ap.add_argument("--self-check", type=int, default=None, metavar="L",
                    help="also test the tokens/step prediction of self:L on trees of 4 and 8 nodes, whether or not "
                    "they pay off on this device (default: the largest L swept)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("results/drafters"))
    ap.add_argument("--self-check-only", action="store_true", help="run only the --self-check measurement")
    args = ap.parse_args(argv)
    if args.self_check_only:
        if not args.self_check:
            ap.error("--self-check-only needs --self-check L")
        s = DemoSettings.quick() if args.quick else DemoSettings()
        rows = self_check(args.self_check, s, num_prompts=args.num_prompts or s.num_prompts,
                          max_new_tokens=args.max_new_tokens or s.max_new_tokens, device=args.device)
        (path,) = create_files({args.out / f"{new_run_id(None)}-self-check.json": json.dumps(
            {"format": "treeopt-bench-drafters-self/1", "self_check": rows}, indent=1) + "\n"})
        _print_self_check(rows)
        print(f"wrote {path}")
        return 0 if all(r["equals_plain"] for r in rows) else 1

    settings = DemoSettings.quick() if args.quick else DemoSettings()
    # the demo compares self:L only when asked; this benchmark always does
    settings.self_layers = tuple(int(x) for x in args.self_layers.split(",")) if args.self_layers else "auto"
    stamp = new_run_id(None)  # unique: two runs never share a folder or a results file
    out_dir = args.out / stamp

    def progress(what: str, done: int, total: int) -> None:
        if done == 1 or done == total:
            print(f"  {what} ({done}/{total})", file=sys.stderr, flush=True)

    result = run_demo(device=args.device, out_dir=out_dir, settings=settings, num_prompts=args.num_prompts,
                      max_new_tokens=args.max_new_tokens, progress=progress)
    plain = result.run.summaries[0]
    rows = []
    for r in result.drafters:
        acc = load_acceptance(result.files[_file_key(result.files, "acceptance", r.drafter)])
        tree, _ = load_tree(result.files[_file_key(result.files, "tree", r.drafter)])
        rows.append({
            "drafter": r.drafter, "cost_model": r.cost_model, "acceptance_model": r.acceptance_model,
            "acceptance": [round(float(x), 4) for x in acc.acceptance],
            "acceptance_by_depth": {int(d): [round(float(x), 4) for x in v] for d, v in acc.by_depth.items()},
            "positional_consistent": acc.positional_consistent, "acceptance_trials": acc.num_samples,
            "c1_over_T1": r.c1_over_t1, "nodes": r.nodes, "depth": r.depth, "level_widths": r.level_widths,
            "predicted_tokens_per_step": r.predicted_tokens_per_step,
            "predicted_tokens_per_step_positional": tree.expected_tokens(acc.acceptance),
            "tokens_per_step": r.tokens_per_step, "tps_ci95": list(r.tps_ci95),
            "tokens_per_step_error": r.predicted_tokens_per_step / r.tokens_per_step - 1 if r.tokens_per_step else None,
            "predicted_speedup": r.predicted_speedup, "speedup": r.speedup, "tokens_per_s": r.tokens_per_s,
            "equals_plain": r.equals_plain,
        })
    by = {r["drafter"].split(":")[0]: r for r in rows}
    doc = {"format": "treeopt-bench-drafters/1", "date": now_iso(), "settings": result.run.settings,
           "plain_tokens_per_s": plain.tokens_per_s, "drafters": rows,
           "lookup_over_draft_model_tokens_per_s": (by["lookup"]["tokens_per_s"] / rows[0]["tokens_per_s"]
                                                    if "lookup" in by and rows[0]["tokens_per_s"] else None),
           "greedy_ok": result.greedy_ok, "files": result.files}
    L = args.self_check or max(int(r["L"]) for r in result.report.data.get("self_sweep") or [{"L": 0}])
    if L >= 1:
        doc["self_check"] = self_check(L, settings, num_prompts=result.run.settings.get("num_prompts"),
                                       max_new_tokens=result.run.settings.get("max_new_tokens"), device=args.device)
    (path,) = create_files({args.out / f"{stamp}.json": json.dumps(doc, indent=1) + "\n"})

    print(f"plain decoding {plain.tokens_per_s:.2f} tokens/s; "
          f"{result.run.settings.get('num_prompts')} eval prompts x {result.run.settings.get('max_new_tokens')} tokens")
    print("| drafter | cost model | acc. model | p (pooled) | c(1)/T(1) | tree (widths) | tokens/step pred. "
          "(positional) / measured [95% CI] | speedup pred. / measured | tokens/s | = plain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["tps_ci95"]
        print(f"| {r['drafter']} | {r['cost_model']} | {r['acceptance_model']} | "
              f"{', '.join(f'{x:.2f}' for x in r['acceptance'][:4])} | {r['c1_over_T1']:.3f} | "
              f"{r['nodes']} ({' '.join(map(str, r['level_widths']))}) | {r['predicted_tokens_per_step']:.2f} "
              f"({r['predicted_tokens_per_step_positional']:.2f}) / {r['tokens_per_step']:.2f} [{lo:.2f}, {hi:.2f}] | "
              f"{r['predicted_speedup']:.2f}x / {r['speedup']:.2f}x | {r['tokens_per_s']:.2f} | "
              f"{'yes' if r['equals_plain'] else 'NO'} |")
    _print_self_check(doc.get("self_check", []))
    if doc["lookup_over_draft_model_tokens_per_s"] is not None:
        print(f"lookup / draft model tokens/s: {doc['lookup_over_draft_model_tokens_per_s']:.2f}")
    print(f"wrote {path}")
    return 0 if result.greedy_ok else 1


def self_check(L: int, settings: DemoSettings, *, num_prompts: int, max_new_tokens: int,
               device: str) -> list[dict]:
    """Predicted against measured tokens/step of ``self:L`` on its DP trees of 4 and 8 nodes (depth <= 4),
    however they compare with plain decoding on this device: the demo runs the hardware-aware choice, which
    can be the root alone, and then says nothing about the acceptance model. Acceptance on the demo's profile
    prompts (its ``acc_prompts`` x ``acc_new_tokens``, K = 4, depth 4), the run on the same eval prompts."""
    import torch

    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.jobs.load import load_pair
    from sequoia_opt.profiling.acceptance import build_acceptance_profile, measure_acceptance
    from sequoia_opt.prompts import demo_prompts_path, load_prompts
    from sequoia_opt.solver.depth import solve_profile
    from sequoia_opt.tree import TreeMetadata

    pair = load_pair(None, f"self:{L}", device=torch.device(device), dtype=torch.float32)
    eos = sorted(pair.tokenizer.eos_ids)
    prof = [pair.tokenizer.encode(p.text) for p in load_prompts(demo_prompts_path("profile"),
                                                               limit=settings.acc_prompts)]
    ev = [pair.tokenizer.encode(p.text) for p in load_prompts(demo_prompts_path("eval"), limit=num_prompts)]
    counts = measure_acceptance(pair.target, pair.new_drafter, prof, width=4, depth=4,
                                max_new_tokens=settings.acc_new_tokens, eos_ids=eos)
    acc = build_acceptance_profile(counts, profile_id=f"self-{L}", target_name=pair.target_name,
                                   draft_name=pair.draft_name, temperature=0.0, top_p=1.0, depth=4, device=device,
                                   dtype="float32", prompts_file="profile", num_prompts=len(prof),
                                   max_new_tokens=settings.acc_new_tokens, seed=0, draft_cost_model="per-level")
    sol, model = solve_profile(acc, 8, 4, 4)
    entries = [TreeEntry(f"self:{L} dp{m}", sol.tree(m, 4),
                         TreeMetadata(expected_tokens_per_step=sol.expected_tokens(m, 4))) for m in (4, 8)]
    run = run_trees(pair.target, pair.new_drafter, entries, ev, max_new_tokens=max_new_tokens, eos_ids=eos)
    out = []
    for e, s in zip(entries, run.summaries[1:]):
        out.append({"L": L, "nodes": e.tree.size, "level_widths": list(e.tree.level_widths),
                    "acceptance": [round(float(x), 4) for x in acc.acceptance], "acceptance_model": model,
                    "predicted": s.predicted_tokens_per_step, "measured": s.tokens_per_step, "ci95": list(s.tps_ci95),
                    "error": s.predicted_tokens_per_step / s.tokens_per_step - 1, "speedup": s.speedup,
                    "equals_plain": s.mismatches == 0})
    return out


def _print_self_check(rows: list[dict]) -> None:
    for r in rows:
        print(f"self:{r['L']} check, tree {r['nodes']} nodes (widths {r['level_widths']}), {r['acceptance_model']}: "
              f"tokens/step predicted {r['predicted']:.3f}, measured {r['measured']:.3f} "
              f"[{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}] ({r['error']:+.1%}); speedup {r['speedup']:.2f}x, = plain: "
              f"{'yes' if r['equals_plain'] else 'NO'}")


def _file_key(files: dict[str, str], kind: str, drafter: str) -> str:
    """The demo's file key for a drafter's profile or tree (``acceptance`` / ``tree`` for the draft model)."""
    from sequoia_opt.jobs.load import drafter_slug

    key = f"{kind}_{drafter_slug(drafter)}"
    return key if key in files else kind


if __name__ == "__main__":
    raise SystemExit(main())
