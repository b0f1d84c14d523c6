#!/usr/bin/env bash
# Every test: the Release build's GoogleTest suites and Python tests (CTest; python/tests, the
# torch ones skipped where torch is absent), the same GoogleTest suites built with
# AddressSanitizer + UndefinedBehaviorSanitizer, and short libFuzzer runs of the safetensors
# header parser, tensor views, config.json (checkpoint and model side), the shard index and
# tokenizer.json. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
jobs=$(nproc)
logs=$(mktemp -d)
passed=0 failed=0 skipped=0
# Runs ctest with the given arguments and adds its counts to the totals; a skipped test (no GPU,
# a CPU feature this machine lacks) is counted as skipped, never as passed.
run_ctest() {
  local log="$logs/ctest_$RANDOM.log" rc=0
  ctest "$@" 2>&1 | tee "$log" || rc=$?
  local total fail skip
  total=$(grep -oE 'tests failed out of [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  fail=$(grep -oE '[0-9]+ tests failed out of' "$log" | grep -oE '^[0-9]+' || echo 0)
  skip=$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)$' "$log" || true)
  passed=$((passed + total - fail - skip)) failed=$((failed + fail)) skipped=$((skipped + skip))
  return $rc
}

echo "== release build + tests"
bash tools/build.sh
run_ctest --test-dir build --output-on-failure -j"$jobs"

echo "== AddressSanitizer + UndefinedBehaviorSanitizer build + tests (CPU code)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_CUDA=OFF \
  -DMOEX_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== libFuzzer runs: safetensors header, tensor views, config.json, shard index, model config, tokenizer.json"
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_CUDA=OFF \
  -DMOEX_TESTS=OFF -DMOEX_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors_header fuzz_safetensors_get \
  fuzz_checkpoint_config fuzz_checkpoint_index fuzz_tokenizer_json fuzz_model_config
for t in safetensors_header:corpus:safetensors.dict safetensors_get:corpus_safetensors_get:safetensors.dict \
         checkpoint_config:corpus_checkpoint_config:checkpoint.dict \
         checkpoint_index:corpus_checkpoint_index:checkpoint.dict \
         tokenizer_json:corpus_tokenizer_json:tokenizer.dict model_config:corpus_model_config:checkpoint.dict; do
  IFS=: read -r name corpus dict <<<"$t"
  mkdir -p "build-fuzz/$corpus"
  ./build-fuzz/fuzz/fuzz_$name -max_total_time="${MOEX_FUZZ_SECONDS:-60}" -timeout=10 \
    -dict=fuzz/$dict -print_final_stats=1 "build-fuzz/$corpus" "fuzz/$corpus"
done
echo "== fixed-seed smoke runs of every fuzz target (ctest)"
run_ctest --test-dir build-fuzz/fuzz --output-on-failure
echo "all tests passed"
echo "tests: $passed passed, $failed failed, $skipped skipped"
