#!/bin/bash
# What produced this folder (2026-12-06 20:29-21:10, the AMD EPYC VM, 1 thread, from a clone at b4acd54, under
# flock /tmp/treeopt-bench.lock; an expert-review helper read code beside it from 20:59). Run from a checkout:
#   flock /tmp/treeopt-bench.lock bash results/batch/20261206T2029Z-tree-plan/commands.sh /tmp/tpm
set -e
root=$(pwd)
d=${1:-/tmp/tpm}; rm -rf $d; mkdir -p $d; cd $d
treeopt tune --engine treeopt --shape tree --batches 1,2,4,8 --profiles-dir $d/profiles -o $d/trees.yaml --json > $d/tune-tree.json
treeopt tune --engine treeopt --shape chain --batches 1,2,4,8 --profiles-dir $d/profiles -o $d/chains.yaml --json > $d/tune-chain.json
B="--batches 1,2,4,8 --rounds 2 --tokens 1,2,3,4,6,9 --draft-tokens 1,2,3,4,6,8 --max-new-tokens 40 --decode-rounds 3"
A="--acceptance $(ls $d/profiles/*/acceptance-greedy.yaml)"   # the tree plan's (8 ranked candidates)
python $root/benchmarks/batch.py --plan $d/trees.yaml $B $A --out $d/batch-trees.json > $d/batch-trees.txt
python $root/benchmarks/batch.py --plan $d/chains.yaml $B $A --out $d/batch-chains.json > $d/batch-chains.txt
