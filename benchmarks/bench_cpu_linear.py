"""T(n) on a CPU with the decoder's few-token GEMM path (``model.llama.Linear``) against plain ``F.linear``.

A random-weight model of a preset's shape (default: SmolLM2-135M, the demo target) runs one cached forward of
n tokens after a ``--context``-token prefix, through the verification path (tree mask, KV cache), at float32.
For each n the two variants are timed alternately (``--rounds`` rounds of ``profiling.timing.time_call``
medians), and the median over rounds is reported with the ratio F.linear / path. T(1) uses F.linear in both
(the path starts at 2 rows), so it is the same baseline plain decoding runs. Writes
``results/bench_cpu_linear.json`` atomically::

    python benchmarks/bench_cpu_linear.py [--arch smollm2-135m] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import torch

from sequoia_opt._io import atomic_write_text
from sequoia_opt.model.config import PRESETS
from sequoia_opt.model.llama import Linear
from sequoia_opt.profiling.latency import random_weight_model, time_forward
from sequoia_opt.tree import now_iso


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="smollm2-135m", choices=sorted(PRESETS))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=3.0, help="timing budget of one median (s)")
    ap.add_argument("--out", type=Path, default=Path("results/bench_cpu_linear.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_weight_model(PRESETS[args.arch], device="cpu", dtype=torch.float32)
    cache = model.new_cache(args.context + max(args.tokens))
    default_max = Linear.cpu_gemm_max_rows
    rows = []
    print(f"{'n':>4} {'F.linear ms':>12} {'path ms':>9} {'ratio':>6}   T(n)/T(1): F.linear  path")
    t1 = {}
    try:
        for n in args.tokens:
            res = {"F.linear": [], "path": []}
            for _ in range(args.rounds):
                for name, max_rows in (("F.linear", 0), ("path", default_max)):
                    Linear.cpu_gemm_max_rows = max_rows
                    res[name].append(time_forward(model, n, args.context, cache=cache, max_seconds=args.max_seconds).median_ms)
            med = {k: statistics.median(v) for k, v in res.items()}
            if n == 1:
                t1 = med
            rel = {k: med[k] / t1[k] if t1 else float("nan") for k in med}
            rows.append({"tokens": n, "f_linear_ms": med["F.linear"], "path_ms": med["path"],
                         "ratio": med["F.linear"] / med["path"], "f_linear_over_t1": rel["F.linear"],
                         "path_over_t1": rel["path"]})
            print(f"{n:4d} {med['F.linear']:12.1f} {med['path']:9.1f} {med['F.linear'] / med['path']:6.2f}"
                  f"   {rel['F.linear']:18.2f} {rel['path']:5.2f}", flush=True)
    finally:
        Linear.cpu_gemm_max_rows = default_max
    doc = {"benchmark": "bench_cpu_linear", "date": now_iso(), "arch": args.arch, "context": args.context,
           "threads": torch.get_num_threads(), "rounds": args.rounds, "processor": platform.processor(),
           "cpu_count": os.cpu_count(), "torch": torch.__version__, "rows": rows}
    print(f"wrote {atomic_write_text(args.out, json.dumps(doc, indent=2) + chr(10))}")


if __name__ == "__main__":
    main()
