#!/usr/bin/env bash
# The FP8 wgmma experts path on the GPU: its accuracy tests (test_cuda_quant: against the float64
# bounded reference and the CUDA-core tiles; test_cuda_plan), then grouped_mm on DeepSeek-V3's
# experts (E 256, k 8, H 7168, I 2048) at T = 4096 and 16384 in fp8 (float and UE8M0 scales)
# and in bf16 for comparison. Each bench row is checked against the host's eager rows before it
# is timed; TFLOP/s and the fraction of the floor (fp8: FP8 peak = 2 x the measured bf16 one).
# Run on a Hopper machine from the repo root:  bash lab/cuda/fp8_experts.sh
# Writes $OUT/summary.txt and $OUT/logs/ (set-up: lab/cuda/device_env.sh).
. lab/cuda/device_env.sh
status=0
for t in test_cuda_plan test_cuda_quant; do
  run_gtest "$t" "$BUILD/tests/$t" || status=1
done
for d in "fp8" "fp8 --scale-fmt ue8m0" "bfloat16"; do
  f="$L/bench_deepseek_${d// /_}.log"
  # shellcheck disable=SC2086  # $d holds the dtype and its flags
  "$BUILD/moex" bench experts --device cuda --shape deepseek-v3 --dtype $d --tokens 4096,16384 \
    --backends grouped_mm --graph off > "$f" 2>&1 || status=1
  { echo "bench deepseek-v3 $d:"; cat "$f"; } >> "$S"
done
cat "$S"
exit $status
