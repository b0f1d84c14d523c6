#!/usr/bin/env bash
# One device call that checks and measures the CUDA experts backends, logs under $OUT.
# Build here first (no GPU needed), then run on the GPU machine with the build carried:
#   cmake -S . -B build-cuda -G Ninja -DMOEX_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
#     -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
#   ninja -C build-cuda -j2 moex_cli test_cuda_backends
#   run: bash lab/cuda/gpu_session.sh [tests|bench|side]...   carry: build-cuda/libmoex.so,
#        build-cuda/moex, build-cuda/tests/test_cuda_backends
# Rough costs seen on the H200: tests ~40 s; bench of the Qwen shape at 4 token counts ~10 s;
# the DeepSeek-V3 shape needs ~22 GB of random host weights (tens of seconds to make and copy).
set -u
export LD_LIBRARY_PATH=$PWD/build-cuda:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/moex_out}
mkdir -p "$OUT"
steps=${*:-tests bench}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for step in $steps; do
  case $step in
    tests)
      timeout 120 build-cuda/tests/test_cuda_backends --gtest_brief=1 > "$OUT/test.log" 2>&1
      echo "tests rc=$?"
      grep -E "FAILED|Failure|backend=|Which is|PASSED" "$OUT/test.log" | head -30 ;;
    bench)
      for s in "qwen1.5-moe-a2.7b 1,4,16,64,256,1024,4096,16384" "mixtral-8x7b 1,16,256,4096" \
               "deepseek-v3 1,16,256,4096"; do
        set -- $s
        timeout 120 build-cuda/moex bench experts --device cuda --shape "$1" --tokens "$2" \
          --graph both --backends batched_mm,grouped_mm --min-iters 10 2>&1 | tee -a "$OUT/bench.log"
      done ;;
    side)
      PYTHONUNBUFFERED=1 timeout 540 python3 bench/side_by_side.py --moex build-cuda/moex \
        --shapes all --tokens 1,16,256,4096 --json-out "$OUT/side_by_side.json" 2>&1 |
        tee "$OUT/side_by_side.log" ;;
  esac
done
