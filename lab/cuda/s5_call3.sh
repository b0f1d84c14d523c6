#!/usr/bin/env bash
# (wip/cluster-multicast, session 5 call 3) setmaxnreg (producer 40 / consumers 232 registers):
# the CUDA suites with it (clusters on, off, ping-pong), then grouped_mm timings alternating
# main's binary / the raster build without setmaxnreg / this build cooperative, ping-pong, and
# clusters. carry: build-pack (build-gpu, build-main, build-raster)
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
T=build-gpu/tests/test_cuda_backends
# QUICK=1: the default suite only (the first run of this call passed the rest, same library).
VARIANTS=(default MOEX_WGMMA_CLUSTER=0 "MOEX_WGMMA_PINGPONG=both MOEX_WGMMA_CLUSTER=0")
[ -n "${QUICK:-}" ] && VARIANTS=(default)
for v in "${VARIANTS[@]}"; do
  f="$L/tests_$(echo "$v" | tr ' =' '__').log"; filter=""
  [ "$v" != default ] && filter="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*:CudaRoute*"
  env ${v/default/X=1} LD_LIBRARY_PATH=$PWD/build-gpu:$LD_LIBRARY_PATH timeout 150 $T --gtest_brief=1 $filter > "$f" 2>&1
  echo "test_cuda_backends $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]|rror" "$f" | head -8 >> "$S"
done
for t in $([ -z "${QUICK:-}" ] && echo test_experts_fixtures test_experts_consistency); do
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
    bench raster MOEX_WGMMA_CLUSTER=0 build-raster "${s%%:*}" "${s#*:}"
    bench reg MOEX_WGMMA_CLUSTER=0 build-gpu "${s%%:*}" "${s#*:}"
    bench reg_ping "MOEX_WGMMA_CLUSTER=0 MOEX_WGMMA_PINGPONG=both" build-gpu "${s%%:*}" "${s#*:}"
    bench reg_cluster X=1 build-gpu "${s%%:*}" "${s#*:}"
  done
done
M=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_bytes.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed
f="$L/ncu_mixtral_4096_reg.log"
MOEX_WGMMA_CLUSTER=0 LD_LIBRARY_PATH=$PWD/build-gpu timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:grouped_gemm \
  --launch-skip 4 --launch-count 2 --metrics "$M" build-gpu/moex bench experts --device cuda --backends grouped_mm \
  --graph off --no-check --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 --peak-tflops 800 \
  --shape mixtral-8x7b --tokens 4096 > "$f" 2>&1
echo "== ncu mixtral 4096 reg rc=$?" >> "$S"
grep -E "^ +(gpu__time|sm__cycles|dram__|lts__|sm__through)" "$f" | sed -E 's/ +/ /g' | paste -sd' ' >> "$S"
cat "$S"
