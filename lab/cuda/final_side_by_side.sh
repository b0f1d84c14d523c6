#!/usr/bin/env bash
# The session's last device call: the CUDA suites on the submitted code, then the side-by-side
# table with transformers compiled *and* not, in the same run (bench/side_by_side.py).
# Compile settings chosen to fit one 10-minute call: torch.compile default mode with automatic
# dynamic shapes (one compile for the first T, one dynamic recompile for the rest; the grouped
# GEMM itself is torch._grouped_mm either way, compile fuses what is around it).
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
#        build-gpu/tests/test_experts_fixtures build-gpu/tests/test_experts_consistency
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
S="$OUT/summary.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
for v in default MOEX_CUDA_GEMM=mma MOEX_CUDA_TILE_ROWS=64 MOEX_WGMMA_PINGPONG=both; do
  f="$OUT/tests.log"
  echo "### test_cuda_backends $v" >> "$f"
  filter=""; [ "$v" = default ] || filter="--gtest_filter=CudaConsistency*:CudaGraph*"
  env ${v/default/X=1} timeout 120 build-gpu/tests/test_cuda_backends --gtest_brief=1 $filter >> "$f" 2>&1
  echo "test_cuda_backends $v rc=$?" >> "$S"
done
for t in test_experts_fixtures test_experts_consistency; do
  echo "### $t" >> "$OUT/tests.log"
  timeout 120 build-gpu/tests/$t --gtest_brief=1 >> "$OUT/tests.log" 2>&1
  echo "$t rc=$?" >> "$S"
done
grep -E "^\[  (PASSED|FAILED)|^###" "$OUT/tests.log" >> "$S"
cat "$S"
PYTHONUNBUFFERED=1 timeout ${SIDE_TIMEOUT:-420} python3 bench/side_by_side.py --moex build-gpu/moex \
  --shapes ${SHAPES:-mixtral-8x7b,deepseek-v3,qwen1.5-moe-a2.7b} --tokens 1,4,16,64,256,1024,4096,16384 \
  --compile yes --compile-mode default --compile-dynamic auto --batched-max-tokens 64 \
  --moex-args "--budget-s 0.5 --min-iters 5" --json-out "$OUT/side_by_side.json" > "$OUT/side_by_side.log" 2>&1
echo "side_by_side rc=$?" | tee -a "$S"
grep -E "^#|^\||^###" "$OUT/side_by_side.log" | grep -vE "^# hf" | tail -60
