#!/usr/bin/env bash
# Decode with the one-row GEMV's weight ring at several depths (MOEX_GEMV_STAGES, a measuring
# switch; 0 = the register path that keeps one chunk in flight per block): the GPU tests of the
# GEMV (CudaLinear.WeightRingEqualsRegisterPath holds every depth to depth 0's bits) and of graph
# decode, the greedy tokens of each depth against depth 0 (the same products in the
# same order: they must be equal), `bench generate` A/B/A/B in one run, and the decode step's
# kernel timeline at two depths (lab/cuda/decode_trace.cpp, when built).
# The ring and its switches exist only with lab/cuda/gemv_weight_ring.patch applied (it lost:
# docs/gpu_model.md). Run on a Hopper machine from the repo root, the patch applied and built:
#   bash lab/cuda/decode_gemv_stages_ab.sh [MODEL [LAYERS]]   (default qwen1.5-moe-a2.7b 24)
# STAGES (default "0 3 6 0 3 6"; "3:n" = depth 3 in the norm-forming GEMVs only) orders the bench
# runs; CASES (default 1x128,8x128) their cases.
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}
STAGES=${STAGES:-"0 3 6 0 3 6"}
CASES=${CASES:-1x128,8x128}
depths=$(printf '%s\n' $STAGES | sed 's/:n$//' | sort -un)
status=0
run_gtest test_cuda_linear "$BUILD/tests/test_cuda_linear" || status=1  # every depth, bit for bit
run_gtest test_cuda_graph_decode "$BUILD/tests/test_cuda_graph_decode" || status=1
t0=$(date +%s)
dir=$(e2e_checkpoint "$model" "$layers")
echo "checkpoint $dir $(( $(date +%s) - t0 ))s" >> "$S"
ids=$(python3 -c "print(','.join(str(11 + 7 * t) for t in range(128)))")
for st in $depths; do
  MOEX_GEMV_STAGES=$st timeout 120 "$BUILD/moex" generate --model "$dir" --device cuda --dtype bfloat16 \
    --prompt-ids "$ids" --max-new-tokens 48 --out "$L/tokens_$st" > "$L/generate_$st.log" 2>&1
  echo "generate depth $st rc=$?: $(tail -c 300 "$L/generate_$st.log")" >> "$S"
  if cmp -s "$L/tokens_$st" "$L/tokens_$(echo "$depths" | head -1)"; then
    echo "greedy tokens, depth $st: equal to depth $(echo "$depths" | head -1)" >> "$S"
  else
    echo "greedy tokens, depth $st: DIFFER (or the run failed: $L/generate_$st.log)" >> "$S"; status=1
  fi
done
i=0
for st in $STAGES; do  # a depth, or depth:n for the ring in the norm-forming GEMVs only
  i=$((i + 1))
  f="$L/bench_${i}_stages$st.log"
  n=0; case $st in *:n) st=${st%:n}; n=1 ;; esac
  MOEX_GEMV_RING_NORM_ONLY=$n MOEX_GEMV_STAGES=$st timeout 150 "$BUILD/moex" bench generate \
    --model "$dir" --device cuda --dtype bfloat16 --cases "$CASES" --new-tokens 64 --repeats 2 --experts-implementation auto \
    > "$f" 2>&1 || status=1
  echo "== $(date -u +%T) MOEX_GEMV_STAGES=$st MOEX_GEMV_RING_NORM_ONLY=$n" >> "$S"
  grep -E '^\| [0-9]' "$f" | cut -d'|' -f2-8 >> "$S"
done
if [ -x "$BUILD/decode_trace" ]; then
  for st in 0 3; do
    MOEX_GEMV_STAGES=$st timeout 120 "$BUILD/decode_trace" --model "$dir" --batch 1 --prompt 128 \
      --new-tokens 16 --timeline 30 > "$L/trace_stages$st.log" 2>&1
    { echo "== trace MOEX_GEMV_STAGES=$st"; grep -E -A12 "^decode step" "$L/trace_stages$st.log"; } >> "$S"
  done
fi
cat "$S"
exit $status
