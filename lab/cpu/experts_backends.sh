#!/bin/sh
# The CPU table of docs/cpu.md: every CPU experts backend on the Qwen1.5-MoE-A2.7B experts shape
# (E = 60, k = 4, H = 2048, I = 1408), bf16 and fp32, with `moex bench experts --device cpu`
# (each row checked against eager / the float64 reference before it is timed; weights evicted from
# the caches before every timed call). First all three backends at T = 1 .. 256 (eager and
# batched_mm grow linearly in T, so larger T would take minutes), then grouped_mm alone at
# T = 1 .. 4096. Timings on a shared machine move with its load: the script first waits (up to
# WAIT_S seconds, default 1200) for the 1-minute load average to drop below MAX_LOAD (default 2.5)
# and prints the load before and after.
# Run from the repo root after a CPU build (`bash tools/build.sh`, or any build directory):
#   lab/cpu/experts_backends.sh [build-dir] > cpu_experts.log       (default build dir: build)
# Writes to stdout: a header line (date, CPU model, load), then moex's bench tables.
build=${1:-build}
MAX_LOAD=${MAX_LOAD:-2.5}
WAIT_S=${WAIT_S:-1200}
waited=0
while [ "$(awk -v m="$MAX_LOAD" '{print ($1 < m)}' /proc/loadavg)" != 1 ] && [ $waited -lt "$WAIT_S" ]; do
  sleep 10; waited=$((waited + 10))
done
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC') $(lscpu | grep 'Model name' | sed 's/  */ /g'); load before: $(cat /proc/loadavg)"
for dt in bfloat16 float32; do
  echo "## $dt, every backend"
  "$build/moex" bench experts --device cpu --shape qwen1.5-moe-a2.7b --dtype $dt \
    --backends grouped_mm,batched_mm,eager --tokens 1,4,16,64,256 --min-iters 1 --budget-s 1
  echo "## $dt, grouped_mm"
  "$build/moex" bench experts --device cpu --shape qwen1.5-moe-a2.7b --dtype $dt \
    --backends grouped_mm --tokens 1,4,16,64,256,1024,4096
  echo "# load after $dt: $(cat /proc/loadavg)"
done
