"""T(n) on a CPU under OpenMP wait settings: threads that spin between parallel regions (libgomp's default,
nothing set) against threads that sleep (``OMP_WAIT_POLICY=PASSIVE``) or spin briefly, then sleep
(``GOMP_SPINCOUNT=N``, libgomp: N spin iterations; what the ``treeopt`` command sets unless the user set one).

Why it matters: a forward of a small model runs hundreds of short parallel regions. When the machine has as
many busy processes as cores (a shared VM, tests running beside a profile), a spinning thread burns the time
slice its sibling needs to reach the next barrier, and one forward can take several times longer; a sleeping
thread gives it back. On an idle machine spinning saves the wake-up latency.

Each setting runs in its own process (the runtime reads the variables once, at load), alternately, ``--rounds``
times; each process builds a random-weight model of ``--arch``'s shape with the tuned linears (the plan cached
by the first process) and times one cached forward of n tokens after ``--context`` tokens
(``profiling.latency.time_forward`` medians). Reported: the median over rounds per setting, its ratio to the
first setting (the runtime's default), and the load average seen before each process. Writes
``results/omp_wait/<stamp>.json``::

    python benchmarks/omp_wait.py [--settings unset OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=10000]
        [--tokens 1 4 16] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the OpenMP variables a setting may set; every other setting's process sees none of them
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def worker(args) -> None:
    """One process: print {n: median ms} as JSON on the last line."""
    import torch

    from sequoia_opt.model.config import PRESETS
    from sequoia_opt.model.tuned_linear import tune_linears
    from sequoia_opt.profiling.latency import random_weight_model, time_forward

    if args.threads:
        torch.set_num_threads(args.threads)
    model = random_weight_model(PRESETS[args.arch], device="cpu", dtype=torch.float32)
    tune_linears(model)
    cache = model.new_cache(args.context + max(args.tokens))
    out = {n: time_forward(model, n, args.context, cache=cache, max_repeats=args.repeats,
                           min_repeats=args.repeats).median_ms for n in args.tokens}
    print(json.dumps({"threads": torch.get_num_threads(), "ms": out}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="smollm2-135m")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10, help="timed forwards per n and process")
    ap.add_argument("--settings", nargs="+", default=["unset", "OMP_WAIT_POLICY=PASSIVE", "GOMP_SPINCOUNT=10000"],
                    help="'unset' (the runtime's default) or VAR=VALUE[,VAR=VALUE] of " + ", ".join(VARIABLES))
    ap.add_argument("--out", type=Path, default=Path("results/omp_wait"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    from sequoia_opt._io import create_run_record
    from sequoia_opt.device import cpu_name
    from sequoia_opt.tree import now_iso

    cmd = [sys.executable, __file__, "--worker", "--arch", args.arch, "--context", str(args.context),
           "--threads", str(args.threads), "--repeats", str(args.repeats), "--tokens", *map(str, args.tokens)]
    settings = list(dict.fromkeys(args.settings))
    extra: dict[str, dict[str, str]] = {}
    for setting in settings:
        pairs = [] if setting == "unset" else [kv.split("=", 1) for kv in setting.split(",")]
        if any(len(kv) != 2 or kv[0] not in VARIABLES for kv in pairs):
            ap.error(f"--settings: {setting!r} is not 'unset' or VAR=VALUE with VAR in {', '.join(VARIABLES)}")
        extra[setting] = dict(pairs)
    runs: dict[str, list[dict]] = {p: [] for p in settings}
    for r in range(args.rounds):
        for policy in settings:
            env = {k: v for k, v in os.environ.items() if k not in VARIABLES} | extra[policy]
            load = os.getloadavg()[0]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            doc = json.loads(res.stdout.strip().splitlines()[-1])
            doc["load_avg_1min"] = load
            runs[policy].append(doc)
            print(f"round {r + 1} {policy:24s} load {load:4.1f}  " +
                  "  ".join(f"T({n}) {ms:7.1f}" for n, ms in doc["ms"].items()) + " ms", flush=True)
    med = {p: {n: statistics.median(d["ms"][str(n)] for d in runs[p]) for n in args.tokens} for p in settings}
    base = settings[0]
    rows = [{"tokens": n, "ms": {p: med[p][n] for p in settings},
             "over_first": {p: med[p][n] / med[base][n] for p in settings}} for n in args.tokens]
    loads = [d["load_avg_1min"] for p in settings for d in runs[p]]
    print(f"\nload average (1 min) before each process: {min(loads):.1f} to {max(loads):.1f} on {os.cpu_count()} CPUs")
    print("| n | " + " | ".join(f"{p} ms (/ {base})" for p in settings) + " |")
    print("|---|" + "---|" * len(settings))
    for row in rows:
        print(f"| {row['tokens']} | " + " | ".join(f"{row['ms'][p]:.1f} ({row['over_first'][p]:.2f})" for p in settings)
              + " |")
    doc = {"benchmark": "omp_wait", "date": now_iso(), "arch": args.arch, "context": args.context,
           "device": cpu_name(), "cpu_count": os.cpu_count(), "rounds": args.rounds, "repeats": args.repeats,
           "settings": settings, "load_avg_1min": {"min": min(loads), "max": max(loads)}, "rows": rows,
           "runs": runs}
    out = create_run_record(args.out, doc)  # never replaced
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
