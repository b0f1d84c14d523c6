// Grouped GEMM on the tensor cores: mma.sync m16n8k16 (bf16 / f16 in, fp32 accumulate) fed by a
// STAGES-deep cp.async pipeline, one output tile of one expert per block.
//
// Work decomposition. blockIdx.x indexes the device-side tile table (route_by_expert): a tile is
// up to BM sorted rows of one expert; blocks past *num_tiles exit at once, so the grid is sized
// from T, k and E alone (an upper bound) and the kernel can be replayed in a CUDA graph with any
// routing. blockIdx.y indexes BN output columns. (A one-dimensional grid with column tiles
// fastest, for L2 reuse of the A tile, gained nothing beyond run-to-run spread; not kept.) For
// gate_up, B holds BN gate rows and the BN
// matching up rows side by side (kGroups = 2), so each thread owns gate and up of the same output
// and the activation runs in the epilogue: the [P, 2I] product never reaches memory.
//
// Layouts. Non-transposed weights ([N, K], K contiguous) are staged as [BNB][BK] and read with
// ldmatrix; transposed ones ([K, N], N contiguous) as [BK][BNB] and read with ldmatrix.trans.
// 16-byte chunks are XOR-swizzled by row so ldmatrix's 8 row reads hit distinct bank groups.
// Rows beyond the tile, columns beyond N and k beyond K are zero-filled by cp.async (src size 0).
#pragma once

#include "cuda/gemm_common.cuh"

namespace moex::cuda {

// XOR swizzle of the 16-byte chunk index within a row of `kChunks` chunks.
template <int kChunks>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  if constexpr (kChunks >= 8) return chunk ^ (row & 7);
  else if constexpr (kChunks == 4) return chunk ^ ((row >> 1) & 3);
  else if constexpr (kChunks == 2) return chunk ^ ((row >> 2) & 1);
  else return chunk;
}

template <int BM_, int BN_, int BK_, int WARPS_M_, int WARPS_N_, int STAGES_>
struct MmaConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_,
                       STAGES = STAGES_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  template <int kGroups, class T>
  static constexpr size_t smem_bytes() {
    return size_t(STAGES) * (BM * BK + kGroups * BN * BK) * sizeof(T);
  }
};

