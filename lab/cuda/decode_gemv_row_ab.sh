#!/usr/bin/env bash
# Batch-1 decode with the one-row GEMV of lab/cuda/gemv_row_warp_columns.patch (a warp per output
# column, src/ops/cuda/linear_gemv_row.cu once applied and built) against the column-group kernel
# at one row: MOEX_GEMV_ROW=1 (pieces of 8 loads per lane), 2 (pieces of 4), 0 (column groups,
# the kernel of every row count). Runs the GPU tests of the GEMVs
# (CudaLinear.OneRowKernelEqualsColumnGroups holds both one-row forms to the column groups' bits),
# compares the greedy tokens of the settings (they must be equal), runs `bench generate` with the
# settings alternated in one run, then the graph-decode tests.
# Run on a Hopper machine from the repo root:  BUILD=build-gpu bash lab/cuda/decode_gemv_row_ab.sh [MODEL [LAYERS]]
# ROWS (default "0 1 2 0 1 2") orders the bench runs; CASES (default 1x128,8x128) their cases;
# GRAPH_TESTS=0 skips the graph-decode tests.
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}
ROWS=${ROWS:-"0 1 2 0 1 2"}
CASES=${CASES:-1x128,8x128}
status=0
run_gtest test_cuda_linear "$BUILD/tests/test_cuda_linear" || status=1
MOEX_GEMV_ROW=2 run_gtest test_cuda_linear_row4 "$BUILD/tests/test_cuda_linear" \
  --gtest_filter='*OneRow*:*LinearsEqual*:*NormLinears*:*MatchFloat64*:*Independent*' || status=1
dir=$(e2e_checkpoint "$model" "$layers")
ids=$(python3 -c "print(','.join(str(11 + 7 * t) for t in range(128)))")
for r in 0 1 2; do
  MOEX_GEMV_ROW=$r timeout 120 "$BUILD/moex" generate --model "$dir" --device cuda --dtype bfloat16 \
    --prompt-ids "$ids" --max-new-tokens 48 --out "$L/tokens_$r" > "$L/generate_$r.log" 2>&1
  echo "generate MOEX_GEMV_ROW=$r rc=$?" >> "$S"
done
if cmp -s "$L/tokens_0" "$L/tokens_1" && cmp -s "$L/tokens_0" "$L/tokens_2"; then echo "greedy tokens: equal" >> "$S"
else echo "greedy tokens: DIFFER (or a run failed: $L/generate_*.log)" >> "$S"; status=1; fi
bench_switch_rotation MOEX_GEMV_ROW "$ROWS" "$dir" "$CASES" || status=1
# Last, so that a short run keeps the timings: graph replays against direct launches.
[ "${GRAPH_TESTS:-1}" != 0 ] && [ -x "$BUILD/tests/test_cuda_graph_decode" ] &&
  { run_gtest test_cuda_graph_decode "$BUILD/tests/test_cuda_graph_decode" || status=1; }
cat "$S"
exit $status
