"""Every shipped drafter on the demo pair, this device: profile -> solve -> run, predicted against measured.

Runs the demo pipeline (``sequoia_opt.demo.run_demo``: the target's T(n) timed once; per drafter its c(w) in
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

from sequoia_opt._io import atomic_write_text
from sequoia_opt.demo import DemoSettings, run_demo
from sequoia_opt.profiles import load_acceptance
from sequoia_opt.tree import load_tree, now_iso


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the demo's --quick sizes (smoke test)")
    ap.add_argument("--num-prompts", type=int, default=None, help="eval prompts (default: the demo's 6)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="tokens per eval prompt (default 64)")
    ap.add_argument("--self-layers", default=None, help="L values swept for self:L, comma-separated "
                    "(default: 3 spread over 1..n_layers-1)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=Path("results/drafters"))
    args = ap.parse_args(argv)

    settings = DemoSettings.quick() if args.quick else DemoSettings()
    if args.self_layers:
        settings.self_layers = tuple(int(x) for x in args.self_layers.split(","))
    stamp = now_iso().replace(":", "").replace("+0000", "Z")
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
    path = atomic_write_text(args.out / f"{stamp}.json", json.dumps(doc, indent=1) + "\n")

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
    if doc["lookup_over_draft_model_tokens_per_s"] is not None:
        print(f"lookup / draft model tokens/s: {doc['lookup_over_draft_model_tokens_per_s']:.2f}")
    print(f"wrote {path}")
    return 0 if result.greedy_ok else 1


def _file_key(files: dict[str, str], kind: str, drafter: str) -> str:
    """The demo's file key for a drafter's profile or tree (``acceptance`` / ``tree`` for the draft model)."""
    from sequoia_opt.pipeline import drafter_slug

    key = f"{kind}_{drafter_slug(drafter)}"
    return key if key in files else kind


if __name__ == "__main__":
    raise SystemExit(main())
