#!/usr/bin/env bash
# Prediction fidelity for short answers: treeopt run's predicted speedup (each step priced at its cut tree's cost,
# the whole tree's as G / S plain steps) and the step-for-step figure it replaced (steady state x the tokens/step
# factor), against the measured speedup, at --max-new-tokens 1, 2, 4, 8 and 32 on 8 eval prompts of the demo pair.
# The tree is solved from the shipped profiles of the 2-core AMD EPYC VM (profiles/cpu-amd-epyc/; solve writes
# depth_step_ms): on another machine the predictions carry that profile's error.
#
#   flock /tmp/treeopt-bench.lock bash benchmarks/answer_length.sh        # about 70 s on 2 cores
#
# Writes results/answer_length/<UTC time>/ (tree.yaml, one run JSON per length, summary.json) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
out="results/answer_length/$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
python -m sequoia_opt solve -a profiles/SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft/acceptance-greedy.yaml \
  -l profiles/cpu-amd-epyc/SmolLM2-135M-Instruct.Q4_1__treeopt-smollm2-draft-latency.yaml -o "$out/tree.yaml" >/dev/null
for n in 1 2 4 8 32; do
  python -m sequoia_opt run --tree "$out/tree.yaml" --num-prompts 8 --max-new-tokens "$n" --results-dir "$out/runs" \
    --json > "$out/run-$n.json"
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = []
for n in (1, 2, 4, 8, 32):
    d = json.loads((out / f"run-{n}.json").read_text())
    s = next(x for x in d["summaries"] if x["tree"] != "plain")
    old = s["predicted_speedup_steady"] * s["predicted_tokens_per_step"] / s["predicted_tokens_per_step_steady"]
    rows.append({"max_new_tokens": n, "measured_speedup": s["speedup"], "predicted_speedup": s["predicted_speedup"],
                 "predicted_step_for_step": old, "steady": s["predicted_speedup_steady"],
                 "tokens_per_step": s["tokens_per_step"], "predicted_tokens_per_step": s["predicted_tokens_per_step"]})
print(f"{'N':>4} {'measured':>9} {'priced':>8} {'step-for-step':>14} {'steady':>7} {'tok/step':>9} {'pred':>6}")
for r in rows:
    print(f"{r['max_new_tokens']:>4} {r['measured_speedup']:>9.3f} {r['predicted_speedup']:>8.3f} "
          f"{r['predicted_step_for_step']:>14.3f} {r['steady']:>7.3f} {r['tokens_per_step']:>9.3f} "
          f"{r['predicted_tokens_per_step']:>6.3f}")
import platform, subprocess, datetime
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
doc = {"rows": rows, "command": "bash benchmarks/answer_length.sh", "commit": commit or None,
       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "machine": platform.processor() or platform.machine()}
(out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
print(f"wrote {out}/summary.json")
PY
