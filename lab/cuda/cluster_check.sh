#!/usr/bin/env bash
# (wip/cluster-multicast) One device call for the 2-CTA cluster kernel (weight tiles multicast
# to a pair of 128-row CTAs): the CUDA suites with clusters (default) and without, then grouped_mm
# with MOEX_WGMMA_CLUSTER = 1 / 0 alternating on the compute-bound rows, then ncu of both GEMMs
# (time, clock, SM busy, DRAM and L2 bytes) next to the numbers of transformers' CUTLASS kernel
# in docs/cuda.md, then the shape-static side by side on those rows. First run (2026-11-30): correct
# (26/26) but 1.4-2.0x slower than without clusters; the ncu part asks why (grid size, SM active).
# Build here: ninja -C build-gpu; pack: tar cJf build-pack/gpu.tar.xz build-gpu/libmoex.so
#   build-gpu/moex build-gpu/tests/test_cuda_backends build-gpu/tests/test_experts_fixtures
#   build-gpu/tests/test_experts_consistency        carry: build-pack
# env: SKIP_SBS=1 leaves the side by side out.
set -u
for p in build-pack/gpu.tar.xz; do [ -e "$p" ] && tar xJf "$p"; done
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$(mktemp -d); S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
trap 'tar czf "$OUT/logs.tgz" -C "$L" .' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
for v in default MOEX_WGMMA_CLUSTER=0 MOEX_CUDA_TILE_ROWS=256; do
  f="$L/tests_${v//=/_}.log"; filter=""
  [ "$v" = MOEX_WGMMA_CLUSTER=0 ] && filter="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*"
  [ "$v" = MOEX_CUDA_TILE_ROWS=256 ] && filter="--gtest_filter=*CudaConsistency*:*CudaGraph*"
  env ${v/default/X=1} timeout 150 build-gpu/tests/test_cuda_backends --gtest_brief=1 $filter > "$f" 2>&1
  echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]|error|Error" "$f" | head -5 >> "$S"
done
for t in test_experts_fixtures test_experts_consistency; do
  timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$L/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.log" | tr '\n' ' ')" >> "$S"
done
cat "$S"
grep -q "test_cuda_backends default rc=0" "$S" || { echo "suite failed: no timings"; exit 1; }
# How many pairs the occupancy query allows, and the grid size against the time.
MOEX_WGMMA_DEBUG=1 timeout 40 build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off \
  --no-check --min-iters 3 --budget-s 0.2 --shape mixtral-8x7b --tokens 4096 2>&1 | grep -E "clusters|grouped_mm" >> "$S"
for n in 66 60 48 33; do
  MOEX_WGMMA_CLUSTERS=$n timeout 40 build-gpu/moex bench experts --device cuda --backends grouped_mm \
    --graph off --no-check --min-iters 3 --budget-s 0.3 --shape mixtral-8x7b --tokens 1024,4096 2>&1 |
    grep -E "grouped_mm|error" | sed -E "s/^/mixtral clusters<=$n /; s/ +/ /g" >> "$S"
done
for v in 1 0 1 0; do
  for s in mixtral-8x7b:256,1024,4096,16384 qwen1.5-moe-a2.7b:1024,4096,16384 deepseek-v3:4096,16384; do
    MOEX_WGMMA_CLUSTER=$v timeout 60 build-gpu/moex bench experts --device cuda --backends grouped_mm \
      --graph both --no-check --min-iters 5 --budget-s 0.5 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
      grep -E "grouped_mm|error" | sed -E "s/^/${s%%:*} cluster=$v /; s/ +/ /g" >> "$S"
  done
done
M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,launch__cluster_dim_x,launch__grid_size,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
for v in 1 0; do
  for s in mixtral-8x7b:4096 deepseek-v3:16384; do
    f="$L/ncu_${s/:/_}_cluster$v.log"
    MOEX_WGMMA_CLUSTER=$v timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:grouped_gemm \
      --launch-skip 4 --launch-count 4 --metrics "$M" build-gpu/moex bench experts --device cuda \
      --backends grouped_mm --graph off --no-check --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 \
      --peak-tflops 800 --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
    echo "== ncu $s cluster=$v rc=$?" >> "$S"
    python3 lab/cuda/ncu_condense.py "$f" >> "$S"
  done
done
if [ -z "${SKIP_SBS:-}" ]; then
  PYTHONUNBUFFERED=1 timeout 240 python3 bench/side_by_side.py --moex build-gpu/moex \
    --shapes mixtral-8x7b,deepseek-v3,qwen1.5-moe-a2.7b --tokens 256,1024,4096,16384 --hf-impls grouped_mm \
    --compile yes --compile-mode default --compile-dynamic static --batched-max-tokens 64 \
    --moex-args "--budget-s 1 --min-iters 10" --json-out "$OUT/sbs_static.json" > "$L/sbs_static.log" 2>&1
  echo "== side_by_side static rc=$?" >> "$S"
  grep -E "^\||compiled:" "$L/sbs_static.log" >> "$S"
fi
cat "$S"
