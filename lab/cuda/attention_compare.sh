#!/usr/bin/env bash
# moex's attention op beside torch's sdpa backends on the same H200 (docs/gpu_model.md).
# Run from the repository root after a CUDA build in build/; writes $OUT/attention_compare.log.
set -u
OUT=${OUT:-/tmp}
g++ -std=c++20 -O2 -Iinclude -Isrc -I/usr/local/cuda/include lab/cuda/attention_lab.cpp -Lbuild -lmoex -Wl,-rpath,$PWD/build -o /tmp/attention_lab
{ /tmp/attention_lab; python3 lab/cuda/attention_torch.py; } > "$OUT/attention_compare.log" 2>&1
cat "$OUT/attention_compare.log"
