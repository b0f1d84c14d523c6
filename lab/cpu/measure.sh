#!/bin/sh
# Records the CPU numbers of docs/cpu.md: waits (up to WAIT_S seconds) for the 1-minute load
# average to drop below MAX_LOAD, then runs `moex bench experts --device cpu` for grouped_mm over
# all token counts and for the portable backends at the sizes where they finish in seconds.
# Usage: [ONLY_GROUPED=1] lab/cpu/measure.sh [build-dir] > log
build=${1:-build-cpu}
MAX_LOAD=${MAX_LOAD:-2.5}
WAIT_S=${WAIT_S:-1200}
waited=0
while [ "$(awk -v m="$MAX_LOAD" '{print ($1 < m)}' /proc/loadavg)" != 1 ] && [ $waited -lt "$WAIT_S" ]; do
  sleep 10; waited=$((waited + 10))
done
echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC') $(lscpu | grep 'Model name' | sed 's/  */ /g'); load before: $(cat /proc/loadavg)"
for dt in bfloat16 float32; do
  echo "## $dt grouped_mm"
  "$build/moex" bench experts --device cpu --dtype $dt --backends grouped_mm \
    --tokens 1,4,16,64,256,1024,4096
  [ -n "$ONLY_GROUPED" ] && continue
  echo "## $dt eager, batched_mm (small T)"
  "$build/moex" bench experts --device cpu --dtype $dt --backends eager,batched_mm \
    --tokens 1,4,16,64 --min-iters 3 --budget-s 0.5 --no-check
  echo "# load after $dt: $(cat /proc/loadavg)"
done
