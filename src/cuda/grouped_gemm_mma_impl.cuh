// Launcher body of the tensor-core grouped GEMM, instantiated once per element type in
// grouped_gemm_mma_bf16.cu / grouped_gemm_mma_f16.cu (two translation units build in parallel).
// The run-time -> compile-time dispatch (kind, groups, layout, config) happens here and only here.
#pragma once

#include <atomic>

#include "cuda/grouped_gemm_mma.cuh"
#include "cuda/runtime.hpp"

namespace moex::cuda {

// Small-T configuration: 16-row tiles (a decode step routes one or a few tokens to each expert),
// deep k steps so each block keeps ~18 KB of weights in flight per stage: memory-bound streaming.
// (Narrower column tiles, 64 weight rows per block, to fill all SMs when only k experts are hit,
// were measured: 0.0446 -> 0.0433 ms at Qwen1.5-MoE T = 1, no real gain; not kept.)
template <int kGroups>
using MmaSmall = MmaConfig<16, 128 / kGroups, 64, 1, 4, 4>;
// Large-T configuration: 128-row tiles, 64x64 per warp (per gate/up pair: 64x32 of each).
template <int kGroups>
using MmaLarge = MmaConfig<128, 128 / kGroups, 32, 2, 2, 4>;

template <class T, GemmKind kKind, int kGroups, bool kTransB, class Cfg>
void launch_mma_instance(const GroupedGemmArgs& a, cudaStream_t stream) {
  auto kernel = grouped_gemm_mma_kernel<T, kKind, kGroups, kTransB, Cfg>;
  constexpr size_t smem = Cfg::template smem_bytes<kGroups, T>();
  // The opt-in to > 48 KB of dynamic shared memory is per function and device; do it once each.
  static std::atomic<uint64_t> opted{0};
  int dev = current_device();
  uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(opted.load() & bit)) {
    MOEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem)));
    opted.fetch_or(bit);
  }
  dim3 grid(unsigned(a.max_tiles), unsigned((a.N + Cfg::BN - 1) / Cfg::BN));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(to_params(a));
  MOEX_CUDA_CHECK_LAUNCH(grouped_gemm_mma_kernel);
}

// 16-row tables run the small configuration, 64- and 128-row tables the 128-row one (64 only in a
// plan set by hand where wgmma does not apply: rows past a tile's count are computed and not
// stored, as at the end of every expert).
template <class T, GemmKind kKind, int kGroups, bool kTransB>
void launch_mma_config(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream) {
  if (tile_rows == 16) launch_mma_instance<T, kKind, kGroups, kTransB, MmaSmall<kGroups>>(a, stream);
  else launch_mma_instance<T, kKind, kGroups, kTransB, MmaLarge<kGroups>>(a, stream);
}

template <class T, GemmKind kKind, int kGroups>
void launch_mma_layout(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream) {
  if (a.transposed) launch_mma_config<T, kKind, kGroups, true>(a, tile_rows, stream);
  else launch_mma_config<T, kKind, kGroups, false>(a, tile_rows, stream);
}

template <class T>
void launch_grouped_gemm_mma_typed(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream) {
  if (a.kind == GemmKind::kDown) launch_mma_layout<T, GemmKind::kDown, 1>(a, tile_rows, stream);
  else if (a.gated) launch_mma_layout<T, GemmKind::kGateUp, 2>(a, tile_rows, stream);
  else launch_mma_layout<T, GemmKind::kGateUp, 1>(a, tile_rows, stream);
}

}  // namespace moex::cuda
