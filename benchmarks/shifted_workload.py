"""A workload that moved (issue 31): the tree solved from a code profile, run on prose, with and without the guard.

The demo pair on this CPU. A code acceptance profile (the shipped profile prompts, kept per prompt) and a prose
one (the first half of ``benchmarks/data/prose-moby-dick.jsonl``, Moby-Dick, public domain); each gives its
hardware-aware tree (``plan_drafter``, one latency profile with the loop's own step). On the other half of the
prose prompts, in one ``run_trees`` call (one plain baseline, the same prompts):

* the code tree, static (what a user who profiled code and serves prose runs);
* the prose-profiled tree, static (what profiling the right traffic gives);
* the code tree adapted and guarded (``run --adapt``'s default now: re-solved every 16 steps from the last 64,
  and when the live tokens per step leaves the code profile's prediction interval, solved from the live lower
  bounds, plain decoding when no tree beats it);
* the code tree adapted without the guard (the adaptive policy before issue 31), for contrast.

Goal (issue 31): the guarded run within 5 % of the better of plain decoding and the prose-profiled tree. Prints a
table (with the guard's log: when and why the tree changed) and writes ``results/shifted/<run-id>.json``::

    flock /tmp/treeopt-bench.lock python benchmarks/shifted_workload.py [--latency LAT.yaml]   # ~8 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sequoia_opt.omp import apply_default  # noqa: E402

apply_default()  # as the treeopt command: threads sleep unless OMP_WAIT_POLICY is set
PROSE = ROOT / "benchmarks/data/prose-moby-dick.jsonl"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--latency", type=Path, help="reuse this latency profile (e.g. prediction_splits.py's)")
    ap.add_argument("--code-prompts", type=int, default=None, help="code profile prompts (default 20; quick 3)")
    ap.add_argument("--prose-prompts", type=int, default=None, help="prose prompts, half profile half run "
                    "(default 24; quick 4)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per prompt (default 40; quick 12)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=ROOT / "results/shifted")
    args = ap.parse_args(argv)

    import torch

    from sequoia_opt._io import create_files, new_run_id
    from sequoia_opt.drafting.policies import AdaptiveTreePolicy, TreeAdapter
    from sequoia_opt.jobs.compare import plan_drafter
    from sequoia_opt.jobs.load import load_pair, parse_device, parse_dtype
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.profiles import load_latency, save_acceptance, save_latency
    from sequoia_opt.profiling.acceptance import build_acceptance_profile, measure_acceptance
    from sequoia_opt.profiling.latency import build_latency_profile, measure_step_overhead, profile_model
    from sequoia_opt.profiling.steps import static_loop_decoders, time_loop
    from sequoia_opt.profiling.timing import token_grid
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
    from sequoia_opt.tree import now_iso

    n_code = args.code_prompts or (3 if args.quick else 20)
    n_prose = args.prose_prompts or (4 if args.quick else 24)
    new_tokens = args.new_tokens or (12 if args.quick else 40)
    t_all = time.perf_counter()
    load0 = os.getloadavg()[0]
    pair = load_pair(None, None, device=parse_device("cpu"), dtype=parse_dtype("float32"))
    eos = sorted(pair.tokenizer.eos_ids)
    ctx = 256

    def progress(what: str, done: int, total: int) -> None:
        if done == total:
            print(f"  {what} ({done}/{total})", file=sys.stderr, flush=True)

    if args.latency is not None:
        curve = load_latency(args.latency)
    else:
        grid = token_grid(args.max_tokens, dense_up_to=8)
        rounds = 1 if args.quick else 3
        tt = profile_model(pair.target, grid, [ctx], rounds=rounds, paired=True, max_repeats=5, warmup=1)
        dt = profile_model(pair.draft, grid, [ctx], what="draft", rounds=rounds, paired=True, max_repeats=5, warmup=1)
        loops = [time_loop(static_loop_decoders(pair.target, pair.draft, max_len=ctx + 2 * args.max_tokens + 16),
                           grid, ctx, pair.target.config.vocab_size, rounds=1 if args.quick else 2)]
        curve = build_latency_profile(
            target_tables=tt, draft_tables=dt, step_overhead_ms=measure_step_overhead(pair.target, pair.draft),
            device="cpu", dtype=torch.float32, target_name=pair.target_name, target_config=pair.target.config,
            draft_name=pair.draft_name, draft_config=pair.draft.config, random_weights=False,
            profile_id="cpu_demo-pair_shifted", loop_tables=loops)

    def profile(ids, label, prompts_file):
        counts = measure_acceptance(pair.target, pair.draft, ids, width=4, depth=4, max_new_tokens=new_tokens,
                                    eos_ids=eos, progress=progress)
        return build_acceptance_profile(counts, profile_id=f"{label}", target_name=pair.target_name,
                                        draft_name=pair.draft_name, temperature=0.0, top_p=1.0, depth=4,
                                        device="cpu", dtype="float32", prompts_file=prompts_file,
                                        num_prompts=len(ids), max_new_tokens=new_tokens, seed=0,
                                        draft_cost_model="per-level")

    code_ids = encode_prompts(load_prompts(demo_prompts_path("profile"), limit=n_code), pair.tokenizer)
    prose = encode_prompts(load_prompts(PROSE, limit=n_prose), pair.tokenizer)
    prose_prof, prose_run = prose[: len(prose) // 2], prose[len(prose) // 2:]
    t0 = time.perf_counter()
    code_acc = profile(code_ids, "code", "sequoia_opt/data/prompts/profile.jsonl")
    prose_acc = profile(prose_prof, "prose", f"{PROSE.name} (first half)")
    t_acc = time.perf_counter() - t0
    kw = dict(budget=min(args.max_tokens, curve.max_target_tokens(ctx)), max_depth=8, max_branching=4, context=ctx)
    code_plan = plan_drafter(pair.draft_name, "per-level", code_acc, curve, name="code tree", **kw)
    prose_plan = plan_drafter(pair.draft_name, "per-level", prose_acc, curve, name="prose tree", **kw)

    def adapted(name: str, guard: bool) -> TreeEntry:
        adapter = TreeAdapter(code_plan.tree, code_acc.acceptance, curve, budget=kw["budget"], max_depth=8,
                              max_branching=4, context=ctx, profile=code_acc, guard=guard)
        return TreeEntry(name, code_plan.tree, code_plan.metadata, policy=lambda d, a=adapter: AdaptiveTreePolicy(d, a))

    entries = [e for e in (code_plan.entry(None), prose_plan.entry(None)) if e.tree.size > 1]  # root alone = plain
    if code_plan.tree.size > 1:
        entries += [adapted("code tree, adaptive + guard", True), adapted("code tree, adaptive, no guard", False)]
    t0 = time.perf_counter()
    run = run_trees(pair.target, pair.new_drafter, entries, prose_run, max_new_tokens=new_tokens, eos_ids=eos,
                    progress=progress)
    t_run = time.perf_counter() - t0
    by = {s.tree: s for s in run.summaries}
    prose_speedup = by["prose tree"].speedup if "prose tree" in by else 1.0
    best = max(1.0, prose_speedup)
    guarded = by.get("code tree, adaptive + guard")
    rows = []
    for s in run.summaries:
        rows.append({"name": s.tree, "nodes": s.size, "speedup": s.speedup, "tokens_per_step": s.tokens_per_step,
                     "predicted_tokens_per_step": s.predicted_tokens_per_step,
                     "predicted_interval": s.predicted_interval, "inside_prediction": s.inside_prediction,
                     "adaptive": s.adaptive})
        print(f"{s.tree:32} nodes {s.size:3}  tokens/step {s.tokens_per_step:6.3f}  speedup {s.speedup:6.3f}"
              + (f"  predicted {s.predicted_tokens_per_step:6.3f}" if s.predicted_tokens_per_step else "")
              + (f"  PI {s.predicted_interval[0]:.2f}-{s.predicted_interval[1]:.2f} "
                 f"{'in' if s.inside_prediction else 'OUT'}" if s.predicted_interval else ""))
        if s.adaptive:
            for r in s.adaptive["resolves"]:
                if r["changed"] or r["reason"] != "scheduled":
                    live = (f" live {r['live_tokens_per_step']:.2f} vs {r['interval'][0]:.2f}-{r['interval'][1]:.2f}"
                            if r["live_tokens_per_step"] is not None else "")
                    print(f"    step {r['step']:4} prompt {r['generation']:2}: {r['reason']:30} -> {r['size']:2} nodes"
                          f"{live}")
    goals = {"best_of_plain_and_prose_tree": best, "guarded_speedup": guarded.speedup if guarded else None,
             "guarded_over_best": (guarded.speedup / best) if guarded else None,
             "guarded_within_5pct": (guarded.speedup >= 0.95 * best) if guarded else None,
             "code_tree_static_speedup": by["code tree"].speedup if "code tree" in by else None,
             "greedy_equal": run.greedy_ok}
    print(json.dumps(goals, indent=1))
    run_id = new_run_id(None)
    doc = {"format": "treeopt-bench-shifted/1", "run_id": run_id, "date": now_iso(),
           "command": "flock /tmp/treeopt-bench.lock python benchmarks/shifted_workload.py"
           + (f" --latency {args.latency}" if args.latency else "") + (" --quick" if args.quick else ""),
           "threads": torch.get_num_threads(), "load_avg_1min_start": load0, "load_avg_1min_end": os.getloadavg()[0],
           "code_prompts": len(code_ids), "prose_profile_prompts": len(prose_prof), "prose_run_prompts": len(prose_run),
           "new_tokens": new_tokens, "latency_profile": curve.id, "code_tree": code_plan.tree.choices(),
           "prose_tree": prose_plan.tree.choices(),
           "code_prediction": code_plan.metadata.to_dict(), "prose_prediction": prose_plan.metadata.to_dict(),
           "rows": rows, "goals": goals,
           "wall_s": {"acceptance": t_acc, "runs": t_run, "total": time.perf_counter() - t_all}}
    out = args.out / f"{run_id}.json"
    save_acceptance(args.out / run_id / "acceptance-code.yaml", code_acc)  # the record comes last
    save_acceptance(args.out / run_id / "acceptance-prose.yaml", prose_acc)
    if args.latency is None:
        save_latency(args.out / run_id / "latency.yaml", curve)
    create_files({out: json.dumps(doc, indent=1, default=float) + "\n"})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
