#!/usr/bin/env bash
# Session 6, last call: every CUDA suite and variant on the binary of 3b034f0 (the staged
# epilogue moved into its own device function; PTX unchanged but for instruction order), plus
# one timing row as a smoke check. carry: build-pack
set -u
. lab/cuda/device_env.sh
run_all_suites
timeout 30 build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off \
  --min-iters 5 --budget-s 0.3 --shape mixtral-8x7b --tokens 4096 2>&1 | grep -E "grouped_mm|rror" >> "$S"
cat "$S"
