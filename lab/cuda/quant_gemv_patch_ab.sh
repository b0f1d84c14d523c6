#!/usr/bin/env bash
# A lab variant of the one-row quantized GEMV against the library, on one GPU, in one run:
# lab/cuda/fp4_gemv_mma.patch (FP4 on mma.sync) or lab/cuda/quant_gemv_staged_activation_row.patch
# (the activation row staged in shared memory); docs/cuda.md, "The one-row GEMV's instruction
# count", says what each is and what it measured.
#
#   BEFORE=/path/to/build-of-main AFTER=/path/to/build-with-a-patch bash lab/cuda/quant_gemv_patch_ab.sh
#
# Each build directory holds libmoex.so, moex and tests/ (a Release build with MOEX_CUDA=ON, for
# sm_90a). The patched build's quantized tests run first; then `moex bench experts` over the
# DeepSeek-V3 expert size (32 experts, k = 8), FP4 at T = 1, 4 and FP8 at T = 1, 4, 8, 16, main
# and patched alternating for three rounds (the first round checks each result against the
# float64 reference before timing it). Extra environment for the patched runs (its measuring
# switches): AFTER_ENV="MOEX_QUANT_GEMV_STAGE_WARPS=8". Log: $OUT (or .)/quant_gemv_patch_ab.log.
set -u
: "${BEFORE:?build directory of main}" "${AFTER:?build directory with the patch}"
L=${OUT:-.}/quant_gemv_patch_ab.log
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; date -u; } >> "$L"
for t in test_cuda_quant test_quant_linear test_model_quantized; do
  s=$SECONDS
  env LD_LIBRARY_PATH="$AFTER:/usr/local/cuda/lib64" ${AFTER_ENV:-} timeout 120 "$AFTER/tests/$t" --gtest_brief=1 > "$L.t" 2>&1
  echo "== $t rc=$? $((SECONDS-s))s $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$L.t" | tr '\n' ' ')" >> "$L"
  grep -B2 -A8 "Failure" "$L.t" | head -20 >> "$L"; rm -f "$L.t"
done
B="bench experts --device cuda --experts 32 --top-k 8 --hidden 7168 --intermediate 2048 --graph on --budget-s 0.15 --backends batched_mm,grouped_mm"
run() { # label build extra-env bench-args...
  local lab=$1 dir=$2 extra=$3; shift 3
  echo "== $lab $(date -u +%T) $extra $*" >> "$L"
  env LD_LIBRARY_PATH="$dir:/usr/local/cuda/lib64" $extra "$dir/moex" $B "$@" >> "$L" 2>&1
}
for round in 1 2 3; do
  check=$([ $round = 1 ] || echo --no-check)
  for d in "fp4 --tokens 1,4" "fp8 --tokens 1,4,8,16"; do
    run main "$BEFORE" "" --dtype $d $check
    run patched "$AFTER" "${AFTER_ENV:-}" --dtype $d $check
  done
done
date -u >> "$L"
