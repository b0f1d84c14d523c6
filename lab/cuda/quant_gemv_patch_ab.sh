#!/usr/bin/env bash
# The one-row FP4 / FP8 GEMV variants of lab/cuda/fp4_gemv_mma_and_staged_activations.patch
# against the library without it, on one GPU, in one run (docs/cuda.md says what each is).
#
#   BEFORE=/path/to/build-without-patch AFTER=/path/to/build-with-patch bash lab/cuda/fp4_gemv_variants_ab.sh
#
# Each build directory holds libmoex.so, moex and tests/ (a Release build with MOEX_CUDA=ON, for
# sm_90a). The tests of the patched build run first (the GEMV paths with each switch), then
# `moex bench experts` over the DeepSeek-V3 expert size (32 experts, k = 8) for each variant:
# MOEX_FP4_GEMV_MMA=0 turns the tensor-core FP4 GEMV off, MOEX_QUANT_GEMV_STAGE=0 the shared-memory
# activation row, MOEX_BENCH_L2_FLUSH=read the reading L2 flush. Log: $OUT (or .)/fp4_gemv_variants_ab.log.
set -u
: "${BEFORE:?build directory without the patch}" "${AFTER:?build directory with the patch}"
L=${OUT:-.}/fp4_gemv_variants_ab.log
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader; date -u; } >> "$L"
tst() { # label env... test
  local lab=$1; shift; local s=$SECONDS
  env LD_LIBRARY_PATH="$AFTER:/usr/local/cuda/lib64" "$@" --gtest_brief=1 > "$L.t" 2>&1
  echo "== $lab rc=$? $((SECONDS-s))s $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$L.t" | tr '\n' ' ')" >> "$L"
  grep -B2 -A8 "Failure" "$L.t" | head -20 >> "$L"; rm -f "$L.t"
}
for t in test_cuda_quant test_quant_linear test_cuda_plan test_cuda_deepgemm test_model_quantized test_cuda_backends; do
  tst $t timeout 120 "$AFTER/tests/$t"
done
tst "MOEX_FP4_GEMV_MMA=0 test_cuda_quant" MOEX_FP4_GEMV_MMA=0 timeout 60 "$AFTER/tests/test_cuda_quant"
tst "MOEX_FP4_GEMV_MMA=0 MOEX_QUANT_GEMV_STAGE=0 test_cuda_quant" MOEX_FP4_GEMV_MMA=0 MOEX_QUANT_GEMV_STAGE=0 timeout 60 "$AFTER/tests/test_cuda_quant"
B="bench experts --device cuda --experts 32 --top-k 8 --hidden 7168 --intermediate 2048 --graph on --budget-s 0.15 --backends batched_mm,grouped_mm"
run() { # label build env...
  local lab=$1 dir=$2; shift 2
  echo "== $lab $(date -u +%T) $*" >> "$L"
  env LD_LIBRARY_PATH="$dir:/usr/local/cuda/lib64" "$@" >> "$L" 2>&1
}
for round in 1 2; do
  run "before" "$BEFORE" "$AFTER/moex" $B --dtype fp4 --tokens 1,4
  run "tensor cores" "$AFTER" "$AFTER/moex" $B --dtype fp4 --tokens 1,4
  run "staged CUDA-core" "$AFTER" MOEX_FP4_GEMV_MMA=0 "$AFTER/moex" $B --dtype fp4 --tokens 1,4
  run "byte-permute decode only" "$AFTER" MOEX_FP4_GEMV_MMA=0 MOEX_QUANT_GEMV_STAGE=0 "$AFTER/moex" $B --dtype fp4 --tokens 1,4
  run "before" "$BEFORE" "$AFTER/moex" $B --dtype fp8 --tokens 1,4,16
  run "staged" "$AFTER" "$AFTER/moex" $B --dtype fp8 --tokens 1,4,16
done
run "before, reading flush" "$BEFORE" MOEX_BENCH_L2_FLUSH=read "$AFTER/moex" $B --dtype fp8 --tokens 1,16 --no-check
run "staged, reading flush" "$AFTER" MOEX_BENCH_L2_FLUSH=read "$AFTER/moex" $B --dtype fp8 --tokens 1,16 --no-check
date -u >> "$L"
