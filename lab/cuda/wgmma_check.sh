#!/usr/bin/env bash
# Device call for the wgmma grouped GEMM: CUDA tests, then grouped_mm timings of wgmma variants
# (tile width, raster group) on the compute-bound rows, and one ncu look at the Mixtral kernel.
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 120 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$OUT/tests_wgmma.log" 2>&1
echo "tests wgmma rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_wgmma.log" | tr '\n' ' ')"
grep -E "FAILED|Failure|error" "$OUT/tests_wgmma.log" | head -20
B="build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --min-iters 10 --budget-s 2"
for s in ${SHAPES:-"qwen1.5-moe-a2.7b 1024,4096,16384" "deepseek-v3 4096,16384" "mixtral-8x7b 256,4096,16384"}; do
  set -- $s
  for v in ${VARIANTS:-r8 r1 r16 bn128}; do
    case $v in
      r8) env=(X=1);;
      r1) env=(MOEX_WGMMA_RASTER=1);;
      r16) env=(MOEX_WGMMA_RASTER=16);;
      r64) env=(MOEX_WGMMA_RASTER=64);;
      r9) env=(MOEX_WGMMA_RASTER=9);;
      r18) env=(MOEX_WGMMA_RASTER=18);;
      r4) env=(MOEX_WGMMA_RASTER=4);;
      bn128r9) env=(MOEX_WGMMA_BN=128 MOEX_WGMMA_RASTER=9);;
      bn128r18) env=(MOEX_WGMMA_BN=128 MOEX_WGMMA_RASTER=18);;
      bn128) env=(MOEX_WGMMA_BN=128);;
    esac
    echo "== $1 $v" >> "$OUT/bench.log"
    env "${env[@]}" timeout 100 $B --shape "$1" --tokens "$2" >> "$OUT/bench.log" 2>&1
    echo "bench $1 $v rc=$?"
  done
done
grep -E "^==|grouped_mm|error" "$OUT/bench.log"
if [ -n "${NCU:-}" ]; then
  timeout 200 ncu --kernel-name regex:grouped_gemm_wgmma --launch-skip 4 --launch-count 2 \
    ${NCU_SECTIONS:---section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy} \
    build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --min-iters 1 \
    --budget-s 0.1 --no-check --shape mixtral-8x7b --tokens 4096 > "$OUT/ncu.log" 2>&1
  echo "ncu rc=$?"; grep -vE "^==PROF|^ *-+ *$|^$" "$OUT/ncu.log" | cut -c1-160 | head -90
fi
