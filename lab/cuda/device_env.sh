# Shared set-up of the lab/cuda scripts (sourced, not run). On a Hopper machine, from the repo root:
# - BUILD (default build-gpu): the CUDA build; configured and built here if it has no moex yet
#   (sm_90a; the two C++20 flags are for CMake 3.25, which does not know nvcc 13's, see docs/cuda.md);
# - OUT (default /tmp/moex_out): where the script writes; $OUT/summary.txt collects one line per
#   step, $OUT/logs/ the full output of each step;
# - records the GPU (name, driver, max SM clock, power limit) at the top of the summary;
# - defines `run_gtest LABEL BINARY [ARGS...]`: one GoogleTest binary, its result line and
#   failures appended to the summary, its rc returned;
# - defines `e2e_checkpoint MODEL LAYERS`: prints the directory of bench/e2e_side_by_side.py's
#   random-weight checkpoint of that shape under $WORK (default /tmp/moex_e2e), made if missing;
# - defines `bench_generate_row LABEL DIR CASES [VAR=VALUE...]`: one `moex bench generate` on DIR
#   (64 new tokens, 3 repeats, experts auto) with those variables set (LD_LIBRARY_PATH=... picks
#   another library), its rows appended to the summary under LABEL; its rc returned;
# - defines `bench_switch_rotation VAR "VALUES" DIR CASES`: bench_generate_row once per value, in
#   order, with the measuring switch VAR set to it; rc 1 if a run failed.
set -u
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-/tmp/moex_out}
L=$OUT/logs
S=$OUT/summary.txt
mkdir -p "$L"
if [ ! -x "$BUILD/moex" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DMOEX_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 \
    -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20 > "$L/configure.log" 2>&1 &&
    cmake --build "$BUILD" > "$L/build.log" 2>&1 || { echo "build failed: $L/build.log" >&2; exit 1; }
fi
export LD_LIBRARY_PATH=$PWD/$BUILD:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') $(git rev-parse --short HEAD 2>/dev/null)" \
  "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader)" >> "$S"

run_gtest() {  # label binary [args...]
  local label=$1 bin=$2; shift 2
  local f="$L/$label.log"
  timeout 900 "$bin" --gtest_brief=1 "$@" > "$f" 2>&1
  local rc=$?
  echo "$label rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E '^\[  FAILED  \]' "$f" | head -8 >> "$S"
  return $rc
}

e2e_checkpoint() {  # model layers
  local work=${WORK:-/tmp/moex_e2e}
  local dir=$work/$1-$2l  # the directory bench/e2e_side_by_side.py names
  if [ ! -f "$dir/config.json" ]; then
    python3 bench/e2e_side_by_side.py --moex "$BUILD/moex" --models "$1" --layers "$2" \
      --cases 1x8 --new-tokens 2 --repeats 1 --hf-impls none --work "$work" > "$L/checkpoint.log" 2>&1
  fi
  echo "$dir"
}

bench_generate_row() {  # label dir cases [VAR=VALUE...]
  local label=$1 dir=$2 cases=$3 rc
  shift 3
  local f="$L/bench_$(printf '%s' "$label" | tr -c 'A-Za-z0-9_.=-' '_').log"
  env "$@" timeout 150 "$BUILD/moex" bench generate --model "$dir" --device cuda --dtype bfloat16 \
    --cases "$cases" --new-tokens 64 --repeats 3 --experts-implementation auto > "$f" 2>&1
  rc=$?
  echo "== $(date -u +%T) $label" >> "$S"
  grep -E '^\| [0-9]' "$f" | cut -d'|' -f2-8 >> "$S"
  return $rc
}

bench_switch_rotation() {  # var "values" dir cases
  local var=$1 values=$2 dir=$3 cases=$4 i=0 v rc=0
  for v in $values; do
    i=$((i + 1))
    bench_generate_row "${var}_${i}_$v" "$dir" "$cases" "$var=$v" || rc=1
  done
  return $rc
}
