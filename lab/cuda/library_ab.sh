#!/usr/bin/env bash
# Two builds of libmoex.so alternated in one run, on the experts layer and on whole-model decode:
# BASE is a directory holding the library to compare against (e.g. a build of the parent commit),
# BUILD the candidate, whose `moex` runs both (LD_LIBRARY_PATH picks the library). First the
# candidate's GPU tests named in TESTS, then for each label of ORDER ("new base new base" by
# default) `moex bench experts` on the shapes of EXPERTS (lines "SHAPE-FLAGS | DTYPE-FLAGS"),
# then, when MODEL is set, `moex bench generate` on its random-weight checkpoint.
# Run on a Hopper machine from the repo root:
#   BUILD=build-gpu BASE=build-base [MODEL=qwen1.5-moe-a2.7b LAYERS=24] bash lab/cuda/library_ab.sh
# TOKENS (default 4096,8192) the experts rows, BACKENDS (default grouped_mm) their backends, GRAPH
# (default off) their graph setting; CASES (default 1x128) the generate cases.
. lab/cuda/device_env.sh
ORDER=${ORDER:-"new base new base"}
TESTS=${TESTS-"test_cuda_quant test_cuda_backends"}  # TESTS= (empty) runs none
TOKENS=${TOKENS:-4096,8192}
BACKENDS=${BACKENDS:-grouped_mm}
GRAPH=${GRAPH:-off}
CASES=${CASES:-1x128}
EXPERTS=${EXPERTS:-"--shape deepseek-v3 | --dtype fp8
--shape deepseek-v3 | --dtype bfloat16"}
case ${BASE:?set BASE to the directory of the library to compare against} in
  /*) base=$BASE ;; *) base=$PWD/$BASE ;;
esac
status=0
for t in $TESTS; do run_gtest "$t" "$BUILD/tests/$t" || status=1; done
lib_of() { [ "$1" = base ] && echo "$base" || echo "$PWD/$BUILD"; }
i=0
while IFS='|' read -r shape dtype; do
  [ -n "$shape" ] || continue
  for who in $ORDER; do
    i=$((i + 1)); f="$L/experts_${i}_$who.log"
    # shellcheck disable=SC2086  # the flags are words
    LD_LIBRARY_PATH=$(lib_of "$who"):$LD_LIBRARY_PATH timeout 300 "$BUILD/moex" bench experts \
      --device cuda $shape $dtype --tokens "$TOKENS" --backends "$BACKENDS" --graph "$GRAPH" \
      --budget-s 0.2 --no-check > "$f" 2>&1 || status=1
    echo "== $(date -u +%T) $who experts $shape $dtype" >> "$S"
    grep -E "^(${BACKENDS//,/|}|# shape)" "$f" >> "$S"
  done
done <<< "$EXPERTS"
if [ -n "${MODEL:-}" ]; then
  dir=$(e2e_checkpoint "$MODEL" "${LAYERS:-24}")
  for who in $ORDER; do
    i=$((i + 1))
    bench_generate_row "generate_${i}_$who" "$dir" "$CASES" \
      "LD_LIBRARY_PATH=$(lib_of "$who"):$LD_LIBRARY_PATH" || status=1
  done
fi
cat "$S"
exit $status
