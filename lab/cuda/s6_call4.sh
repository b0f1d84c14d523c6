#!/usr/bin/env bash
# Session 6, call 4: the staged gate_up epilogue (stmatrix -> shared memory -> 16-byte stores).
# Every CUDA suite and grouped-GEMM variant, then grouped_mm times of the old binary (HEAD
# e9f756c, build-pack/old.tar.xz) and the new one, alternating, two rounds. carry: build-pack
set -u
. lab/cuda/device_env.sh
mkdir -p old && tar xJf build-pack/old.tar.xz -C old
T=build-gpu/tests/test_cuda_backends
F="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*"
run cuda_default X=1 "" $T
run cuda_64rows MOEX_CUDA_TILE_ROWS=64 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
run cuda_pingpong_both MOEX_WGMMA_PINGPONG=both "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
run cuda_cluster MOEX_WGMMA_CLUSTER=1 "$F" $T
run cuda_cluster_everywhere MOEX_CUDA_TILE_ROWS=256 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
run cuda_bn128 MOEX_WGMMA_BN=128 "--gtest_filter=*CudaConsistency*:*CudaGraph*" $T
for t in test_experts_fixtures test_experts_consistency test_model_cuda_experts; do run $t X=1 "" build-gpu/tests/$t; done
cat "$S"
grep -q "cuda_default rc=0" "$S" || { echo "suite failed: no timings"; exit 1; }
bench() {  # label libdir binary shape
  LD_LIBRARY_PATH=$2:/usr/local/cuda/lib64 timeout 100 $3 bench experts --device cuda --backends grouped_mm \
    --graph off --no-check --min-iters 10 --budget-s 0.5 --shape $4 --tokens 256,1024,4096,16384 2>&1 |
    grep -E "grouped_mm|rror" | sed -E "s/^/$1 $4 /; s/ +/ /g" >> "$S"
}
for round in 1 2; do
  for sh in mixtral-8x7b deepseek-v3 qwen1.5-moe-a2.7b; do
    bench old $PWD/old/build-gpu old/build-gpu/moex $sh
    bench new $PWD/build-gpu build-gpu/moex $sh
  done
done
cat "$S"
