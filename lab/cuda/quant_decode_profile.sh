#!/usr/bin/env bash
# The quantized decode rows at the acceptance shape and a profile of the one-row GEMV that
# bounds them (docs/cuda.md, "Missing" item 2):
# 1. `moex bench experts --shape deepseek-v3` (256 experts, k = 8) at T = 1, 2, 4, 8, 16: FP8
#    with float and UE8M0 scales (batched_mm, grouped_mm, deepgemm) and FP4 (batched_mm,
#    grouped_mm), graphs, the default reading L2 flush; the first T of each is checked against
#    the float64 reference (the host check of 256 experts is slow, so T > 1 runs --no-check).
# 2. ncu of the one-row GEMV (`grouped_gemv_quant_kernel`, gate_up and down) at T = 1 for FP4
#    and FP8 over 32 DeepSeek-V3-sized experts: speed of light, warp states, scheduler,
#    occupancy, memory workload (ncu's default cache control: caches flushed per replay).
# On a Hopper machine with Nsight Compute, from the repo root: bash lab/cuda/quant_decode_profile.sh
# Writes $OUT/summary.txt, $OUT/logs/*.log and $OUT/gemv_{fp4,fp8}.details.txt; set-up:
# lab/cuda/device_env.sh.
. lab/cuda/device_env.sh
bench() {  # label args...
  local label=$1; shift
  timeout 400 "$BUILD/moex" bench experts --device cuda --graph on --budget-s 0.15 "$@" > "$L/$label.log" 2>&1
  echo "== $label rc=$? $*" >> "$S"
  grep -E "^(batched|grouped)_mm|^deepgemm" "$L/$label.log" >> "$S"
}
D=(--shape deepseek-v3)
bench fp8_t1 "${D[@]}" --dtype fp8 --tokens 1 --backends batched_mm,grouped_mm,deepgemm
bench fp8 "${D[@]}" --dtype fp8 --tokens 2,4,8,16 --backends batched_mm,grouped_mm,deepgemm --no-check
bench fp8_ue8m0 "${D[@]}" --dtype fp8 --scale-fmt ue8m0 --tokens 1,4,8,16 --backends batched_mm,grouped_mm,deepgemm --no-check
bench fp4_t1 "${D[@]}" --dtype fp4 --tokens 1 --backends batched_mm,grouped_mm
bench fp4 "${D[@]}" --dtype fp4 --tokens 2,4,8,16 --backends batched_mm,grouped_mm --no-check
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section MemoryWorkloadAnalysis --section LaunchStats)
for dt in fp4 fp8; do
  timeout 300 ncu "${SECTIONS[@]}" --kernel-name regex:grouped_gemv_quant --launch-skip 8 --launch-count 2 \
    -o "$OUT/gemv_$dt" "$BUILD/moex" bench experts --device cuda --experts 32 --top-k 8 --hidden 7168 \
    --intermediate 2048 --dtype $dt --tokens 1 --backends batched_mm --graph off --no-check \
    --min-iters 3 --budget-s 0.02 --bandwidth-gbs 3000 --peak-tflops 50 > "$L/ncu_gemv_$dt.log" 2>&1
  echo "== ncu gemv $dt rc=$?" >> "$S"
  [ -e "$OUT/gemv_$dt.ncu-rep" ] && ncu --import "$OUT/gemv_$dt.ncu-rep" --page details --print-units base \
    > "$OUT/gemv_$dt.details.txt" 2>&1
done
cat "$S"
