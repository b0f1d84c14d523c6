// Grouped GEMM on the CUDA cores (fp32 FMA): any element type, any layout, any size. It is the
// fp32 path (exact fp32 products, no tf32) and the fallback for shapes the tensor-core kernel does
// not take (K or N not multiples of 8, transposed + interleaved gate/up).
// A 16x16 thread block computes a 32-row x 32-column tile of each of kGroups weight groups
// (gate and up side by side, so the activation is fused), 2x2 outputs per thread and group.
#pragma once

#include "cuda/gemm_common.cuh"

namespace moex::cuda {

constexpr int kSimtBN = 32;
constexpr int kSimtBK = 16;

template <class T, GemmKind kKind, int kGroups, bool kTransB>
__global__ void __launch_bounds__(256) grouped_gemm_simt_kernel(GemmParams p) {
  constexpr int BM = kSimtTileRows, BN = kSimtBN, BK = kSimtBK;
  Tile tile;
  if (!block_tile(p, tile)) return;
  const int n0 = blockIdx.y * BN;
  if (n0 >= p.N) return;
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[kGroups][BK][BN + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const T* w = static_cast<const T*>(p.w) + tile.expert * p.w_expert_stride;
  const int64_t sn = kTransB ? 1 : p.ldw, sk = kTransB ? p.ldw : 1;

  float acc[kGroups][2][2] = {};
  for (int k0 = 0; k0 < p.K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += 256) {
      int r = i / BK, kk = i % BK;
      int gk = k0 + kk;
      As[kk][r] = (r < tile.rows && gk < p.K)
                      ? to_float(a_row<T, kKind>(p, tile.row_start + r)[gk])
                      : 0.f;
    }
    for (int i = tid; i < kGroups * BN * BK; i += 256) {
      // Consecutive threads walk k for non-transposed weights and n for transposed ones, so the
      // global reads stay coalesced in both layouts.
      int g = i / (BN * BK), rem = i % (BN * BK);
      int c = kTransB ? rem % BN : rem / BK;
      int kk = kTransB ? rem / BN : rem % BK;
      int j = n0 + c, gk = k0 + kk;
      Bs[g][kk][c] = (j < p.N && gk < p.K) ? to_float(w[b_source_row<kGroups>(p, j, g) * sn + gk * sk])
                                           : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a0 = As[kk][ty], a1 = As[kk][ty + 16];
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        float b0 = Bs[g][kk][tx], b1 = Bs[g][kk][tx + 16];
        acc[g][0][0] = fmaf(a0, b0, acc[g][0][0]);
        acc[g][0][1] = fmaf(a0, b1, acc[g][0][1]);
        acc[g][1][0] = fmaf(a1, b0, acc[g][1][0]);
        acc[g][1][1] = fmaf(a1, b1, acc[g][1][1]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int r = ty + 16 * i;
    if (r >= tile.rows) continue;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      int j = n0 + tx + 16 * jj;
      if (j >= p.N) continue;
      epilogue_store<T, kKind, kGroups>(p, tile.expert, tile.row_start + r, j, acc[0][i][jj],
                                        acc[kGroups - 1][i][jj]);
    }
  }
}

}  // namespace moex::cuda
