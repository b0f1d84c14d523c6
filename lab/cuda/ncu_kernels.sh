#!/usr/bin/env bash
# Kernel profiles of one experts forward, moex grouped_mm against transformers' grouped_mm
# compiled shape-static (torch._grouped_mm, a CUTLASS kernel): per kernel launch its time, SM
# clock, SM busy, DRAM and L2 throughput, DRAM bytes read, L2 bytes and hit rate (ncu
# --clock-control none --cache-control none: the clocks the power cap gives, caches as they are).
# With FULL=1 also the full ncu sections (warp stalls, scheduler, memory tables, SASS source view
# with stall samples) of moex's wgmma GEMMs and the CUTLASS kernels, as .ncu-rep files and text.
# Run on a Hopper machine with Nsight Compute, from the repo root:
#   [BACKEND=sonicmoe] bash lab/cuda/ncu_kernels.sh [SHAPE [T]]      (default mixtral-8x7b 4096)
# BACKEND (default grouped_mm) names moex's backend; sonicmoe's forward has no gather launch.
# Writes $OUT/ncu_moex_SHAPE_T.log, $OUT/ncu_transformers_SHAPE_T.log (raw ncu output), one
# condensed line per launch in $OUT/summary.txt (lab/cuda/ncu_condense.py), with FULL=1
# $OUT/{moex,cutlass}_SHAPE_T.{ncu-rep,details.txt}; set-up and defaults: lab/cuda/device_env.sh.
. lab/cuda/device_env.sh
shape=${1:-mixtral-8x7b}; T=${2:-4096}
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum
M=$M,lts__t_sector_hit_rate.pct,lts__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,launch__cluster_dim_x,launch__grid_size,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
# One forward is five launches (route, gather, gate_up, down, combine); skip the warm-up ones.
BENCH=("$BUILD/moex" bench experts --device cuda --backends "${BACKEND:-grouped_mm}" --graph off --no-check
       --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 --shape "$shape" --tokens "$T")
timeout 300 ncu --cache-control none --clock-control none --metrics "$M" --launch-skip 20 --launch-count 5 \
  --kernel-name 'regex:route_by_expert|gather_sorted|grouped_gemm|combine' "${BENCH[@]}" \
  > "$OUT/ncu_moex_${shape}_$T.log" 2>&1
echo "== ncu moex $shape T=$T rc=$?" >> "$S"
timeout 400 ncu --cache-control none --clock-control none --metrics "$M" --profile-from-start off \
  python3 lab/cuda/hf_ncu.py "$shape" "$T" > "$OUT/ncu_transformers_${shape}_$T.log" 2>&1
echo "== ncu transformers $shape T=$T rc=$?" >> "$S"
python3 lab/cuda/ncu_condense.py "$OUT/ncu_moex_${shape}_$T.log" "$OUT/ncu_transformers_${shape}_$T.log" >> "$S"
if [ -n "${FULL:-}" ]; then
  SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats
            --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
            --section SourceCounters --section LaunchStats --section Occupancy)
  timeout 400 ncu "${SECTIONS[@]}" --import-source yes --clock-control none --launch-skip 4 --launch-count 2 \
    --kernel-name regex:grouped_gemm_wgmma -o "$OUT/moex_${shape}_$T" "${BENCH[@]}" > "$L/ncu_full_moex.log" 2>&1
  echo "== ncu full moex rc=$?" >> "$S"
  # torch names the CUTLASS kernel cutlass::device_kernel<...>
  timeout 400 ncu "${SECTIONS[@]}" --clock-control none --profile-from-start off --launch-count 2 \
    --kernel-name regex:device_kernel -o "$OUT/cutlass_${shape}_$T" python3 lab/cuda/hf_ncu.py "$shape" "$T" \
    > "$L/ncu_full_cutlass.log" 2>&1
  echo "== ncu full cutlass rc=$?" >> "$S"
  for r in "moex_${shape}_$T" "cutlass_${shape}_$T"; do
    [ -e "$OUT/$r.ncu-rep" ] && ncu --import "$OUT/$r.ncu-rep" --page details --print-units base > "$OUT/$r.details.txt" 2>&1
  done
fi
cat "$S"
