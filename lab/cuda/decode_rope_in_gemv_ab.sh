#!/usr/bin/env bash
# Decode with rope and the cache append inside the one-row q / k / v GEMV (MOEX_ROPE_IN_GEMV=1)
# against the two launches (=0), with lab/cuda/rope_in_qkv_gemv.patch applied and built: the GPU
# tests of the GEMV (CudaLinear.NormQkvRopeAppendIsNormLinearsThenRopeAppend holds the one launch
# to the two ops' bits), the greedy tokens of both against each other (they must be equal), and
# `bench generate` with the settings alternated in one run. The patch also loads every one-row
# GEMV's bias a group ahead, whatever MOEX_ROPE_IN_GEMV says; to see that part alone, set BASE to
# the library folder of a build without the patch: its runs join the rotation as "base".
# Run on a Hopper machine from the repo root:
#   BUILD=build-gpu [BASE=build-base] bash lab/cuda/decode_rope_in_gemv_ab.sh [MODEL [LAYERS]]
# ROPES (default "0 1 base 0 1 base", base only with BASE) orders the bench runs; CASES (default
# 1x128,8x128) their cases.
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}
ROPES=${ROPES:-"0 1 base 0 1 base"}
[ -n "${BASE:-}" ] || ROPES=$(printf '%s\n' $ROPES | grep -vx base | tr '\n' ' ')
CASES=${CASES:-1x128,8x128}
status=0
run_gtest test_cuda_linear "$BUILD/tests/test_cuda_linear" || status=1
run_gtest test_cuda_graph_decode "$BUILD/tests/test_cuda_graph_decode" || status=1
dir=$(e2e_checkpoint "$model" "$layers")
ids=$(python3 -c "print(','.join(str(11 + 7 * t) for t in range(128)))")
for r in 0 1; do
  MOEX_ROPE_IN_GEMV=$r timeout 120 "$BUILD/moex" generate --model "$dir" --device cuda --dtype bfloat16 \
    --prompt-ids "$ids" --max-new-tokens 48 --out "$L/tokens_$r" > "$L/generate_$r.log" 2>&1
  echo "generate MOEX_ROPE_IN_GEMV=$r rc=$?" >> "$S"
done
if cmp -s "$L/tokens_0" "$L/tokens_1"; then echo "greedy tokens: equal" >> "$S"
else echo "greedy tokens: DIFFER (or a run failed: $L/generate_*.log)" >> "$S"; status=1; fi
i=0
for r in $ROPES; do
  i=$((i + 1))
  lib=$PWD/$BUILD; rope=$r
  if [ "$r" = base ]; then
    rope=0
    case $BASE in /*) lib=$BASE ;; *) lib=$PWD/$BASE ;; esac
  fi
  bench_generate_row "${i}_$r" "$dir" "$CASES" "LD_LIBRARY_PATH=$lib:$LD_LIBRARY_PATH" \
    "MOEX_ROPE_IN_GEMV=$rope" || status=1
done
cat "$S"
exit $status
