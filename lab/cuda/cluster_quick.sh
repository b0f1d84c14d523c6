#!/usr/bin/env bash
# (wip/cluster-multicast) The shortest useful device call (under 3 minutes): the CUDA suite with
# the cluster kernel on by default, and, if it passes, grouped_mm with MOEX_WGMMA_CLUSTER = 1 / 0
# alternating on four compute-bound rows (graph off, timings only). carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
timeout 100 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$OUT/tests.log" 2>&1
echo "test_cuda_backends rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')" >> "$S"
grep -E "^\[  FAILED  \]|rror" "$OUT/tests.log" | head -8 >> "$S"
if grep -q "rc=0" "$S"; then
  for v in 1 0 1 0; do
    for s in mixtral-8x7b:1024,4096,16384 deepseek-v3:16384; do
      MOEX_WGMMA_CLUSTER=$v timeout 40 build-gpu/moex bench experts --device cuda --backends grouped_mm \
        --graph off --no-check --min-iters 5 --budget-s 0.3 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
        grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} cluster=$v /; s/ +/ /g" >> "$S"
    done
  done
fi
cat "$S"
