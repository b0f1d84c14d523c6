#!/usr/bin/env bash
# Session 4's first device call. Two builds travel: build-gpu-base (main + the 8-stage decode
# pipeline, wip/decode-deep) and build-gpu (that + y in the activation dtype, wip/bf16-y).
# 1. the CUDA suites on build-gpu, default and with MOEX_CUDA_DECODE_STAGES=8 forced;
# 2. decode rows (T = 1, 4, 16) with MOEX_CUDA_DECODE_STAGES = 4 / 8;
# 3. grouped_mm with fp32 y (base) vs activation-dtype y, alternating builds, two rounds;
# 4. ncu per-kernel limits of the three T = 16384 rows (owed for issue 5), and Qwen T = 1 decode.
# carry: build-pack (tar.xz of build-gpu: libmoex.so moex tests/test_cuda_backends
#        tests/test_experts_fixtures tests/test_experts_consistency, and of build-gpu-base:
#        libmoex.so moex)
set -u
for p in build-pack/*.tar.xz; do [ -e "$p" ] && tar xJf "$p"; done  # builds travel packed (carry limit)
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d); S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
with() { local d=$1; shift; LD_LIBRARY_PATH=$PWD/$d:/usr/local/cuda/lib64 "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
if [ -z "${SKIP_TESTS:-}" ]; then
  for v in default MOEX_CUDA_DECODE_STAGES=8 MOEX_CUDA_DECODE_STAGES=4; do
    f="$L/tests_${v//=/_}.log"; filter=""; [ "$v" = default ] || filter="--gtest_filter=*CudaConsistency*:*CudaGraph*"
    env ${v/default/X=1} LD_LIBRARY_PATH=$PWD/build-gpu timeout 150 build-gpu/tests/test_cuda_backends --gtest_brief=1 $filter > "$f" 2>&1
    echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
    grep -E "^\[  FAILED  \]" "$f" | head -5 >> "$S"
  done
  for t in test_experts_fixtures test_experts_consistency; do
    with build-gpu timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$L/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.log" | tr '\n' ' ')" >> "$S"
    grep -E "^\[  FAILED  \]" "$L/$t.log" | head -5 >> "$S"
  done
fi
cat "$S"
if [ -z "${SKIP_DECODE:-}" ]; then
  for st in 4 8 4 8; do
    for s in qwen1.5-moe-a2.7b mixtral-8x7b deepseek-v3; do
      MOEX_CUDA_DECODE_STAGES=$st with build-gpu timeout 60 build-gpu/moex bench experts --device cuda --shape $s \
        --backends batched_mm,grouped_mm --graph on --tokens 1,4,16 --budget-s 1 2>&1 |
        grep -E "_mm|error" | sed "s/^/$s stages=$st /" >> "$L/decode.log"
    done
  done
  sed -E 's/ +/ /g' "$L/decode.log" >> "$S"
fi
if [ -z "${SKIP_Y:-}" ]; then
  for round in 1 2; do
    for d in build-gpu-base build-gpu; do
      for s in ${SHAPES:-mixtral-8x7b:256,1024,4096,16384 deepseek-v3:1024,4096,16384 qwen1.5-moe-a2.7b:1024,4096,16384}; do
        with $d timeout 120 $d/moex bench experts --device cuda --backends grouped_mm --graph on \
          --min-iters 5 --budget-s 1 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
          grep -E "grouped_mm|error" | sed "s/^/${s%%:*} $d r$round /" >> "$L/y.log"
      done
    done
  done
  sed -E 's/ +/ /g' "$L/y.log" >> "$S"
fi
if [ -z "${SKIP_NCU:-}" ]; then
  K='regex:route_by_expert|gather_sorted|grouped_gemm|combine'
  M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
  for s in ${NCU_ROWS:-mixtral-8x7b:16384 qwen1.5-moe-a2.7b:16384 deepseek-v3:16384}; do
    f="$L/ncu_${s/:/_}.log"
    with build-gpu timeout 150 ncu --cache-control none --clock-control none --kernel-name "$K" \
      --launch-skip 6 --launch-count 6 --metrics "$M" \
      build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --no-check --min-iters 3 \
      --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
    echo "== ncu $s rc=$?" >> "$S"
    grep -E "^  [a-z_ ]*[a-z_]+.*\(|gpu__time|sm__throughput|dram__|per_second|gmma|hit_rate" "$f" |
      sed -E 's/\(CUtensorMap.*//; s/\(const.*//; s/\(GemmParams.*//; s/ +/ /g' | paste - - - - - - - - >> "$S"
  done
  M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second
  for st in 4 8; do
    for b in batched_mm grouped_mm; do
      echo "== ncu qwen T=1 $b stages=$st" >> "$S"
      MOEX_CUDA_DECODE_STAGES=$st with build-gpu timeout 40 ncu --cache-control all --clock-control none --launch-skip 20 \
        --launch-count 4 --metrics $M build-gpu/moex bench experts --device cuda --backends $b \
        --graph off --no-check --min-iters 5 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
        --shape qwen1.5-moe-a2.7b --tokens 1 2>&1 | grep -E "^  [a-z_ ]*[a-z_]+.*\(|gpu__time|dram__|per_second" |
        sed -E 's/\(.*//; s/ +/ /g' | paste - - - - >> "$S"
    done
  done
fi
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$S"
