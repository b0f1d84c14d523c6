#!/usr/bin/env bash
# Session 6, final calls: usage `bash lab/cuda/s6_final.sh suites|nosuites SHAPES`. With
# "suites": every CUDA suite and grouped-GEMM variant first (timings only if the default suite
# passes). Then the issue-5 side by side on SHAPES: every transformers backend, uncompiled and
# compiled shape-static (one compile per T), T = 1 .. 16384, moex graph off and on. carry: build-pack
set -u
. lab/cuda/device_env.sh
if [ "$1" = suites ]; then
  run_all_suites
  cat "$S"
  grep -q "cuda_default rc=0" "$S" || { echo "suite failed: no timings"; exit 1; }
fi
PYTHONUNBUFFERED=1 timeout 430 python3 bench/side_by_side.py --moex build-gpu/moex --shapes "$2" \
  --tokens 1,4,16,64,256,1024,4096,16384 --compile yes --compile-mode default --compile-dynamic static \
  --batched-max-tokens 64 --moex-args "--budget-s 0.3 --min-iters 5" \
  --json-out "$OUT/sbs_full.json" > "$OUT/sbs_full.log" 2>&1
echo "== side_by_side full rc=$?" >> "$S"
grep -E "^\||^###|took" "$OUT/sbs_full.log" >> "$S"
cat "$S"
