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
bench_switch_rotation MOEX_ATTENTION_SPLITS "$SPLITS" "$dir" "$CASES" || status=1
cat "$S"
exit $status
