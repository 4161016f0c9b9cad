#!/usr/bin/env bash
# Every GPU measurement of treeopt in one command that must return its figures on the first try: the toolchain,
# the tree-attention kernel (build, correctness against float64, time against SDPA and FlexAttention), eager and
# CUDA-graph T(n) of random-weight Llama-2-7B and demo-pair shapes, the demo pair's GPU speedup predicted from
# them, and the offloaded 7B. The stages, their caps and what each writes: benchmarks/gpu_stages.py.
#
#   bash benchmarks/gpu_check.sh                       # on a machine with one NVIDIA GPU: at most 540 s
#   bash benchmarks/gpu_check.sh --dry-run             # every stage on a CPU, tiny sizes, gguf hidden
#   bash benchmarks/gpu_check.sh --stages build,kernel # a subset
#
# One deadline (540 s, under the 600 s a device command may run); each stage's cap is taken from the time left.
# After every stage three files in $OUT are replaced: gpu_check.tar.gz (all results), gpu_check.log, summary.json.
# Runs the package from this checkout (PYTHONPATH), so nothing needs installing. Exit: 0 all stages passed,
# 3 one was cut short or skipped for time, 1 one failed, 2 a usage error.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" benchmarks/gpu_stages.py "$@"
