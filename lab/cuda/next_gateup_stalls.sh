#!/usr/bin/env bash
# (prepared in session 5, run in session 6 with two launches each: gate_up and down) The first device call for Missing item 0 of docs/cuda.md:
# where Mixtral T = 4096's gate_up spends the ~8 % more cycles than transformers' CUTLASS GEMM.
# ncu full sections (warp stall reasons, scheduler, memory workload, source counters) of one
# launch of each: moex's gated wgmma kernel and torch._grouped_mm's CUTLASS kernel, saved as
# .ncu-rep under $OUT for the GUI / `ncu --import ... --page details`. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters --section LaunchStats --section Occupancy"
timeout 200 ncu $SECTIONS --import-source yes --clock-control none --kernel-name regex:grouped_gemm_wgmma \
  --launch-skip 4 --launch-count 2 -o "$OUT/moex_gateup_mixtral4096" build-gpu/moex bench experts \
  --device cuda --backends grouped_mm --graph off --no-check --min-iters 3 --budget-s 0.05 \
  --bandwidth-gbs 4268 --peak-tflops 800 --shape mixtral-8x7b --tokens 4096 > "$OUT/moex_ncu.log" 2>&1
echo "moex ncu rc=$?" >> "$S"
timeout 240 ncu $SECTIONS --clock-control none --profile-from-start off --kernel-name regex:cutlass --launch-count 2 \
  -o "$OUT/cutlass_gateup_mixtral4096" python3 lab/cuda/hf_ncu.py mixtral-8x7b 4096 \
  > "$OUT/hf_ncu.log" 2>&1
echo "cutlass ncu rc=$?" >> "$S"
for r in moex_gateup_mixtral4096 cutlass_gateup_mixtral4096; do
  [ -e "$OUT/$r.ncu-rep" ] && ncu --import "$OUT/$r.ncu-rep" --page details --print-units base 2>/dev/null |
    grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Stall|Issued Warp|No Eligible|Active Warps|Registers|Shared Memory Configuration" |
    sed -E "s/ +/ /g; s/^/$r: /" >> "$S"
done
cat "$S"
