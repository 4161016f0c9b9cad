"""Write the synthetic offload latency profile ``profiles/example/offload-llama-2-7b-latency.yaml``: Llama-2-7B
in fp16 with its layers streamed over PCIe 4.0 x16 (25 GB/s pinned) to an L40-like GPU (180 TFLOP/s fp16,
860 GB/s), the JackFram/llama-68m draft resident (c(w) = 0.6 ms + 2 us per token), from the offload cost
model (:mod:`sequoia_opt.solver.offload`). EXAMPLE data, not a measurement: ``treeopt profile latency
--offload`` measures it on a machine with a GPU. Then::

    treeopt solve -a profiles/example/acceptance.yaml -l profiles/example/offload-llama-2-7b-latency.yaml \\
        --budget 256

shows the regime's trees (deep: T(n) is flat to 256 tokens)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sequoia_opt.model import ModelConfig
from sequoia_opt.profiles import LatencyCurve, save_latency
from sequoia_opt.solver.offload import offload_curve, synthetic_offload_model

NS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h2d-gbps", type=float, default=25.0)
    ap.add_argument("--out", type=Path, default=Path("profiles/example/offload-llama-2-7b-latency.yaml"))
    args = ap.parse_args()
    cfg = ModelConfig.preset("llama-2-7b")
    model = synthetic_offload_model(cfg, NS, h2d_gbps=args.h2d_gbps, tflops=180.0, hbm_gbps=860.0, context=256,
                                    overhead_ms=1.0)
    curve = offload_curve(model, NS, {w: 0.6 + 0.002 * w for w in NS}, step_overhead_ms=0.5, context=256,
                          profile_id="example-offload-llama-2-7b-pcie4-l40",
                          device={"name": "L40-like GPU (synthetic: 180 TFLOP/s, 860 GB/s), PCIe 4.0 x16",
                                  "dtype": "float16"},
                          model_info={"target": "meta-llama/Llama-2-7b-hf", "draft": "JackFram/llama-68m",
                                      "offloaded": True},
                          source=f"EXAMPLE: offload cost model with a synthetic {args.h2d_gbps:g} GB/s host link "
                                 "(benchmarks/offload_example.py); not a measurement")
    doc = curve.to_dict()
    doc["example"] = True
    save_latency(args.out, LatencyCurve.from_dict(doc))
    print(f"wrote {args.out}: T(1) = {curve.target_ms(1):.1f} ms, T(512) = {curve.target_ms(512):.1f} ms")


if __name__ == "__main__":
    main()
