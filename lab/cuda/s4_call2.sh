#!/usr/bin/env bash
# Session 4's second device call (the first spent its time in the decode benches' host checks).
# 1. ncu per-kernel limits of the three T = 16384 rows (owed for issue 5) on build-gpu-base, which
#    at these sizes runs main's kernels (the decode pipeline change only touches 16-row tiles);
# 2. Mixtral T = 1024 / 4096 again beside transformers' grouped_mm compiled shape-static;
# 3. grouped_mm with fp32 y (base) vs activation-dtype y (build-gpu), timings only.
# carry: build-pack (see s4_check.sh)
set -u
for p in build-pack/*.tar.xz; do [ -e "$p" ] && tar xJf "$p"; done
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d); S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
with() { local d=$1; shift; LD_LIBRARY_PATH=$PWD/$d:/usr/local/cuda/lib64 "$@"; }
trap 'tar czf "$OUT/logs.tgz" -C "$L" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
K='regex:route_by_expert|gather_sorted|grouped_gemm|combine'
M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
for s in ${NCU_ROWS:-mixtral-8x7b:16384 qwen1.5-moe-a2.7b:16384 deepseek-v3:16384}; do
  f="$L/ncu_${s/:/_}.log"; t0=$SECONDS
  with build-gpu-base timeout 110 ncu --cache-control none --clock-control none --kernel-name "$K" \
    --launch-skip 6 --launch-count 6 --metrics "$M" \
    build-gpu-base/moex bench experts --device cuda --backends grouped_mm --graph off --no-check --min-iters 3 \
    --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
  echo "== ncu $s rc=$? $((SECONDS-t0)) s" >> "$S"
  grep -E "^  [a-z_ ]*[a-z_]+.*\(|gpu__time|sm__throughput|dram__|per_second|gmma|hit_rate" "$f" |
    sed -E 's/\(CUtensorMap.*//; s/\(const.*//; s/\(GemmParams.*//; s/ +/ /g' | paste - - - - - - - - >> "$S"
done
t0=$SECONDS
PYTHONUNBUFFERED=1 with build-gpu-base timeout 200 python3 bench/side_by_side.py --moex build-gpu-base/moex \
  --shapes mixtral-8x7b --tokens 1024,4096 --hf-impls grouped_mm --compile yes --compile-mode default \
  --compile-dynamic static --moex-args "--budget-s 1 --min-iters 10" > "$L/sbs_mixtral.log" 2>&1
echo "== side_by_side mixtral rc=$? $((SECONDS-t0)) s" >> "$S"
grep -E "^\||compile" "$L/sbs_mixtral.log" >> "$S"
for round in 1 2; do
  for d in build-gpu-base build-gpu; do
    for s in deepseek-v3:4096,16384 mixtral-8x7b:4096,16384 qwen1.5-moe-a2.7b:4096,16384; do
      with $d timeout 60 $d/moex bench experts --device cuda --backends grouped_mm --graph on --no-check \
        --min-iters 5 --budget-s 0.5 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
        grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} $d r$round /; s/ +/ /g" >> "$S"
    done
  done
done
cat "$S"
