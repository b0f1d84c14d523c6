#!/usr/bin/env bash
# (wip/cluster-multicast, session 5 call 1) Why the 2-CTA cluster kernel is slower: the suite,
# the occupancy query's pair count, a pair-count sweep, cluster 1/0 A/B on compute-bound rows,
# ncu (grid, SM active, clock, L2/DRAM bytes) of both at Mixtral T = 4096. carry: build-pack
set -u
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"
timeout 100 build-gpu/tests/test_cuda_backends --gtest_brief=1 > "$L/tests.log" 2>&1
echo "test_cuda_backends rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$L/tests.log" | tr '\n' ' ')" >> "$S"
grep -E "^\[  FAILED  \]|rror" "$L/tests.log" | head -8 >> "$S"
B="build-gpu/moex bench experts --device cuda --backends grouped_mm --graph off --no-check"
MOEX_WGMMA_DEBUG=1 timeout 40 $B --min-iters 3 --budget-s 0.2 --shape mixtral-8x7b --tokens 4096 2>&1 | grep -E "clusters|grouped_mm|rror" >> "$S"
for n in 66 50 33 16; do
  MOEX_WGMMA_CLUSTERS=$n timeout 40 $B --min-iters 5 --budget-s 0.3 --shape mixtral-8x7b --tokens 4096 2>&1 |
    grep -E "grouped_mm|rror" | sed -E "s/^/mixtral pairs<=$n /; s/ +/ /g" >> "$S"
done
for v in 1 0 1 0; do
  for s in mixtral-8x7b:1024,4096,16384 deepseek-v3:16384; do
    MOEX_WGMMA_CLUSTER=$v timeout 40 $B --min-iters 5 --budget-s 0.3 --shape "${s%%:*}" --tokens "${s#*:}" 2>&1 |
      grep -E "grouped_mm|rror" | sed -E "s/^/${s%%:*} cluster=$v /; s/ +/ /g" >> "$S"
  done
done
M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,lts__t_bytes.sum,launch__cluster_dim_x,launch__grid_size,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
for v in 1 0; do
  f="$L/ncu_mixtral4096_cluster$v.log"
  MOEX_WGMMA_CLUSTER=$v timeout 100 ncu --cache-control none --clock-control none --kernel-name regex:grouped_gemm \
    --launch-skip 4 --launch-count 2 --metrics "$M" $B --min-iters 3 --budget-s 0.05 --bandwidth-gbs 4268 \
    --peak-tflops 800 --shape mixtral-8x7b --tokens 4096 > "$f" 2>&1
  echo "== ncu mixtral 4096 cluster=$v rc=$?" >> "$S"
  grep -E "grouped_gemm|launch__|sm__|gpu__time|dram__|lts__" "$f" | sed -E 's/ +/ /g' | cut -c1-160 >> "$S"
done
cat "$S"
