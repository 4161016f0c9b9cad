#!/usr/bin/env bash
# One-shot GPU check of the tree-attention kernel; what it checks and times is in benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu_check.sh [gpu_check.py options]      e.g. --quick, --no-flex, --steps correctness,bench
#
# Needs one NVIDIA GPU, nvcc and ninja (the kernel is built on first use into $TORCH_EXTENSIONS_DIR). Runs the
# package from this checkout (PYTHONPATH), so nothing needs installing. Stops itself after TREEOPT_CHECK_LIMIT_S
# seconds (default 470, under 8 minutes; gpu_check.py budgets its steps to finish before that). Writes
# results/gpu/*.json and results/gpu/gpu_check.log, copies them to $OUT when that is set, and exits with
# gpu_check.py's status: non-zero when the correctness sweep fails or does not finish.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/treeopt/torch_extensions}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
PY="${PYTHON:-python3}"
LIMIT="${TREEOPT_CHECK_LIMIT_S:-470}"

mkdir -p results/gpu
LOG=results/gpu/gpu_check.log
{
  echo "== gpu_check.sh $(date -u +%FT%TZ) on $(hostname), limit ${LIMIT}s"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader || echo "nvidia-smi unavailable"
  if command -v nvcc >/dev/null; then nvcc --version | tail -n 2; else echo "nvcc not on PATH"; fi
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
} 2>&1 | tee "$LOG"

# the Python budget is the limit less a margin for the interpreter start and the final copies
timeout --signal=TERM --kill-after=15 "$LIMIT" "$PY" benchmarks/gpu_check.py --budget-s "$((LIMIT - 30))" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "gpu_check.py was stopped at the ${LIMIT}s limit; the JSON written before that is in results/gpu/" | tee -a "$LOG"
fi
timeout 150 "$PY" benchmarks/gpu_engines.py --out results/gpu 2>&1 | tee -a "$LOG"  # SGLang / vLLM T(n) where installed (issue 20)
timeout --signal=TERM --kill-after=15 "${TREEOPT_OFFLOAD_LIMIT_S:-240}" "$PY" benchmarks/offload_gpu.py 2>&1 | tee -a "$LOG"  # issue 19: offloaded T(n) + speedup -> results/gpu/offload*.{json,yaml}
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  cp "$LOG" "$OUT/" 2>/dev/null
  for f in results/gpu/*.json; do [ -e "$OUT/$(basename "$f")" ] || cp "$f" "$OUT/"; done
fi
echo "gpu_check.sh: exit $rc" | tee -a "$LOG"
exit "$rc"
