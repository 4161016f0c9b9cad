"""Does the order of a batch profile's rounds change what it measures? T(b, n) of the demo target timed batch size
after batch size (``profile_model`` per b, the order before 2026-12-07) and round by round across batch sizes
(``model_sweep`` + ``interleave_rounds``, what ``profile_batches`` does now), the two orders alternated ``--reps``
times in one process, each order's median per (b, n) over the repetitions. On a steady machine the two agree; the
interleaved order exists for a machine whose speed moves between batch sizes (``GridSweep``'s docstring).

Prints both tables and their ratio and writes ``results/profile_order/<run-id>.json``::

    flock /tmp/treeopt-bench.lock python benchmarks/profile_order.py           # ~4 min, 1 thread
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sequoia_opt.omp import apply_default  # noqa: E402

apply_default()  # as the treeopt command: threads sleep unless OMP_WAIT_POLICY is set


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes (rows per forward)")
    ap.add_argument("--tokens", default="1,2,3", help="tokens per row, n")
    ap.add_argument("--context", type=int, default=125, help="cached tokens per row")
    ap.add_argument("--reps", type=int, default=3, help="alternations of the two orders")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each profile (tune's default)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "results/profile_order")
    args = ap.parse_args(argv)

    import torch

    from sequoia_opt._io import create_run_record
    from sequoia_opt.jobs.load import load_pair, parse_drafter_spec
    from sequoia_opt.profiling.latency import interleave_rounds, model_sweep, profile_model

    torch.set_num_threads(args.threads)
    batches = [int(x) for x in args.batches.split(",")]
    grid = [int(x) for x in args.tokens.split(",")]
    target = load_pair(None, parse_drafter_spec("lookup"), device=torch.device("cpu"), dtype=torch.float32).target
    kw = dict(rounds=args.rounds, paired=True, min_repeats=3, max_repeats=10, max_seconds=3.0)  # as tune times
    runs: dict[str, dict[int, list[list[float]]]] = {"sequential": {b: [] for b in batches},
                                                     "interleaved": {b: [] for b in batches}}
    for rep in range(args.reps):
        t0 = time.time()
        for b in batches:
            table = profile_model(target, grid, [args.context], rows=b, **kw)[0]
            runs["sequential"][b].append([t.median_ms for t in table.timings])
        sweeps = {b: model_sweep(target, grid, [args.context], rows=b, **kw) for b in batches}
        interleave_rounds(list(sweeps.values()))
        for b in batches:
            runs["interleaved"][b].append([t.median_ms for t in sweeps[b].tables()[0].timings])
        print(f"repetition {rep + 1}/{args.reps}: {time.time() - t0:.0f} s", flush=True)
    med = {order: {b: [statistics.median(r[i] for r in per_b[b]) for i in range(len(grid))] for b in batches}
           for order, per_b in runs.items()}
    print(f"T(b, n) ms, medians of {args.reps} repetitions (n = {grid})")
    print(f"{'b':>3} {'sequential':>24} {'interleaved':>24}   interleaved / sequential")
    for b in batches:
        s, i = med["sequential"][b], med["interleaved"][b]
        print(f"{b:>3} {' '.join(f'{x:7.1f}' for x in s):>24} {' '.join(f'{x:7.1f}' for x in i):>24}   "
              + " ".join(f"{y / x:.3f}" for x, y in zip(s, i)))
    given = " ".join(argv if argv is not None else sys.argv[1:])
    doc = {"benchmark": "profile_order", "command": f"python benchmarks/profile_order.py {given}".strip(),
           "target": "demo", "context": args.context, "batches": batches, "tokens": grid, "rounds": args.rounds,
           "reps": args.reps, "threads": args.threads, "runs": runs, "medians": med}
    out = create_run_record(args.out, doc)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
