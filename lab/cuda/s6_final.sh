#!/usr/bin/env bash
# Session 6, final calls: usage `bash lab/cuda/s6_final.sh suites|nosuites SHAPES`. With
# "suites": every CUDA suite and grouped-GEMM variant first (timings only if the default suite
# passes). Then the issue-5 side by side on SHAPES: every transformers backend, uncompiled and
# compiled shape-static (one compile per T), T = 1 .. 16384, moex graph off and on. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
if [ "$1" = suites ]; then
  T=build-gpu/tests/test_cuda_backends
  F="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*"
  run() {  # label env filter binary
    f="$L/$(echo "$1" | tr ' =' '__').log"
    env $2 timeout 200 $4 --gtest_brief=1 $3 > "$f" 2>&1
    echo "$1 rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
    grep -E "^\[  FAILED  \]" "$f" | head -8 >> "$S"
  }
  run cuda_default X=1 "" $T
  run cuda_mma MOEX_CUDA_GEMM=mma "$F" $T
  run cuda_64rows MOEX_CUDA_TILE_ROWS=64 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
  run cuda_pingpong_both MOEX_WGMMA_PINGPONG=both "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
  run cuda_pingpong_none MOEX_WGMMA_PINGPONG=none "$F" $T
  run cuda_cluster MOEX_WGMMA_CLUSTER=1 "$F" $T
  run cuda_cluster_everywhere MOEX_CUDA_TILE_ROWS=256 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
  run cuda_bn128 MOEX_WGMMA_BN=128 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
  for t in test_experts_fixtures test_experts_consistency test_model_cuda_experts; do run $t X=1 "" build-gpu/tests/$t; done
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
