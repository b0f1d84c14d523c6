#!/usr/bin/env bash
# (session 5, call 6) Options that may recover the Mixtral T = 4096 / 16384 gap, same binary as
# call 5: ping-pong for the down GEMM only (128-column items: a finer last wave, epilogue off the
# critical path), for gate_up only, 128-column cooperative tiles; grouped_mm graph off, two
# rounds alternating with the default. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
for round in 1 2; do
  for s in mixtral-8x7b:1024,4096,16384 deepseek-v3:4096,16384 qwen1.5-moe-a2.7b:1024,4096,16384; do
    for v in X=1 MOEX_WGMMA_PINGPONG=down MOEX_WGMMA_PINGPONG=gate_up MOEX_WGMMA_BN=128; do
      env $v timeout 60 build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off \
        --no-check --min-iters 5 --budget-s 0.4 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
        grep -E "grouped_mm|rror" | sed -E "s/^/${s%%:*} ${v/X=1/default} /; s/ +/ /g" >> "$S"
    done
  done
done
cat "$S"
