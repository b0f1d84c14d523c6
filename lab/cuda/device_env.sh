# Sourced by the device-call scripts of lab/cuda (session 6 on): unpacks the prebuilt binaries
# (build-pack/gpu.tar.xz, carried), sets OUT / L (logs) / S (summary), the /work/main link the
# binaries' RUNPATH names and LD_LIBRARY_PATH, records the GPU, and defines
#   run LABEL ENV FILTER BINARY   one gtest binary under ENV, a summary line + its failures
#   run_all_suites                every CUDA suite and grouped-GEMM variant of tests/CMakeLists.txt
# (Earlier scripts inline the same lines: they are records of calls already made.)
tar xJf build-pack/gpu.tar.xz
OUT=${OUT:-/tmp/moex_out}; mkdir -p "$OUT"; L=$OUT/logs; mkdir -p "$L"; S="$OUT/summary.txt"
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/build-gpu:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader >> "$S"

run() {  # label env filter binary
  local f="$L/$(echo "$1" | tr ' =' '__').log"
  env $2 timeout 200 $4 --gtest_brief=1 $3 > "$f" 2>&1
  echo "$1 rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$f" | tr '\n' ' ')" >> "$S"
  grep -E "^\[  FAILED  \]" "$f" | head -8 >> "$S"
}

run_all_suites() {
  local T=build-gpu/tests/test_cuda_backends
  local F="--gtest_filter=*CudaConsistency*:*CudaGraph*:CudaPlan*"
  # (forced tile sizes change the plan that CudaPlan checks, so those variants leave it out)
  local G="--gtest_filter=*CudaConsistency*:*CudaGraph*"
  run cuda_default X=1 "" $T
  run cuda_mma MOEX_CUDA_GEMM=mma "$F" $T
  run cuda_64rows MOEX_CUDA_TILE_ROWS=64 "$G" $T
  run cuda_pingpong_both MOEX_WGMMA_PINGPONG=both "$G" $T
  run cuda_pingpong_none MOEX_WGMMA_PINGPONG=none "$F" $T
  run cuda_cluster MOEX_WGMMA_CLUSTER=1 "$F" $T
  run cuda_cluster_everywhere MOEX_CUDA_TILE_ROWS=256 "$G" $T
  run cuda_bn128 MOEX_WGMMA_BN=128 "$G" $T
  local t
  for t in test_experts_fixtures test_experts_consistency test_model_cuda_experts; do
    run $t X=1 "" build-gpu/tests/$t
  done
}
