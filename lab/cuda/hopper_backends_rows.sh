#!/usr/bin/env bash
# The speed rows the Hopper backends and the quantized experts are judged by, in one run (each row
# checked against eager and the float64 reference before it is timed, unless marked --no-check):
#   1. sonicmoe against grouped_mm (bf16), Qwen1.5-MoE / Mixtral-8x7B / DeepSeek-V3 experts,
#      T = 1024 / 4096 / 16384, with the scratch each allocates;
#   2. DeepSeek-V3's 256 experts in FP8: decode rows (T = 1-64, graphs, the reading L2 flush)
#      for grouped_mm, deepgemm (contiguous layout) and deepgemm_masked, and FP4 decode rows;
#   3. DeepSeek-V3's experts, compute rows (T = 4096-16384) in FP8 and bf16 (grouped_mm, deepgemm);
#   4. bench/fp8_side_by_side.py: moex's FP8 against torch._scaled_grouped_mm, 32 experts (needs
#      torch; skipped with a note without it).
# The masked layout comes from lab/cuda/experts_plan_variants.cpp, built here when missing.
# Run on a Hopper machine from the repo root:  bash lab/cuda/hopper_backends_rows.sh
# Writes $OUT/summary.txt and $OUT/logs/ (set-up: lab/cuda/device_env.sh).
# PARTS (default "1 2 3 4") picks the groups above, to split the run (about 7 minutes in all).
. lab/cuda/device_env.sh
status=0
P=$BUILD/libexperts_plan_variants.so
if [ ! -f "$P" ]; then
  g++ -std=c++20 -O2 -shared -fPIC -Iinclude -Isrc -I/usr/local/cuda/include \
    lab/cuda/experts_plan_variants.cpp -L"$BUILD" -lmoex -Wl,-rpath,"$PWD/$BUILD" -o "$P" \
    > "$L/plugin_build.log" 2>&1 ||
    { echo "plugin build failed: $L/plugin_build.log" >> "$S"; exit 1; }
fi
M=("$BUILD/moex" --plugin "$P" bench experts --device cuda)
row() {  # label, then the bench flags
  local label=$1 f="$L/$1.log"
  shift
  "${M[@]}" "$@" >> "$f" 2>&1 || status=1
  { echo "== $label: $*"; cat "$f"; } >> "$S"
}
PARTS=" ${PARTS:-1 2 3 4} "
part() { [[ $PARTS == *" $1 "* ]]; }
part 1 && for s in qwen1.5-moe-a2.7b mixtral-8x7b deepseek-v3; do
  row "sonicmoe_$s" --shape "$s" --dtype bfloat16 --graph off --budget-s 0.2 \
    --tokens 1024,4096,16384 --backends grouped_mm,sonicmoe
done
part 2 && row deepseek_fp8_decode --shape deepseek-v3 --dtype fp8 --graph on --budget-s 0.15 \
  --tokens 1,2,4,16,64 --backends grouped_mm,deepgemm,deepgemm_masked
part 2 && row deepseek_fp4_decode --shape deepseek-v3 --dtype fp4 --graph on --budget-s 0.15 \
  --tokens 1,2,4,16 --backends batched_mm,grouped_mm
# (Unchecked: the host's float64 check of 256 experts at these sizes takes minutes.)
part 3 && for d in fp8 bfloat16; do
  row "deepseek_${d}_compute" --shape deepseek-v3 --dtype "$d" --graph off --budget-s 0.3 \
    --tokens 4096,8192,16384 --no-check --backends grouped_mm,deepgemm
done
if ! part 4; then
  :
elif python3 -c "import torch" 2> /dev/null; then
  python3 bench/fp8_side_by_side.py --moex "$BUILD/moex" --experts 32 \
    --tokens 256,4096,8192,16384 --json-out "$OUT/fp8_side_by_side.json" \
    > "$L/fp8_side_by_side.log" 2>&1 || status=1
  tail -n 12 "$L/fp8_side_by_side.log" >> "$S"
else
  echo "fp8_side_by_side: skipped (no torch)" >> "$S"
fi
cat "$S"
exit $status
