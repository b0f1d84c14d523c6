#!/usr/bin/env bash
# Device call: CUDA tests, then grouped_mm on the compute-bound rows for each wgmma variant
# (env settings, one per word of $VARIANTS, comma-separated assignments).
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_{cuda_backends,experts_fixtures,experts_consistency}
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
if [ -z "${NO_TESTS:-}" ]; then
  for t in test_cuda_backends test_experts_fixtures test_experts_consistency; do
    [ -x build-gpu/tests/$t ] || continue
    timeout 150 build-gpu/tests/$t --gtest_brief=1 > "$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED|Failure" "$OUT/$t.log" | head -10
  done
fi
B="build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --min-iters 5 --budget-s 1"
IFS=';' read -ra SH <<< "${SHAPES:-qwen1.5-moe-a2.7b 1024,4096,16384;deepseek-v3 4096,16384;mixtral-8x7b 256,4096,16384}"
for v in ${VARIANTS:-X=1}; do
  echo "== $v" | tee -a "$OUT/bench.log"
  for s in "${SH[@]}"; do
    set -- $s
    env ${v//,/ } timeout 100 $B --shape "$1" --tokens "$2" 2>&1 | grep -E "grouped_mm|error" | sed "s/^/$1 /" | tee -a "$OUT/bench.log"
  done
done
