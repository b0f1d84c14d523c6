#!/usr/bin/env bash
# One device call: the CUDA suites under the default policy and each alternative kernel
# configuration, then grouped_mm under each MOEX_WGMMA_PINGPONG setting on the compute-bound rows,
# then ncu per-kernel times for the Mixtral T = 4096 row (cooperative vs ping-pong).
# Build here: cmake -S . -B build-gpu -G Ninja -DMOEX_CUDA=ON && ninja -C build-gpu
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
#        build-gpu/tests/test_experts_fixtures build-gpu/tests/test_experts_consistency
# Output: $OUT/summary.txt (printed at the end) and $OUT/logs.tgz (every log).
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d)
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
if [ -z "${SKIP_TESTS:-}" ]; then
  for v in ${TEST_VARIANTS:-default MOEX_WGMMA_PINGPONG=both MOEX_WGMMA_PINGPONG=none MOEX_CUDA_TILE_ROWS=64 MOEX_CUDA_GEMM=mma}; do
    f="$L/tests_${v//=/_}.log"
    env ${v/default/X=1} timeout 150 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$f" 2>&1
    echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
    grep -E "^\[  FAILED  \]" "$f" | head -5 >> "$S"
  done
  for t in test_experts_fixtures test_experts_consistency; do
    timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$L/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.log" | tr '\n' ' ')" >> "$S"
  done
fi
B="build-gpu/moex bench experts --device cuda --backends grouped_mm"
if [ -z "${SKIP_BENCH:-}" ]; then
  for v in ${BENCH_VARIANTS:-MOEX_WGMMA_PINGPONG=none MOEX_WGMMA_PINGPONG=gate_up MOEX_WGMMA_PINGPONG=both}; do
    for s in ${SHAPES:-mixtral-8x7b:256,1024,4096,16384 deepseek-v3:1024,4096,16384 qwen1.5-moe-a2.7b:1024,4096,16384}; do
      env $v timeout 120 $B --graph on --min-iters 5 --budget-s 1 --shape "${s%%:*}" \
        --tokens "${s#*:}" 2>&1 | grep -E "grouped_mm|error" | sed "s/^/${s%%:*} $v /" >> "$L/bench.log"
    done
  done
  sed -E 's/ +/ /g' "$L/bench.log" >> "$S"
fi
if [ -z "${SKIP_NCU:-}" ]; then
  K='regex:route_by_expert|gather_sorted|grouped_gemm|combine'
  M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second
  for v in ${NCU_VARIANTS:-MOEX_WGMMA_PINGPONG=none MOEX_WGMMA_PINGPONG=both}; do
    for s in ${NCU_ROWS:-mixtral-8x7b:4096 qwen1.5-moe-a2.7b:4096 deepseek-v3:4096}; do
      f="$L/ncu_${s/:/_}_${v//=/_}.log"
      env $v timeout 120 ncu --cache-control none --clock-control none --kernel-name "$K" \
        --launch-skip 10 --launch-count 5 --metrics "$M" \
        $B --graph off --no-check --min-iters 5 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
        --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
      echo "== ncu $s $v rc=$?" >> "$S"
      grep -E "^  [a-z_ ]*[a-z_]+.*\(|gpu__time|sm__throughput|dram__|per_second" "$f" |
        sed -E 's/\(CUtensorMap.*//; s/\(const.*//; s/\(GemmParams.*//; s/ +/ /g' | paste - - - - - >> "$S"
    done
  done
fi
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$S"
