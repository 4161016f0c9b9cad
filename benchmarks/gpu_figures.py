"""The figures of ``gpu_check.sh``'s latency profiles, and the demo pair's GPU speedup predicted from them.

Reads ``<results>/profiles/*.yaml`` (the profile stages' ``7b-eager``, ``7b-graphs``, ``demo-eager``,
``demo-graphs``) and writes ``<results>/figures.json`` and a table:

* per profile and context: T(n) / T(1) at n = 1, 2, 4, ..., 128, c(1) / T(1), the per-step overhead, the
  attention backend that ran (target and draft) and the CUDA-graph counts;
* eager against graphed: T_eager(n) / T_graphs(n) per n (what eager launches cost);
* PREDICTIONS, not measurements: the tree ``treeopt solve`` picks (hardware-aware, budget up to the largest
  profiled n, depth <= 16) and its predicted speedup over plain decoding on the same curve, for

  - the demo pair (SmolLM2-135M-Instruct Q4_1 target, the bundled draft) on this GPU, eager and graphed: its
    curve measured here on random weights of its shapes, its acceptance measured on a CPU in float32
    (``profiles/SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft/acceptance-greedy.yaml``; the GGUF cannot
    travel to the GPU machine), beside the same prediction on the shipped CPU curve;
  - the 7B shapes at the acceptance of Sequoia's Llama-2-7B / JackFram-68M pair (``profiles/example``).

    python3 benchmarks/gpu_figures.py --results results/gpu/<run>
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sequoia_opt.profiles import load_acceptance, load_latency  # noqa: E402
from sequoia_opt.solver import choose  # noqa: E402

DEMO_ACCEPTANCE = ROOT / "profiles" / "SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft" / "acceptance-greedy.yaml"
DEMO_CPU_CURVE = ROOT / "profiles" / "cpu-amd-epyc" / "SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft-latency.yaml"
EXAMPLE_ACCEPTANCE = ROOT / "profiles" / "example" / "acceptance.yaml"
MAX_DEPTH = 16
SHOWN_N = (1, 2, 4, 8, 16, 32, 64, 128)


def curve_figures(curve) -> dict[str, Any]:
    """T(n)/T(1), T(1) ms, c(1)/T(1) per context, the step overhead and what the profile recorded about its run."""
    out: dict[str, Any] = {"id": curve.id, "step_overhead_ms": curve.step_overhead_ms, "contexts": {},
                           "attention": curve.device.get("attention"), "cuda_graphs": curve.device.get("cuda_graphs"),
                           "device": curve.device.get("name")}
    for ctx in (int(c) for c in curve.contexts):
        ns = [int(n) for n in curve.target_tokens(ctx) if int(n) in SHOWN_N]
        t1 = curve.target_ms(1, ctx)
        out["contexts"][ctx] = {"T1_ms": t1, "T_over_T1": {n: curve.target_ms(n, ctx) / t1 for n in ns},
                                "c1_over_T1": curve.draft_ms(1, ctx) / t1}
    return out


def predict(acceptance, curve, label: str) -> dict[str, Any]:
    """The hardware-aware choice on ``curve`` (smallest profiled context), labelled as a prediction."""
    budget = curve.max_target_tokens()
    ch = choose(acceptance, curve, budget, MAX_DEPTH)
    return {"label": f"PREDICTION ({label})", "curve": curve.id, "context": int(min(curve.contexts)),
            "nodes": ch.tree.size, "depth": ch.tree.tree_depth, "tokens_per_step": ch.expected_tokens,
            "step_ms": ch.cost_ms, "plain_ms_per_token": ch.plain_ms_per_token, "speedup": ch.speedup}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="the gpu_check.sh run folder")
    args = ap.parse_args(argv)
    folder = args.results / "profiles"
    curves = {p.stem: load_latency(p) for p in sorted(folder.glob("*.yaml"))} if folder.is_dir() else {}
    doc: dict[str, Any] = {"profiles": {k: curve_figures(c) for k, c in curves.items()}, "eager_over_graphs": {},
                           "predictions": {}}
    for kind in ("7b", "demo"):
        e, g = curves.get(f"{kind}-eager"), curves.get(f"{kind}-graphs")
        if e is not None and g is not None:
            ctx = int(min(set(e.contexts.tolist()) & set(g.contexts.tolist())))
            both = set(e.target_tokens(ctx).tolist()) & set(g.target_tokens(ctx).tolist()) & set(SHOWN_N)
            doc["eager_over_graphs"][kind] = {int(n): e.target_ms(n, ctx) / g.target_ms(n, ctx) for n in sorted(both)}
    demo_p = load_acceptance(DEMO_ACCEPTANCE).acceptance
    why = ("curve: this GPU, random weights of the demo pair's shapes; acceptance: the real pair measured on a CPU "
           "in float32")
    for kind in ("demo-eager", "demo-graphs"):
        if kind in curves:
            doc["predictions"][kind] = predict(demo_p, curves[kind], why)
    doc["predictions"]["demo-cpu"] = predict(demo_p, load_latency(DEMO_CPU_CURVE),
                                             "the shipped CPU curve of the real pair, for comparison")
    ex_p = load_acceptance(EXAMPLE_ACCEPTANCE).acceptance
    for kind in ("7b-eager", "7b-graphs"):
        if kind in curves:
            doc["predictions"][kind] = predict(ex_p, curves[kind], "curve: this GPU, random weights of the 7B shapes; "
                                               "acceptance: Sequoia's Llama-2-7B / JackFram-68M example vector")
    tmp = args.results / ".figures.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, args.results / "figures.json")

    for name, f in doc["profiles"].items():
        for ctx, c in f["contexts"].items():
            ratios = "  ".join(f"{n}:{r:.2f}" for n, r in c["T_over_T1"].items())
            att = f["attention"] or {}
            ran = "/".join(str((att.get(role) or {}).get("backend")) for role in ("target", "draft"))
            print(f"{name:<12} L={ctx:<5} T(1)={c['T1_ms']:.3f} ms  T(n)/T(1) {ratios}  c(1)/T(1)={c['c1_over_T1']:.2f}"
                  f"  attention {ran}")
    for kind, r in doc["eager_over_graphs"].items():
        print(f"{kind}: eager / graphed T(n): " + "  ".join(f"{n}:{x:.2f}" for n, x in r.items()))
    for kind, p in doc["predictions"].items():
        print(f"{kind:<12} {p['nodes']:>3} nodes depth {p['depth']:>2}  {p['tokens_per_step']:.2f} tokens/step  "
              f"speedup {p['speedup']:.2f}x  {p['label']}")
    print(f"gpu_figures: wrote {args.results / 'figures.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
