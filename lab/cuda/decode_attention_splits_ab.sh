#!/usr/bin/env bash
# Batch-1 decode with the decode attention kernel's cache splits forced (MOEX_ATTENTION_SPLITS=N,
# the measuring switch of lab/cuda/attention_splits_switch.patch, applied and built; 0 = the
# plan's rule), alternated in one `bench generate` run: at a short cache the rule's splits end in
# the last split's combine (dependent L2 round trips); fewer splits trade that for fewer blocks.
# Run on a Hopper machine from the repo root:
#   BUILD=build-gpu bash lab/cuda/decode_attention_splits_ab.sh [MODEL [LAYERS]]
# SPLITS (default "0 1 2 4 0 1 2 4") orders the runs; CASES (default 1x128) their cases.
. lab/cuda/device_env.sh
model=${1:-qwen1.5-moe-a2.7b}; layers=${2:-24}
SPLITS=${SPLITS:-"0 1 2 4 0 1 2 4"}
CASES=${CASES:-1x128}
status=0
dir=$(e2e_checkpoint "$model" "$layers")
i=0
for n in $SPLITS; do
  i=$((i + 1))
  f="$L/splits_${i}_$n.log"
  MOEX_ATTENTION_SPLITS=$n timeout 150 "$BUILD/moex" bench generate --model "$dir" --device cuda --dtype bfloat16 \
    --cases "$CASES" --new-tokens 64 --repeats 3 --experts-implementation auto > "$f" 2>&1 || status=1
  echo "== $(date -u +%T) MOEX_ATTENTION_SPLITS=$n" >> "$S"
  grep -E '^\| [0-9]' "$f" | cut -d'|' -f2-8 >> "$S"
done
cat "$S"
exit $status
