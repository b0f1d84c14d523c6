#!/usr/bin/env bash
# Every test: the Release build's GoogleTest suites (CTest), the same suites built with
# AddressSanitizer + UndefinedBehaviorSanitizer, and a short libFuzzer run of the safetensors
# header parser. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
jobs=$(nproc)

echo "== release build + tests"
bash tools/build.sh
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build + tests (CPU code)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_CUDA=OFF \
  -DMOEX_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== libFuzzer smoke run of the safetensors header parser"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_CUDA=OFF \
  -DMOEX_TESTS=OFF -DMOEX_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors_header
mkdir -p build-fuzz/corpus
./build-fuzz/fuzz/fuzz_safetensors_header -max_total_time="${MOEX_FUZZ_SECONDS:-60}" -timeout=10 \
  -dict=fuzz/safetensors.dict -print_final_stats=1 build-fuzz/corpus fuzz/corpus
echo "all tests passed"
