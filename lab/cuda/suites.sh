#!/usr/bin/env bash
# Every CUDA test suite on the GPU: test_cuda_backends (consistency against the float64 reference,
# graph replay, plan, routing table, runtime; the non-default kernel configurations are set by
# the tests themselves), test_cuda_quant (quantized experts: GEMV, CUDA-core tiles and the FP8
# wgmma kernel against the float64 bounded reference), test_experts_fixtures (transformers'
# experts fixtures on every backend, CPU and CUDA), test_experts_consistency,
# test_model_cuda_experts (model logits on the GPU against transformers and the CPU model),
# test_cuda_deepgemm / test_cuda_sonicmoe (the Hopper-only backends), test_cuda_dynamic_items
# (the wgmma kernels' two schedules, bit for bit), then any ctest entry named CudaBackends.*.
# Run on a Hopper machine from the repo root:  bash lab/cuda/suites.sh
# Writes $OUT/summary.txt (one line per suite, printed at the end) and $OUT/logs/<suite>.log
# (set-up and defaults: lab/cuda/device_env.sh). Exit status: 0 when every suite passed.
. lab/cuda/device_env.sh
status=0
for t in test_cuda_backends test_cuda_quant test_experts_fixtures test_experts_consistency \
  test_model_cuda_experts test_cuda_deepgemm test_cuda_sonicmoe test_cuda_dynamic_items; do
  run_gtest "$t" "$BUILD/tests/$t" || status=1
done
ctest --test-dir "$BUILD" -R '^CudaBackends\.' --no-tests=ignore --output-on-failure \
  > "$L/ctest_cuda_backends.log" 2>&1 || status=1
echo "ctest CudaBackends.*: $(grep -E 'tests passed|No tests were found' "$L/ctest_cuda_backends.log")" >> "$S"
cat "$S"
exit $status
