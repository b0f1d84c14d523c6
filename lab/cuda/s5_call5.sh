#!/usr/bin/env bash
# (session 5, call 5) The candidate for main: every CUDA suite (default and each grouped-GEMM
# variant of tests/CMakeLists.txt, fixtures, consistency, model), then the shape-static side by
# side on the compute-bound rows, then a raster-group sweep on Mixtral. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
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
run cuda_64rows MOEX_CUDA_TILE_ROWS=64 "$F" $T
run cuda_pingpong MOEX_WGMMA_PINGPONG=both "$F" $T
run cuda_cluster MOEX_WGMMA_CLUSTER=1 "$F" $T
run cuda_cluster_everywhere MOEX_CUDA_TILE_ROWS=256 "$F" $T
for t in test_experts_fixtures test_experts_consistency test_model_cuda_experts; do run $t X=1 "" build-gpu/tests/$t; done
cat "$S"
grep -q "cuda_default rc=0" "$S" || { echo "suite failed: no timings"; exit 1; }
PYTHONUNBUFFERED=1 timeout 300 python3 bench/side_by_side.py --moex build-gpu/moex \
  --shapes mixtral-8x7b,deepseek-v3,qwen1.5-moe-a2.7b --tokens 256,1024,4096,16384 --hf-impls grouped_mm \
  --compile yes --compile-mode default --compile-dynamic static --batched-max-tokens 64 \
  --moex-args "--budget-s 1 --min-iters 10" --json-out "$OUT/sbs_static.json" > "$L/sbs_static.log" 2>&1
echo "== side_by_side static rc=$?" >> "$S"
grep -E "^\||compiled|took" "$L/sbs_static.log" >> "$S"
for round in 1 2; do
  for r in 4 8 16; do
    MOEX_WGMMA_RASTER=$r timeout 60 build-gpu/moex bench experts --device cuda --backends grouped_mm \
      --graph off --no-check --min-iters 5 --budget-s 0.4 --shape mixtral-8x7b --tokens 1024,4096,16384 2>&1 |
      grep -E "grouped_mm|rror" | sed -E "s/^/mixtral raster=$r /; s/ +/ /g" >> "$S"
  done
done
cat "$S"
