// Grouped GEMV on the CUDA cores: the experts GEMMs when each route tile holds one row (or very
// few), which is what `batched_mm` makes: one tile per (token, slot) pair.
//
// Why: a decode step routes one token to k experts, so each expert's gate_up and down are
// [1, K] x [K, N] products that only stream the expert's weights. The tensor-core kernel runs
// them as 16-row tiles (15 rows of padding) staged through shared memory; measured on the H200
// inside a decode step of a Qwen1.5-MoE-shaped model, its two launches per layer read the four
// experts' 69 MB at about 2 TB/s (ncu, docs/gpu_model.md). Here a block of 8 warps owns
// kGemvColumns output columns of one tile (both the gate and the up row of each column for gated
// experts, so the activation stays fused): the warps split K into 256-element chunks, each lane
// streams one 16-byte load per weight row per chunk, partial sums are reduced in a fixed order
// (shuffle-xor within a warp, then warps 0..7), and the shared epilogue (gemm_common.cuh) adds
// the bias, applies the activation and stores exactly what the other kernels store. Rows of a tile
// past the first re-read the weights from L1/L2.
//
// Applies to bf16 / f16 weights stored row-major per expert ([E, N_rows, K], not transposed),
// K a multiple of 8 and 16-byte aligned bases (gemv_applies in experts_plan.hpp).
#pragma once

#include "cuda/gemm_common.cuh"
#include "cuda/pdl.cuh"

namespace moex::cuda {

constexpr int kGemvWarps = 8;
constexpr int kGemvColumns = 4;
constexpr int kGemvChunk = 256;

// kEarly holds the first chunk across the wait: without a bound it took 58 registers (4 blocks
// per SM) against the 40 of the plain down kernel; bounded to 5 blocks per SM, 48 and no spills.
template <class T, GemmKind kKind, int kGroups, bool kEarly>
__global__ void __launch_bounds__(kGemvWarps * 32, kEarly ? 5 : 0) grouped_gemv_kernel(GemmParams p) {
  // gate_up's tiles (or the pairs' experts) come from the kernel just before it: nothing can start
  // before that completes, but the launch itself overlaps it (pdl.cuh). down runs right after
  // gate_up, so its tiles were written two launches before and are complete when it starts
  // (pdl.cuh's rule): its first weight chunk is loaded before waiting for gate_up's h, and the
  // weight stream overlaps gate_up's tail (at K <= 2048, a decode step's experts, that is all of
  // the block's weights). kEarly: down only (grouped_gemv.cu).
  static_assert(!kEarly || kKind == GemmKind::kDown);
  if constexpr (!kEarly) {
    pdl_wait();
    pdl_trigger();
  }
  Tile tile;
  const bool has_tile = block_tile(p, tile);
  const int j0 = int(blockIdx.y) * kGemvColumns;
  if (!has_tile || j0 >= p.N) {
    // A block with no work waits too: the kernel after this one relies on this grid's completion
    // implying gate_up's.
    if constexpr (kEarly) pdl_wait();
    return;
  }
  const int cols = min(kGemvColumns, p.N - j0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int k_first = warp * kGemvChunk + lane * 8;
  const T* w = static_cast<const T*>(p.w) + tile.expert * p.w_expert_stride;
  const T* wrow[kGroups][kGemvColumns];
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int c = 0; c < kGemvColumns; ++c)
      wrow[g][c] = w + b_source_row<kGroups>(p, j0 + min(c, cols - 1), g) * p.ldw;
  uint4 first[kGroups][kGemvColumns];  // kEarly: row 0's first chunk, loaded before the wait
  if (kEarly && k_first < p.K)
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int c = 0; c < kGemvColumns; ++c) first[g][c] = __ldg(reinterpret_cast<const uint4*>(wrow[g][c] + k_first));
  if constexpr (kEarly) {
    pdl_wait();
    pdl_trigger();
  }

  __shared__ float part[kGemvWarps][kGroups][kGemvColumns];
  for (int r = 0; r < tile.rows; ++r) {
    const int pos = tile.row_start + r;
    const T* a = a_row<T, kKind>(p, pos);
    float acc[kGroups][kGemvColumns];
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int c = 0; c < kGemvColumns; ++c) acc[g][c] = 0.0f;
    for (int k = k_first; k < p.K; k += kGemvWarps * kGemvChunk) {
      uint4 wv[kGroups][kGemvColumns];
      const bool preloaded = kEarly && r == 0 && k == k_first;
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int c = 0; c < kGemvColumns; ++c)
          wv[g][c] = preloaded ? first[g][c] : __ldg(reinterpret_cast<const uint4*>(wrow[g][c] + k));
      float xf[8];
      widen8<T>(__ldg(reinterpret_cast<const uint4*>(a + k)), xf);
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int c = 0; c < kGemvColumns; ++c) {
          float wf[8];
          widen8<T>(wv[g][c], wf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][c] = fmaf(xf[i], wf[i], acc[g][c]);
        }
    }
#pragma unroll
    for (int g = 0; g < kGroups; ++g)
#pragma unroll
      for (int c = 0; c < kGemvColumns; ++c) {
        float v = acc[g][c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[warp][g][c] = v;
      }
    __syncthreads();
    if (threadIdx.x < cols) {
      const int c = threadIdx.x;
      float v[2] = {0.0f, 0.0f};
#pragma unroll
      for (int g = 0; g < kGroups; ++g)
#pragma unroll
        for (int q = 0; q < kGemvWarps; ++q) v[g] += part[q][g][c];
      epilogue_store<T, kKind, kGroups>(p, tile.expert, pos, j0 + c, v[0], v[kGroups - 1]);
    }
    __syncthreads();  // part is rewritten by the next row
  }
}

}  // namespace moex::cuda
