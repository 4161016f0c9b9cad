"""Speculative decoding under each OpenMP wait policy: the demo pair's tree against plain decoding, per policy.

``benchmarks/omp_wait.py`` times one forward per setting; this times what a user runs: ``run_trees`` (plain decoding,
then the draft model's tree, on the same eval prompts, greedy output checked equal) in one process per policy, the
policies alternating over ``--rounds``. Reported per process: plain ms per token, the tree's ms per step (draft,
verify, bookkeeping), tokens per step, and the tree's speedup over plain decoding *in that process*; and the
speedup over the best plain decoder across all processes (what ``treeopt demo``'s headline compares with).

Why it matters: a tree step runs the draft model's forwards, each hundreds of tiny parallel regions; threads that
sleep between regions pay a wake-up at each, threads that spin do not. ``sequoia_opt.omp`` says why the ``treeopt``
command still sleeps by default. Run it on an otherwise idle machine (the spinning figures assume idle cores)::

    flock /tmp/treeopt-bench.lock python benchmarks/omp_decode.py [--rounds 2] [--prompts 6] [--new-tokens 40]

Writes ``results/omp_decode/<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TREE = [[0], [1], [0, 0]]  # the 4-node tree the held-out splits chose on this CPU


def worker(args) -> None:
    """One process under the policy in its environment: print the figures as JSON on the last line."""
    import torch

    from sequoia_opt.jobs.load import load_pair, parse_device, parse_dtype
    from sequoia_opt.jobs.run import TreeEntry, run_trees
    from sequoia_opt.prompts import demo_prompts_path, encode_prompts, load_prompts
    from sequoia_opt.tree import Tree

    torch.set_num_threads(args.threads)
    pair = load_pair(None, None, device=parse_device("cpu"), dtype=parse_dtype("float32"))
    ids = encode_prompts(load_prompts(demo_prompts_path("eval"), limit=args.prompts), pair.tokenizer,
                         model=pair.target_name)
    run = run_trees(pair.target, pair.new_drafter, [TreeEntry("tree", Tree.from_choices(TREE))], ids,
                    max_new_tokens=args.new_tokens, eos_ids=sorted(pair.tokenizer.eos_ids))
    out = {"greedy_equal": run.greedy_ok}
    for name in ("plain", "tree"):
        rows = [r for r in run.rows if r.tree == name]
        steps = sum(r.steps for r in rows)
        out[name] = {"steps": steps, "new_tokens": sum(r.new_tokens for r in rows),
                     **{k: sum(getattr(r, k) for r in rows) / steps
                        for k in ("draft_ms", "verify_ms", "bookkeeping_ms", "decode_ms")},
                     "tokens_per_s": 1000.0 * sum(r.new_tokens for r in rows) / sum(r.decode_ms for r in rows)}
    out["speedup"] = out["tree"]["tokens_per_s"] / out["plain"]["tokens_per_s"]
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", nargs="+", default=["ACTIVE", "PASSIVE"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    runs = []
    for r in range(args.rounds):
        for pol in args.policies:
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env["OMP_WAIT_POLICY"] = pol
            load = os.getloadavg()[0]
            cmd = [sys.executable, __file__, "--worker", "--prompts", str(args.prompts), "--new-tokens",
                   str(args.new_tokens), "--threads", str(args.threads)]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            fig = json.loads(res.stdout.strip().splitlines()[-1])
            runs.append({"round": r + 1, "policy": pol, "load_avg_1min_before": load, **fig})
            print(f"round {r + 1} {pol:>8}: plain {fig['plain']['decode_ms']:.1f} ms/token, tree "
                  f"{fig['tree']['decode_ms']:.1f} ms/step (draft {fig['tree']['draft_ms']:.1f}, verify "
                  f"{fig['tree']['verify_ms']:.1f}), speedup {fig['speedup']:.2f}x, greedy equal "
                  f"{fig['greedy_equal']}", flush=True)
    best_plain = max(x["plain"]["tokens_per_s"] for x in runs)
    summary = {}
    for pol in args.policies:
        mine = [x for x in runs if x["policy"] == pol]
        summary[pol] = {"plain_ms_per_token": statistics.median(x["plain"]["decode_ms"] for x in mine),
                        "tree_ms_per_step": statistics.median(x["tree"]["decode_ms"] for x in mine),
                        "tree_over_plain_step": statistics.median(x["tree"]["decode_ms"] / x["plain"]["decode_ms"]
                                                                  for x in mine),
                        "speedup_in_process": statistics.median(x["speedup"] for x in mine),
                        "tree_over_best_plain": statistics.median(x["tree"]["tokens_per_s"] for x in mine)
                        / best_plain}
    print(json.dumps(summary, indent=1))
    from sequoia_opt._io import create_run_record

    out = create_run_record(ROOT / "results" / "omp_decode", {  # unique: two runs never replace each other
        "command": "flock /tmp/treeopt-bench.lock python benchmarks/omp_decode.py " + " ".join(sys.argv[1:]),
        "tree": TREE, "prompts": args.prompts, "new_tokens": args.new_tokens, "threads": args.threads, "runs": runs,
        "summary": summary})
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
