#!/usr/bin/env bash
# Session 4's last device call: what transformers' compiled grouped_mm (torch._grouped_mm,
# CUTLASS) does differently on the compute-bound rows where it ties or beats moex: ncu per-kernel
# time, clock, SM busy, DRAM bytes, L2 hit rate and L2 throughput for both, Mixtral T = 4096 and
# DeepSeek T = 16384; then the raster group size on main's kernels.
# carry: build-pack (base.tar.xz = main's kernels + the decode option; see s4_check.sh)
set -u
for p in build-pack/base.tar.xz; do [ -e "$p" ] && tar xJf "$p"; done
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d); S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu-base:/usr/local/cuda/lib64
trap 'tar czf "$OUT/logs.tgz" -C "$L" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,launch__cluster_dim_x,launch__cluster_dim_y,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic
filt() { grep -E "^  [^ ].*\(|^    [a-z_]+__[a-z_.]+|^  [a-zA-Z_].*[a-z]+<" "$1" | sed -E 's/\(CUtensorMap.*//; s/\(const .*//; s/\(GemmParams.*//; s/ +/ /g' | cut -c1-230; }
for s in mixtral-8x7b:4096 deepseek-v3:16384; do
  f="$L/ncu_hf_${s/:/_}.log"; t0=$SECONDS
  timeout 150 ncu --profile-from-start off --cache-control none --clock-control none --metrics "$M" \
    python3 lab/cuda/hf_ncu.py "${s%%:*}" "${s#*:}" > "$f" 2>&1
  echo "== ncu transformers $s rc=$? $((SECONDS-t0)) s" >> "$S"; filt "$f" >> "$S"
  f="$L/ncu_moex_${s/:/_}.log"; t0=$SECONDS
  timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:grouped_gemm \
    --launch-skip 4 --launch-count 4 --metrics "$M" \
    build-gpu-base/moex bench experts --device cuda --backends grouped_mm --graph off --no-check --min-iters 3 \
    --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
  echo "== ncu moex $s rc=$? $((SECONDS-t0)) s" >> "$S"; filt "$f" >> "$S"
done
for r in 8 2 4 16 32 8; do
  for s in mixtral-8x7b:1024,4096,16384 deepseek-v3:4096,16384; do
    MOEX_WGMMA_RASTER=$r timeout 60 build-gpu-base/moex bench experts --device cuda --backends grouped_mm \
      --graph off --no-check --min-iters 5 --budget-s 0.5 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
      grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} raster=$r /; s/ +/ /g" >> "$S"
  done
done
cat "$S"
