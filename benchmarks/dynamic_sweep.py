"""Every dynamic setting at one budget, measured: is any dynamic tree worth +10 % tokens/step over the static DP
tree at the same budget (issue 30's goal), or did the calibration predictor only rank them wrongly?

``benchmarks/eagle3.py`` runs the three dynamic settings its calibration predicts best at the static tree's budget.
This script runs *every* setting of the calibration grid at that budget (each policy: EAGLE-2, entropy,
best-first; every steps / topk the recording allows; ``setting_grid``) and the static tree, greedy, on the
*profile* prompts (never the eval prompts, so nothing is chosen on them), and reports each one's tokens/step,
measured and predicted. It reads the profiles a ``benchmarks/eagle3.py`` run saved (``--from``: its run folder,
with ``calibration-eagle3.yaml``, ``latency-eagle3.yaml`` and ``tree-eagle3.yaml``). Tokens/step only (no timing),
so it may share the machine. Prints the table and writes ``results/dynamic_sweep/<run id>.json``::

    python benchmarks/dynamic_sweep.py --from results/eagle3/20261206T020329.256Z-b4305d   # 21 min on 2 shared cores

``--budget N`` asks the same at another budget than the hardware-aware tree's (a dynamic tree has more room to
adapt in a larger one): the static tree there is the exact DP optimum at N nodes under the run's acceptance profile
(``acceptance-eagle3.yaml``) and acceptance model, with the hardware-aware tree's branching limit (Sequoia, section
3.1; no cost model: the budget is fixed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sequoia_opt.omp import apply_default  # noqa: E402

apply_default()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="run", type=Path, required=True, help="a benchmarks/eagle3.py run folder")
    ap.add_argument("--head", default="eagle3", help="the --draft text of the head (default: the shipped one)")
    ap.add_argument("--num-prompts", type=int, default=12, help="profile prompts")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--budget", type=int, default=None,
                    help="nodes per step (default: the hardware-aware tree's); the static tree is the DP optimum there")
    ap.add_argument("--out", type=Path, default=ROOT / "results/dynamic_sweep")
    args = ap.parse_args(argv)
    if args.budget is not None and not 2 <= args.budget <= 64:
        print(f"error: --budget {args.budget}: a dynamic tree's budget is 2 to 64 nodes", file=sys.stderr)
        return 2
    files = {k: args.run / f"{k}-eagle3.yaml" for k in ("calibration", "latency", "tree", "acceptance")}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        print(f"error: --from {args.run}: no {', '.join(missing)} (a benchmarks/eagle3.py run folder has them)",
              file=sys.stderr)
        return 2

    import torch

    from sequoia_opt._io import create_run_record
    from sequoia_opt.decoding import Decoder
    from sequoia_opt.drafting.policies import DynamicPolicy, StaticTreePolicy
    from sequoia_opt.jobs.load import load_drafters
    from sequoia_opt.profiles import load_acceptance, load_latency
    from sequoia_opt.profiles.calibration import load_calibration
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
    from sequoia_opt.solver.depth import solve_profile
    from sequoia_opt.solver.dynamic import predict_setting, setting_grid
    from sequoia_opt.tree import load_tree, now_iso

    cal, curve = load_calibration(files["calibration"]), load_latency(files["latency"])
    tree, meta = load_tree(files["tree"])
    source = "the hardware-aware tree"
    if args.budget is not None and args.budget != tree.size:
        acc = load_acceptance(files["acceptance"])
        sol, model = solve_profile(acc, args.budget, args.budget - 1, int(meta.extra.get("max_branching", 32)),
                                   str(meta.extra.get("acceptance_model", "auto")))
        tree, source = sol.tree(args.budget), f"the DP optimum at {args.budget} nodes ({model} acceptance)"
    budget = tree.size
    pair, = load_drafters(None, [args.head], device=torch.device("cpu"), dtype=torch.float32)
    ids = encode_prompts(load_prompts(demo_prompts_path("profile"), limit=args.num_prompts), pair.tokenizer,
                         model=pair.target_name)
    eos = sorted(pair.tokenizer.eos_ids)

    def tokens_per_step(policy) -> float:
        dec = Decoder(pair.target, policy, eos_ids=eos, max_len=1024)
        tokens = steps = 0
        with torch.inference_mode():
            for p in ids:
                r = dec.generate(p, args.new_tokens)
                tokens += sum(s.accepted_nodes + 1 for s in r.steps)
                steps += len(r.steps)
        return tokens / steps

    static = tokens_per_step(StaticTreePolicy(pair.new_drafter(), tree, cut_at_answer_end=False))
    print(f"static DP tree ({budget} nodes, {source}): {static:.3f} tokens/step", flush=True)
    rows = []
    for s in setting_grid(cal, budgets=(budget,)):
        if s.budget != budget:
            continue
        pred = predict_setting(cal, s, curve, context=256).tokens_per_step
        got = tokens_per_step(DynamicPolicy(pair.new_drafter(), s, name=pair.draft_name, cut_at_answer_end=False))
        rows.append({"setting": s.label, "predicted_tokens_per_step": pred, "tokens_per_step": got,
                     "over_static": got / static})
        print(f"{s.label:<24} predicted {pred:.3f}  measured {got:.3f}  {got / static:.3f}x static", flush=True)
    best = max(rows, key=lambda r: r["tokens_per_step"])
    top = max(rows, key=lambda r: r["predicted_tokens_per_step"])
    print(f"best measured: {best['setting']} {best['over_static']:.3f}x the static tree; the predictor's first: "
          f"{top['setting']} {top['over_static']:.3f}x")
    doc = {"format": "treeopt-bench-dynamic-sweep/1", "date": now_iso(), "from": str(args.run), "head": args.head,
           "prompts": "sequoia_opt/data/prompts/profile.jsonl", "num_prompts": len(ids), "new_tokens": args.new_tokens,
           "budget": budget, "static_tree": tree.choices(), "static_tree_source": source, "static_tokens_per_step": static, "settings": rows,
           "best_measured": best, "best_predicted": top,
           "command": " ".join(["python benchmarks/dynamic_sweep.py", *(argv if argv is not None else sys.argv[1:])])}
    out = create_run_record(args.out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
