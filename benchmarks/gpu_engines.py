"""Latency profiles of the GPU serving engines (issue 20): T(n) through SGLang's and vLLM's offline Python APIs
(:mod:`sequoia_opt.engines.gpu`), for the engines that are installed, written as ``treeopt-latency/1`` profiles
with their ``engine`` under results/gpu/ and a table; an engine that is not installed is reported and skipped.

    python3 benchmarks/gpu_engines.py [--model HF_FOLDER] [--context 256,1024] [--max-tokens 64]

benchmarks/gpu_check.sh calls it after the kernel check. The default model is a small Llama checkpoint the
machine must already hold (nothing is downloaded): --model, else $TREEOPT_GPU_ENGINE_MODEL.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sequoia_opt._io import atomic_write_text  # noqa: E402
from sequoia_opt.engines import EngineError, require_engine  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("TREEOPT_GPU_ENGINE_MODEL"))
    ap.add_argument("--context", default="256,1024")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "results/gpu")
    args = ap.parse_args()
    summary = {}
    missing = {}
    for name in ("sglang", "vllm"):
        try:
            require_engine(name)
        except EngineError as err:
            missing[name] = str(err)
            summary[name] = {"skipped": str(err)}
    if missing:  # one line for what cannot run here (the lent GPU machines have neither package)
        print(f"gpu_engines: {' and '.join(missing)} not installed here: skipped ({'; '.join(missing.values())})")
    for name in ("sglang", "vllm"):
        if name in missing:
            continue
        if not args.model:
            print(f"gpu_engines: {name} is installed but no --model / $TREEOPT_GPU_ENGINE_MODEL names a local "
                  "checkpoint: skipped")
            summary[name] = {"skipped": "no model"}
            continue
        from sequoia_opt.engines.gpu import profile_gpu
        from sequoia_opt.profiles import save_latency
        from sequoia_opt.profiling.timing import token_grid

        contexts = [int(c) for c in args.context.split(",")]
        try:
            curve = profile_gpu(name, args.model, contexts=contexts, token_counts=token_grid(args.max_tokens),
                                rounds=args.rounds)
        except Exception as err:  # noqa: BLE001 - one engine failing must not lose the other's result
            print(f"gpu_engines: {name} failed: {type(err).__name__}: {err}")
            summary[name] = {"failed": f"{type(err).__name__}: {err}"}
            continue
        path = save_latency(args.out / f"latency-{name}.yaml", curve)
        rows = {c: {int(n): curve.target_ms(n, c) for n in curve.target_tokens(c)} for c in contexts}
        summary[name] = {"profile": str(path), "engine": curve.engine_info, "target_forward_ms": rows}
        for c in contexts:
            t1 = curve.target_ms(1, c)
            print(f"{name} context {c}: " + ", ".join(f"T({n})={ms:.2f} ({ms / t1:.2f}x)" for n, ms in rows[c].items()))
    atomic_write_text(args.out / "gpu_engines.json", json.dumps(summary, indent=2) + "\n")
    print(f"gpu_engines: wrote {args.out / 'gpu_engines.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
