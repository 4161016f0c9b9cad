"""What limits the speedup: the solver's predicted best speedup as the draft's acceptance and the device's
latency curve change, from one latency profile and one acceptance profile.

For every scale s in ``--scales`` the acceptance vector becomes ``min(s, 1 / sum(p)) * p`` (same positional
shape, p_1 moved up or down, sum kept <= 1) and the hardware-aware choice (``solver.choose``, Sequoia
section 4.2's cost model: draft forwards per level + T(n) + per-step overhead) is scored on two curves:

* the measured curve (``--latency``);
* a GPU-like curve with the same T(1), draft costs and overhead but flat up to 64 tokens
  (``demo.gpu_like_curve``), i.e. what the same pair would gain if verification of a wider tree were free.

A third column makes the draft free (c(w) = 0) on the measured curve, to separate draft cost from the shape of
T(n). Every figure is a prediction of the cost model, not a measurement; ``treeopt run`` measures. Prints a
table and writes ``results/speedup_headroom.json`` atomically::

    python benchmarks/speedup_headroom.py --latency profiles/cpu-amd-epyc/SmolLM2-135M-Instruct.Q4_1-latency.yaml \\
        --acceptance profiles/SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft/acceptance-greedy.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sequoia_opt._io import atomic_write_text
from sequoia_opt.jobs.demo import gpu_like_curve
from sequoia_opt.profiles import LatencyCurve, load_acceptance, load_latency
from sequoia_opt.solver import choose
from sequoia_opt.tree import now_iso


def free_draft_curve(curve: LatencyCurve, context: int | None) -> LatencyCurve:
    """The measured T(n) and overhead with a draft that costs nothing (c(w) = 0 ms for every measured w)."""
    target = {int(n): curve.target_ms(int(n), context) for n in curve.target_tokens(context)}
    draft = {w: 0.0 for w in range(1, curve.max_draft_tokens(context) + 1)}
    return LatencyCurve.synthetic(target, draft, step_overhead_ms=curve.step_overhead_ms, id="free-draft")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=Path, required=True, help="treeopt-latency/1 profile")
    ap.add_argument("--acceptance", type=Path, required=True, help="treeopt-acceptance/1 profile")
    ap.add_argument("--budget", type=int, default=64, help="largest tree considered (nodes, root included)")
    ap.add_argument("--max-depth", type=int, default=10)
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0])
    ap.add_argument("--out", type=Path, default=Path("results/speedup_headroom.json"))
    args = ap.parse_args()

    curve = load_latency(args.latency)
    acc = load_acceptance(args.acceptance)
    p0 = np.asarray(acc.acceptance, dtype=np.float64)
    context = None  # the smallest measured context, as `treeopt solve` does by default
    budget = min(args.budget, curve.max_target_tokens(context))
    curves = {"measured": curve, "gpu_like": gpu_like_curve(curve, context), "free_draft": free_draft_curve(curve, context)}
    rows = []
    print(f"{'scale':>6} {'p_1':>6} {'sum p':>6} | " + " | ".join(f"{k:>22}" for k in curves))
    for s in args.scales:
        p = p0 * min(s, 1.0 / max(p0.sum(), 1e-12))
        row = {"scale": s, "p1": float(p[0]), "sum_p": float(p.sum())}
        cells = []
        for name, c in curves.items():
            ch = choose(p, c, budget, args.max_depth, context=context)
            row[name] = {"speedup": float(ch.speedup), "nodes": int(ch.tree.size), "depth": int(ch.tree.depth.max()),
                         "tokens_per_step": float(ch.expected_tokens)}
            cells.append(f"{ch.speedup:5.2f}x n={ch.tree.size:<3d} G={ch.expected_tokens:4.2f}")
        rows.append(row)
        print(f"{s:6.2f} {p[0]:6.3f} {p.sum():6.3f} | " + " | ".join(f"{x:>22}" for x in cells))
    doc = {"benchmark": "speedup_headroom", "date": now_iso(), "latency": str(args.latency),
           "acceptance": str(args.acceptance), "budget": budget, "max_depth": args.max_depth,
           "T1_ms": float(curve.target_ms(1, context)),
           "step_overhead_ms": float(curve.step_overhead_ms), "draft_c1_ms": float(curve.draft_ms(1, context)), "rows": rows}
    print(f"wrote {atomic_write_text(args.out, json.dumps(doc, indent=2) + chr(10))}")


if __name__ == "__main__":
    main()
