#!/usr/bin/env bash
# The full same-run comparison of the experts layer with transformers (the H200 table of
# docs/cuda.md): bench/side_by_side.py on Mixtral-8x7B, Qwen1.5-MoE and DeepSeek-V3 shapes,
# T = 1 .. 16384; transformers' eager, batched_mm and grouped_mm, each uncompiled and (batched_mm,
# grouped_mm) under torch.compile with static shapes (one compile per T); moex's batched_mm
# (T <= 64) and grouped_mm with CUDA graphs off and on, each row checked before it is timed.
# Needs torch and transformers (the table used torch 2.11, transformers 5.17).
# Run on a Hopper machine from the repo root:
#   bash lab/cuda/side_by_side.sh                        # every shape, --budget-s 0.3
#   SHAPES=deepseek-v3 BUDGET_S=0.2 bash lab/cuda/side_by_side.sh
# (the table in docs/cuda.md ran Mixtral + Qwen at 0.3 s, then DeepSeek-V3 at 0.2 s: its random
# weights take minutes to make, and 0.2 s per row kept the whole run under 10 minutes).
# Writes $OUT/side_by_side.log (per-shape markdown tables and every transformers time) and
# $OUT/side_by_side.json; set-up and defaults: lab/cuda/device_env.sh.
. lab/cuda/device_env.sh
SHAPES=${SHAPES:-mixtral-8x7b,qwen1.5-moe-a2.7b,deepseek-v3}
PYTHONUNBUFFERED=1 python3 bench/side_by_side.py --moex "$BUILD/moex" --shapes "$SHAPES" \
  --tokens 1,4,16,64,256,1024,4096,16384 --compile yes --compile-mode default \
  --compile-dynamic static --batched-max-tokens 64 \
  --moex-args "--budget-s ${BUDGET_S:-0.3} --min-iters 5" \
  --json-out "$OUT/side_by_side.json" > "$OUT/side_by_side.log" 2>&1
echo "side_by_side rc=$?" >> "$S"
grep -E '^###|^\|' "$OUT/side_by_side.log" >> "$S"
cat "$S"
