#!/usr/bin/env bash
# One device call for the 64-row wgmma tiles: the CUDA suites under each tile policy, grouped_mm
# on the rows where tile size matters for MOEX_CUDA_TILE_ROWS = default / 16 / 64 / 128, and an
# ncu look at where the time of the two slowest rows goes (per-kernel time, SM / tensor / DRAM
# use; clocks and caches left alone so the times are the real ones).
# Build here: cmake -S . -B build-gpu -G Ninja -DMOEX_CUDA=ON && ninja -C build-gpu
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
#        build-gpu/tests/test_experts_fixtures build-gpu/tests/test_experts_consistency
# env: SKIP_TESTS=1, SKIP_BENCH=1, SKIP_NCU=1 leave parts out.
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  for v in default MOEX_CUDA_TILE_ROWS=64 MOEX_CUDA_GEMM=mma; do
    env ${v/default/X=1} timeout 150 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$OUT/tests_$v.log" 2>&1
    echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests_$v.log" | tr '\n' ' ')"
  done
  for t in test_experts_fixtures test_experts_consistency; do
    timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
  done
fi
B="build-gpu/moex bench experts --device cuda --backends grouped_mm"
if [ -z "${SKIP_BENCH:-}" ]; then
  for rows in ${ROWS:-default 16 64 128}; do
    echo "== tile rows $rows" >> "$OUT/bench.log"
    for s in ${SHAPES:-deepseek-v3:256,1024,4096 qwen1.5-moe-a2.7b:256,1024,4096 mixtral-8x7b:256,1024,4096}; do
      env MOEX_CUDA_TILE_ROWS=${rows/default/0} ${VARIANT_ENV:-X=1} timeout 100 $B --graph on --min-iters 5 \
        --budget-s 1 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
        grep -E "grouped_mm|error" | sed "s/^/${s%%:*} rows=$rows /" >> "$OUT/bench.log"
    done
  done
  cat "$OUT/bench.log"
fi
if [ -z "${SKIP_NCU:-}" ]; then
  K='regex:route_by_expert|gather_sorted|grouped_gemm|combine'
  M0=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
  M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct
  for s in ${NCU_ROWS:-mixtral-8x7b:4096:0 deepseek-v3:1024:0 deepseek-v3:1024:64 deepseek-v3:4096:0 qwen1.5-moe-a2.7b:4096:0}; do
    IFS=: read -r shape T rows <<< "$s"
    for metrics in "$M" "$M0"; do
      env MOEX_CUDA_TILE_ROWS=$rows timeout 120 ncu --cache-control none --clock-control none \
        --kernel-name "$K" --launch-skip 10 --launch-count 10 --metrics "$metrics" \
        $B --graph off --no-check --min-iters 5 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
        --shape "$shape" --tokens "$T" > "$OUT/ncu_${shape}_${T}_${rows}.log" 2>&1
      rc=$?; echo "ncu $s rc=$rc"
      grep -q "Failed to find metric" "$OUT/ncu_${shape}_${T}_${rows}.log" || break
      M=$M0  # a metric name this ncu does not know: the basic set from here on
    done
    grep -E "^  [a-z_ ]*[a-z_]+.*\(|gpu__time|sm__throughput|dram__|per_second|gmma|hit_rate" \
      "$OUT/ncu_${shape}_${T}_${rows}.log" | sed -E 's/\(CUtensorMap.*\)//; s/ +/ /g' | cut -c1-140
  done
  ncu --query-metrics 2>/dev/null | grep -iE "gmma|tensor_op" | cut -c1-120 > "$OUT/ncu_metrics.txt"
  if [ -n "${NCU_FULL:-}" ]; then
    timeout 200 ncu --clock-control none --kernel-name regex:grouped_gemm_wgmma --launch-skip 2 --launch-count 2 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats \
      $B --graph off --no-check --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
      --shape mixtral-8x7b --tokens 4096 > "$OUT/ncu_full_mixtral_4096.log" 2>&1
    echo "ncu full rc=$?"
  fi
fi
