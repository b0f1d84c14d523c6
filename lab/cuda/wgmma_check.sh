#!/usr/bin/env bash
# Device call for the wgmma grouped GEMM: CUDA tests (both GEMM paths), then grouped_mm timings
# for wgmma (256- and 128-wide tiles) against mma.sync on the compute-bound rows.
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 120 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$OUT/tests_wgmma.log" 2>&1
echo "tests wgmma rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_wgmma.log" | tr '\n' ' ')"
grep -E "FAILED|Failure|error" "$OUT/tests_wgmma.log" | head -20
B="build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --min-iters 10 --budget-s 2"
for s in "qwen1.5-moe-a2.7b 256,1024,4096,16384" "deepseek-v3 256,4096" "mixtral-8x7b 256,4096"; do
  set -- $s
  for v in wgmma256 wgmma128 mma; do
    case $v in
      wgmma256) env=();;
      wgmma128) env=(MOEX_WGMMA_BN=128);;
      mma) env=(MOEX_CUDA_GEMM=mma);;
    esac
    echo "== $1 $v" >> "$OUT/bench.log"
    env "${env[@]}" timeout 100 $B --shape "$1" --tokens "$2" >> "$OUT/bench.log" 2>&1
    echo "bench $1 $v rc=$?"
  done
done
grep -E "^==|grouped_mm|error" "$OUT/bench.log"
