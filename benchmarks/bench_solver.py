"""Benchmark the Sequoia DP (numba) against the plain-Python reference.

Times ``solve_dp`` for n in {64, 128, 512, 1024, 2048}, D in {8, 16, 32}, B = 32 with a 32-entry decaying
acceptance vector (all entries positive, so no rank is dropped: B_eff = 32), plus n in {1024, 2048}, D = 32
with a "deep" vector (p_1 = 0.9) on which the depth limit binds at every level (the worst case). The first call of the process
(JIT compile or numba cache load) is reported apart; every figure is the median of repeats. The plain-Python
reference runs in the same process where it finishes in reasonable time (always n=128, D=10, B=32), and the
ratio reference / numba is printed. Writes results/bench_solver.json atomically.

    python benchmarks/bench_solver.py [--quick] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from sequoia_opt._io import atomic_write_text
from sequoia_opt.solver.dp import solve_dp
from sequoia_opt.solver.reference import reference_table
from sequoia_opt.tree import now_iso

B = 32


def acceptance_vector() -> np.ndarray:
    """(32,) decaying vector summing to 0.9: p_k proportional to 0.6^k, all positive."""
    p = 0.6 ** np.arange(B)
    return p / p.sum() * 0.9


def deep_vector() -> np.ndarray:
    """(32,) vector with p_1 = 0.9 (rest 0.09 in all, decaying): optimal trees are deep, so the depth limit
    binds at every level up to 32 and the solver's "depth no longer binds" early exit never triggers."""
    rest = 0.5 ** np.arange(B - 1)
    return np.concatenate([[0.9], rest / rest.sum() * 0.09])


def timed(fn, repeats: int) -> float:
    """Median wall time of ``repeats`` calls, in ms."""
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="skip n=2048 and the larger reference runs")
    ap.add_argument("--ref-budget-s", type=float, default=20.0, help="skip reference runs predicted longer than this")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "bench_solver.json"))
    args = ap.parse_args()
    p = acceptance_vector()

    t = time.perf_counter()
    solve_dp(p, 16, 4, B)
    first_ms = (time.perf_counter() - t) * 1000.0
    print(f"first call (JIT compile or numba cache load), n=16 D=4: {first_ms:.0f} ms")

    sizes = [64, 128, 512, 1024] + ([] if args.quick else [2048])
    cases = [(n, D) for n in sizes for D in (8, 16, 32)] + [(128, 10)]
    cases.sort()
    rows = []
    ref_rate = None  # seconds per unit of n^2 * D * B, from the first reference run
    for n, D in cases:
        reps = args.repeats if n <= 1024 else max(1, args.repeats // 2)
        dp_ms = timed(lambda: solve_dp(p, n, D, B), reps)
        work = n * n * D * B
        ref_ms = None
        must = (n, D) == (128, 10)
        predicted = None if ref_rate is None else ref_rate * work
        if must or (not args.quick and predicted is not None and predicted < args.ref_budget_s):
            t = time.perf_counter()
            reference_table(p, n, D, B)
            ref_ms = (time.perf_counter() - t) * 1000.0
            ref_rate = ref_ms / 1000.0 / work
        rows.append(
            {
                "n": n,
                "max_depth": D,
                "max_branching": B,
                "numba_median_ms": dp_ms,
                "reference_ms": ref_ms,
                "ratio": None if ref_ms is None else ref_ms / dp_ms,
                "vector": "decay",
                "repeats": reps,
            }
        )
        print(f"  n={n:5d} D={D:2d}: numba {dp_ms:9.2f} ms" + (f", reference {ref_ms:9.0f} ms" if ref_ms else ""), flush=True)
        if ref_rate is None and (n, D) != (128, 10) and n <= 128:
            t = time.perf_counter()
            reference_table(p, n, D, B)
            ref_ms = (time.perf_counter() - t) * 1000.0
            ref_rate = ref_ms / 1000.0 / work
            rows[-1].update(reference_ms=ref_ms, ratio=ref_ms / dp_ms)

    q = deep_vector()
    for n in [1024] + ([] if args.quick else [2048]):
        reps = args.repeats if n <= 1024 else max(1, args.repeats // 2)
        dp_ms = timed(lambda: solve_dp(q, n, 32, B), reps)
        rows.append({"n": n, "max_depth": 32, "max_branching": B, "vector": "deep", "numba_median_ms": dp_ms,
                     "reference_ms": None, "ratio": None, "repeats": reps})
        print(f"  n={n:5d} D=32 deep vector: numba {dp_ms:9.2f} ms", flush=True)

    print()
    print(f"{'n':>6} {'D':>3} {'B':>3} {'vector':>7} {'numba ms (median)':>18} {'reference ms':>13} {'ratio':>8}")
    for r in rows:
        ref = f"{r['reference_ms']:.0f}" if r["reference_ms"] is not None else "-"
        ratio = f"{r['ratio']:.0f}x" if r["ratio"] is not None else "-"
        vec = r.get("vector", "decay")
        print(f"{r['n']:>6} {r['max_depth']:>3} {r['max_branching']:>3} {vec:>7} {r['numba_median_ms']:>18.2f} {ref:>13} {ratio:>8}")
    doc = {
        "benchmark": "bench_solver",
        "date": now_iso(),
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()},
        "acceptance": {"decay": p.tolist(), "deep": deep_vector().tolist()},
        "first_call_ms": first_ms,
        "rows": rows,
    }
    path = atomic_write_text(args.out, json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
