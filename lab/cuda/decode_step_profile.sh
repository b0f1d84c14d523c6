#!/usr/bin/env bash
# Where one decode step's time goes: every kernel of a `moex generate` run on a random-weight
# checkpoint timed alone by Nsight Compute (gpu__time_duration, DRAM bytes read), direct launches
# (--graph off, so each kernel is its own launch), then condensed per kernel name for one decode
# step (lab/cuda/decode_step_profile.py): time, launches, bytes, GB/s, and the sum against the
# step's measured time. Run on a Hopper machine from the repo root:
#   bash lab/cuda/decode_step_profile.sh [MODEL [LAYERS [BATCH]]]   (default qwen1.5-moe-a2.7b 24 1)
# The checkpoint: e2e_checkpoint (lab/cuda/device_env.sh).
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}; B=${3:-1}
dir=$(e2e_checkpoint "$model" "$layers")
ids=$(python3 -c "print(';'.join(','.join(str(11 + 7 * b + t) for t in range(16)) for b in range($B)))")
M=gpu__time_duration.sum,dram__bytes_read.sum
# Prompt + 4 decode steps; the condenser keeps the last complete step.
timeout 500 ncu --cache-control none --clock-control none --metrics "$M" --csv --print-units base \
  "$BUILD/moex" generate --model "$dir" --device cuda --dtype bfloat16 --prompt-ids "$ids" \
  --max-new-tokens 5 --graph off > "$L/ncu_decode_${model}_b$B.csv" 2> "$L/ncu_decode_${model}_b$B.err"
echo "== ncu decode $model L=$layers B=$B rc=$?" >> "$S"
python3 lab/cuda/decode_step_profile.py "$L/ncu_decode_${model}_b$B.csv" >> "$S"
