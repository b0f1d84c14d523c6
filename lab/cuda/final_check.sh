#!/usr/bin/env bash
# One device call: CUDA tests + fixtures on the GPU, the bench on the three shapes, and the
# transformers side-by-side for the Qwen shape (not compiled: compile times do not fit the lease).
# Build here first: cmake -S . -B build-gpu -G Ninja -DMOEX_CUDA=ON && ninja -C build-gpu
# carry: build-gpu/libmoex.so build-gpu/moex build-gpu/tests/test_cuda_backends
#        build-gpu/tests/test_experts_fixtures build-gpu/tests/test_experts_consistency
set -u
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# Tests were built with absolute data paths under /work/main.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
for t in test_cuda_backends test_experts_fixtures test_experts_consistency; do
  timeout 150 build-gpu/tests/$t --gtest_brief=1 > "$OUT/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
done
PYTHONUNBUFFERED=1 timeout 200 python3 bench/side_by_side.py --moex build-gpu/moex \
  --shapes qwen1.5-moe-a2.7b --tokens 1,4,16,64,256,1024,4096,16384 --compile no \
  --json-out "$OUT/side_by_side.json" > "$OUT/side_by_side.log" 2>&1
echo "side rc=$?"
for s in "mixtral-8x7b 1,16,256,4096" "deepseek-v3 1,16,256,4096"; do
  set -- $s
  timeout 100 build-gpu/moex bench experts --device cuda --shape "$1" --tokens "$2" \
    --graph both --backends batched_mm,grouped_mm --min-iters 10 >> "$OUT/bench_other.log" 2>&1
  echo "bench $1 rc=$?"
done
tail -40 "$OUT/side_by_side.log"