template <class T, GemmKind kKind, int kGroups, bool kTransB, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) grouped_gemm_mma_kernel(GemmParams p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int NT = Cfg::kThreads;
  constexpr int BNB = kGroups * BN;                 // B rows (or columns) staged per k step
  constexpr int WM = BM / Cfg::WARPS_M, WN = BN / Cfg::WARPS_N;
  constexpr int MI = WM / 16, NF = WN / 8;
  static_assert(MI >= 1 && NF % 2 == 0 && BK % 16 == 0, "bad mma tile");
  constexpr int A_CPR = BK / 8;                     // 16-byte chunks per A row
  constexpr int A_CHUNKS = BM * A_CPR;
  constexpr int A_ITERS = (A_CHUNKS + NT - 1) / NT;
  constexpr int B_CPR = kTransB ? BNB / 8 : BK / 8;  // chunks per staged B row
  constexpr int B_CHUNKS = BNB * BK / 8;
  constexpr int B_ITERS = (B_CHUNKS + NT - 1) / NT;
  constexpr int A_STAGE = BM * BK, B_STAGE = BNB * BK;

  Tile tile;
  if (!block_tile(p, tile)) return;
  const int n0 = blockIdx.y * BN;
  if (n0 >= p.N) return;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* As = reinterpret_cast<T*>(smem_raw);
  T* Bs = As + STAGES * A_STAGE;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  const T* w = static_cast<const T*>(p.w) + tile.expert * p.w_expert_stride;

  // Per-thread source pointers, fixed over the k loop.
  const T* a_src[A_ITERS];
  uint32_t a_dst[A_ITERS];
  int a_kc[A_ITERS];
  bool a_ok[A_ITERS];
#pragma unroll
  for (int i = 0; i < A_ITERS; ++i) {
    int c = tid + i * NT;
    int r = c / A_CPR, cc = c % A_CPR;
    a_ok[i] = c < A_CHUNKS && r < tile.rows;
    a_src[i] = a_ok[i] ? a_row<T, kKind>(p, tile.row_start + r) : static_cast<const T*>(p.a);
    a_kc[i] = cc * 8;
    a_dst[i] = (r * BK + swizzle<A_CPR>(r, cc) * 8) * sizeof(T);
    if (c >= A_CHUNKS) a_dst[i] = 0;
  }
  const T* b_src[B_ITERS];
  uint32_t b_dst[B_ITERS];
  int b_k[B_ITERS];  // k offset of the chunk within the stage
  bool b_ok[B_ITERS];
#pragma unroll
  for (int i = 0; i < B_ITERS; ++i) {
    int c = tid + i * NT;
    bool in = c < B_CHUNKS;
    int srow = c / B_CPR, cc = c % B_CPR;  // staged row / chunk
    int g, jl, kk;
    if (kTransB) {
      kk = srow;
      g = (cc * 8) / BN;
      jl = (cc * 8) % BN;
    } else {
      g = srow / BN;
      jl = srow % BN;
      kk = cc * 8;
    }
    int j = n0 + jl;
    b_ok[i] = in && j < p.N;
    int64_t src_row = b_ok[i] ? b_source_row<kGroups>(p, j, g) : 0;
    b_src[i] = kTransB ? w + src_row : w + src_row * p.ldw;
    b_k[i] = kk;
    b_dst[i] = in ? (srow * (kTransB ? BNB : BK) + swizzle<B_CPR>(srow, cc) * 8) * sizeof(T) : 0;
  }

  const uint32_t as_base = smem_u32(As), bs_base = smem_u32(Bs);
  auto load_stage = [&](int stage, int k0) {
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      if (tid + i * NT >= A_CHUNKS) continue;
      int k = k0 + a_kc[i];
      bool ok = a_ok[i] && k < p.K;
      cp_async_16(as_base + stage * A_STAGE * sizeof(T) + a_dst[i], ok ? a_src[i] + k : a_src[i],
                  ok ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      if (tid + i * NT >= B_CHUNKS) continue;
      int k = k0 + b_k[i];
      bool ok = b_ok[i] && k < p.K;
      const T* src = kTransB ? b_src[i] + int64_t(k) * p.ldw : b_src[i] + k;
      cp_async_16(bs_base + stage * B_STAGE * sizeof(T) + b_dst[i], ok ? src : b_src[i],
                  ok ? 16 : 0);
    }
  };

  float acc[kGroups][MI][NF][4];
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int nf = 0; nf < NF; ++nf)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[g][mi][nf][e] = 0.f;

  const int KT = (p.K + BK - 1) / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_stage(s, s * BK);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    int nk = kt + STAGES - 1;
    if (nk < KT) load_stage(nk % STAGES, nk * BK);
    cp_async_commit();
    const int s = kt % STAGES;
    const uint32_t a_st = as_base + s * A_STAGE * sizeof(T);
    const uint32_t b_st = bs_base + s * B_STAGE * sizeof(T);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      uint32_t af[MI][4];
#pragma unroll
      for (int mi = 0; mi < MI; ++mi) {
        int r = wm * WM + mi * 16 + (lane % 16);
        int ch = kk * 2 + lane / 16;
        ldmatrix_x4(a_st + (r * BK + swizzle<A_CPR>(r, ch) * 8) * sizeof(T), af[mi][0], af[mi][1],
                    af[mi][2], af[mi][3]);
      }
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        uint32_t bf[NF][2];
#pragma unroll
        for (int nf = 0; nf < NF; nf += 2) {
          if (kTransB) {
            int kr = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
            int ncol = g * BN + wn * WN + nf * 8 + (lane / 16) * 8;
            ldmatrix_x4_trans(b_st + (kr * BNB + swizzle<B_CPR>(kr, ncol / 8) * 8) * sizeof(T),
                              bf[nf][0], bf[nf][1], bf[nf + 1][0], bf[nf + 1][1]);
          } else {
            int nr = g * BN + wn * WN + nf * 8 + (lane / 16) * 8 + lane % 8;
            int ch = kk * 2 + (lane / 8) % 2;
            ldmatrix_x4(b_st + (nr * BK + swizzle<B_CPR>(nr, ch) * 8) * sizeof(T), bf[nf][0],
                        bf[nf][1], bf[nf + 1][0], bf[nf + 1][1]);
          }
        }
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
#pragma unroll
          for (int nf = 0; nf < NF; ++nf) mma_16816<T>(acc[g][mi][nf], af[mi], bf[nf]);
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int r = wm * WM + mi * 16 + lane / 4 + h * 8;
      if (r >= tile.rows) continue;
#pragma unroll
      for (int nf = 0; nf < NF; ++nf)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          int j = n0 + wn * WN + nf * 8 + 2 * (lane % 4) + e;
          if (j < p.N)
            epilogue_store<T, kKind, kGroups>(p, tile.expert, tile.row_start + r, j,
                                              acc[0][mi][nf][h * 2 + e],
                                              acc[kGroups - 1][mi][nf][h * 2 + e]);
        }
    }
}

}  // namespace moex::cuda
