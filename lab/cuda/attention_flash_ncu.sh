#!/usr/bin/env bash
# Nsight Compute sections (speed of light, warp stalls, scheduler, memory, occupancy, source
# counters) of the flash prefill kernel on the Qwen1.5-MoE shape (4096 tokens, 16 heads of 128):
# the first launch of the planned block shape and of the next one the attention lab times
# (lab/cuda/attention_lab.cpp runs the planned shape first, then the others in FlashBlock order).
# Run from the repository root after a CUDA build in build/; writes $OUT/attention_flash_ncu.txt.
set -u
OUT=${OUT:-/tmp}
[ -x /tmp/attention_lab ] || g++ -std=c++20 -O2 -Iinclude -Isrc lab/cuda/attention_lab.cpp -Lbuild -lmoex \
  -Wl,-rpath,$PWD/build -o /tmp/attention_lab
SECTIONS=(--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
          --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section LaunchStats)
# The lab warms each shape 3 times, then times it 20 times: launch 0 is the planned shape, 23 the next.
for skip in 0 23; do
  timeout 200 ncu "${SECTIONS[@]}" --clock-control none --kernel-name regex:attention_flash --launch-skip $skip \
    --launch-count 1 /tmp/attention_lab 2>&1 | grep -v '^{' 
done > "$OUT/attention_flash_ncu.txt"
grep -E "attention_flash|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Issue Slots Busy|L1/TEX Hit|Shared" "$OUT/attention_flash_ncu.txt" | head -60
