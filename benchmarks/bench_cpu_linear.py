"""T(n) on a CPU with the tuned linears (``model.tuned_linear``) against each single kernel everywhere.

A random-weight model of a preset's shape (default: SmolLM2-135M, the demo target) runs one cached forward of
n tokens after a ``--context``-token prefix, through the verification path (tree mask, KV cache), at float32.
Variants: every linear on ``F.linear`` (what a plain PyTorch decoder runs), every linear on one kernel
(``w_xt``, ``x_wt``, ``onednn``), and the tuned plan (per weight shape and row-count bucket, the kernel
measured fastest on this machine). For each n the variants are timed one after another in each of
``--rounds`` rounds (``profiling.timing.time_call`` medians); the median over rounds is reported, with
T(n)/T(1) per variant and the ratio F.linear / tuned. Writes ``results/bench_cpu_linear.json`` atomically::

    python benchmarks/bench_cpu_linear.py [--arch smollm2-135m] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sequoia_opt._io import atomic_write_text  # noqa: E402
from sequoia_opt.model.config import PRESETS  # noqa: E402
from sequoia_opt.model.llama import Linear  # noqa: E402
from sequoia_opt.model.tuned_linear import (KERNELS, ROW_BUCKETS, LinearDispatch, linear_record,  # noqa: E402
                                            tune_linears)
from sequoia_opt.device import cpu_name  # noqa: E402
from sequoia_opt.profiling.latency import random_weight_model, time_forward  # noqa: E402
from sequoia_opt.tree import now_iso  # noqa: E402


def force(model: torch.nn.Module, kernel: str) -> None:
    """Every linear of ``model`` runs ``kernel`` at every row count."""
    for m in model.modules():
        if isinstance(m, Linear):
            with torch.no_grad():
                state = KERNELS[kernel].prepare(m.weight.detach(), None)
            m.dispatch = LinearDispatch((kernel,) * len(ROW_BUCKETS), {kernel: state}, m.out_features)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="smollm2-135m", choices=sorted(PRESETS))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-seconds", type=float, default=2.0, help="timing budget of one median (s)")
    ap.add_argument("--out", type=Path, default=Path("results/bench_cpu_linear.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_weight_model(PRESETS[args.arch], device="cpu", dtype=torch.float32)
    cache = model.new_cache(args.context + max(args.tokens))
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    singles = [k for k in ("w_xt", "x_wt", "onednn") if KERNELS[k].available()]
    variants = ["F.linear", *singles, "tuned"]
    dispatch: dict[str, list] = {"F.linear": [None] * len(linears)}
    for k in singles:  # every variant's kernel states are built once, then swapped in per timing
        force(model, k)
        dispatch[k] = [m.dispatch for m in linears]
    tune_linears(model)
    plan = linear_record(model)
    dispatch["tuned"] = [m.dispatch for m in linears]

    def apply(variant: str) -> None:
        for m, d in zip(linears, dispatch[variant]):
            m.dispatch = d

    med: dict[int, dict[str, float]] = {}
    for n in args.tokens:
        res: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v in variants:
                apply(v)
                res[v].append(time_forward(model, n, args.context, cache=cache, max_seconds=args.max_seconds).median_ms)
        med[n] = {v: statistics.median(x) for v, x in res.items()}
        print(f"n={n:3d} " + "  ".join(f"{v} {med[n][v]:.1f}" for v in variants) + " ms", flush=True)
    t1 = med[args.tokens[0]]
    rows = [{"tokens": n, "ms": med[n], "over_t1": {v: med[n][v] / t1[v] for v in variants},
             "f_linear_over_tuned": med[n]["F.linear"] / med[n]["tuned"]} for n in args.tokens]
    print("| n | " + " | ".join(f"{v} ms (T(n)/T(1))" for v in variants) + " | F.linear / tuned |")
    print("|---|" + "---|" * (len(variants) + 1))
    for r in rows:
        print(f"| {r['tokens']} | " + " | ".join(f"{r['ms'][v]:.1f} ({r['over_t1'][v]:.2f})" for v in variants)
              + f" | {r['f_linear_over_tuned']:.2f} |")
    doc = {"benchmark": "bench_cpu_linear", "date": now_iso(), "arch": args.arch, "context": args.context,
           "device": cpu_name(), "threads": torch.get_num_threads(), "rounds": args.rounds,
           "cpu_count": os.cpu_count(), "torch": torch.__version__, "plan": plan, "rows": rows}
    print(f"wrote {atomic_write_text(args.out, json.dumps(doc, indent=2) + chr(10))}")


if __name__ == "__main__":
    main()
