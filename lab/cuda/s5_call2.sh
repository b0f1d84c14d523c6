#!/usr/bin/env bash
# (wip/cluster-multicast, session 5 call 2) Expert-aligned raster groups + column-split half tiles
# in the cluster kernel: the CUDA suites (default = clusters, MOEX_WGMMA_CLUSTER=0, 256-row tiles
# everywhere), then grouped_mm timings alternating main's binary (build-main) / branch without
# clusters / branch with clusters, then ncu DRAM and L2 bytes of the three. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
T=build-gpu/tests/test_cuda_backends
for v in default MOEX_WGMMA_CLUSTER=0 MOEX_CUDA_TILE_ROWS=256; do
  f="$L/tests_${v//=/_}.log"; filter=""
  [ "$v" != default ] && filter="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*:CudaRoute*"
  env ${v/default/X=1} LD_LIBRARY_PATH=$PWD/build-gpu:$LD_LIBRARY_PATH timeout 150 $T --gtest_brief=1 $filter > "$f" 2>&1
  echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]|rror" "$f" | head -8 >> "$S"
done
for t in test_experts_fixtures test_experts_consistency; do
  LD_LIBRARY_PATH=$PWD/build-gpu:$LD_LIBRARY_PATH timeout 120 build-gpu/tests/$t --gtest_brief=1 > "$L/$t.log" 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/$t.log" | tr '\n' ' ')" >> "$S"
done
cat "$S"
grep -q "test_cuda_backends default rc=0" "$S" || { echo "suite failed: no timings"; exit 1; }
bench() {  # name env build shape tokens
  env $2 LD_LIBRARY_PATH=$PWD/$3 timeout 60 $3/moex bench experts --device cuda --backends grouped_mm \
    --graph off --no-check --min-iters 5 --budget-s 0.4 --shape "$4" --tokens "$5" 2>&1 |
    grep -E "grouped_mm|rror" | sed -E "s/^/$4 $1 /; s/ +/ /g" >> "$S"
}
for round in 1 2; do
  for s in mixtral-8x7b:256,1024,4096,16384 deepseek-v3:1024,4096,16384 qwen1.5-moe-a2.7b:1024,4096,16384; do
    bench main X=1 build-main "${s%%:*}" "${s#*:}"
    bench raster MOEX_WGMMA_CLUSTER=0 build-gpu "${s%%:*}" "${s#*:}"
    bench cluster X=1 build-gpu "${s%%:*}" "${s#*:}"
  done
done
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
for cfg in "main X=1 build-main" "raster MOEX_WGMMA_CLUSTER=0 build-gpu" "cluster X=1 build-gpu"; do
  set -- $cfg
  for s in mixtral-8x7b:4096 deepseek-v3:16384; do
    f="$L/ncu_${s/:/_}_$1.log"
    env $2 LD_LIBRARY_PATH=$PWD/$3 timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:grouped_gemm \
      --launch-skip 4 --launch-count 2 --metrics "$M" $3/moex bench experts --device cuda --backends grouped_mm \
      --graph off --no-check --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
      --shape "${s%%:*}" --tokens "${s#*:}" > "$f" 2>&1
    echo "== ncu $s $1 rc=$?" >> "$S"
    grep -E "^ +(gpu__time|sm__cycles|dram__|lts__|sm__through)" "$f" | sed -E 's/ +/ /g' | paste -sd' ' >> "$S"
  done
done
cat "$S"
