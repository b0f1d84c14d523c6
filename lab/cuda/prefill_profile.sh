#!/usr/bin/env bash
# Where one prompt's time goes: every kernel of a `moex generate` prompt (one sequence of N
# tokens, default 4096) on a random-weight checkpoint timed alone by Nsight Compute, condensed per
# kernel name (lab/cuda/decode_step_profile.py --prompt). Run on a Hopper machine from the repo
# root:  bash lab/cuda/prefill_profile.sh [MODEL [LAYERS [TOKENS]]]   (default qwen1.5-moe-a2.7b 24 4096)
# The checkpoint: e2e_checkpoint (lab/cuda/device_env.sh).
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}; N=${3:-4096}
dir=$(e2e_checkpoint "$model" "$layers")
ids=$(python3 -c "print(','.join(str(11 + (7 * t) % 30000) for t in range($N)))")
M=gpu__time_duration.sum,dram__bytes_read.sum
timeout 500 ncu --cache-control none --clock-control none --metrics "$M" --csv --print-units base \
  "$BUILD/moex" generate --model "$dir" --device cuda --dtype bfloat16 --prompt-ids "$ids" \
  --max-new-tokens 1 --graph off > "$L/ncu_prefill_${model}_$N.csv" 2> "$L/ncu_prefill_${model}_$N.err"
echo "== ncu prefill $model L=$layers N=$N rc=$?" >> "$S"
python3 lab/cuda/decode_step_profile.py "$L/ncu_prefill_${model}_$N.csv" --prompt >> "$S"
