// Prefill attention on the tensor cores, FA2 style (written for this project's masks and
// rounding; the decomposition is the published flash-attention 2 algorithm).
//
// Decomposition. A block of kWarps warps (4 or 8, the plan's choice; 8 only for head dims up
// to 128, where Q and two K/V stages fit in shared memory) takes 16 * kWarps query tokens of one
// head of one sequence; each warp owns 16 query rows, so its scores and output live in mma accumulators and
// the row statistics (max, sum) need only the 4 lanes that share a row. K/V tiles of 64 cache
// columns are staged in shared memory with cp.async, double-buffered: tile i + 1 is in flight
// while tile i is computed; all warps of the block share them (more warps: fewer K/V bytes from
// L2 per query). Q is staged once and, for head dims up to 128, held in registers. S = Q K^T:
// A = Q (ldmatrix.x4), B = K stored [column][dim] (ldmatrix.x4 without transpose: K's rows are B's
// columns). O += P V: A = P taken straight from the S accumulators (the m16n8 C layout of two
// adjacent n-tiles is the m16n8k16 A layout), rounded to the element type (sdpa's rounding of the
// unnormalised e), B = V stored [column][dim], read with ldmatrix.trans. 16-byte chunks are
// XOR-swizzled by row so that the 8 rows an ldmatrix reads hit distinct banks.
//
// Softmax in base 2: scores are scaled by scale * log2(e) in one multiply and exponentiated with
// exp2f (one MUFU.EX2), as flash-attention does; the maximum is tracked in the same units.
//
// Order. The grid is (heads, query blocks, batch) and the query blocks run last-first: the
// blocks with the most cache columns (the end of a causal prompt) start in the first wave and
// the short ones fill the tail.
//
// Head dims are run-time values inside compile-time classes kDk, kDv in {64, 128, 256}: smem rows
// and accumulators are sized by the class, k steps and n tiles beyond the real dim are skipped
// (uniform branches), so 9 instantiations per dtype cover every multiple of 16 up to 256
// (32, 48, 64 / 128 / 192 ...). Chunks beyond the real dim are never written nor read.
//
// Masking. The block's columns run from lo = max(pad, first query's column - window + 1) to the
// last query's column; cp.async zero-fills rows outside [lo, hi), so a masked p of 0 never meets
// uninitialised cache memory (0 * NaN). Per element: t < T, j <= c = past + t, c - j < window;
// masked scores are -inf; a row that has seen only -inf keeps m = -inf, uses 0 as its reference
// (no -inf - -inf) and ends with l = 0, written as zeros. Tiles that no mask can touch for any
// of the block's real rows (below the first row's diagonal, inside every row's window, before
// hi) skip the per-element test; rows past T there hold finite garbage that is never written.
// Sinks join the denominator in the epilogue (the row is rescaled to max(m, sink)). Only sdpa
// semantics (see attention_plan.hpp for why eager goes to the split kernel).
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"

namespace moex::ops::cuda {

struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const int32_t* step;
  int tokens, heads, group, dk, dv;
  int64_t capacity, q_dim, k_dim, v_dim, out_dim;  // v_dim: V's row stride
  int v_head;  // offset of kv head g's values in a V row: g * v_head (dv, or dk when V is K)
  float scale;
  int window;
  const void* sinks;  // [heads] per-head sink logits (joins the denominator), or null
  int sinks_code;
};

// Q of the block's rows and two stages of a K and a V tile of kN columns.
template <int kDk, int kDv>
inline constexpr size_t flash_smem_bytes_for(size_t elem, int block_rows, int columns) {
  return (size_t(block_rows) * kDk + 2 * size_t(columns) * (kDk + kDv)) * elem;
}

// XOR swizzle of a 16-byte chunk within a row of a multiple of 8 chunks.
__device__ __forceinline__ int flash_swizzle(int row, int chunk) { return chunk ^ (row & 7); }

// kWarps warps, each owning kMT m-tiles of 16 query rows (block rows BM = 16 kMT kWarps), K/V
// tiles of kN columns. grid (heads, ceil(T / BM), batch), 32 * kWarps threads,
// flash_smem_bytes_for<kDk, kDv>(sizeof(T), BM, kN) bytes.
template <class T, int kDk, int kDv, int kWarps, int kMT, int kN>
__global__ void __launch_bounds__(32 * kWarps) attention_flash_mma_kernel(FlashParams p) {
  using moex::cuda::cp_async_16;
  using moex::cuda::smem_u32;
  constexpr int kThreads = 32 * kWarps;
  constexpr int BM = 16 * kMT * kWarps, BN = kN, NF = BN / 8, NV = kDv / 8, KK = kDk / 16;
  constexpr bool kQInRegisters = kDk <= 128 && kMT == 1;
  static_assert(kDk % 64 == 0 && kDv % 64 == 0, "dim classes are multiples of 64 (8 chunks)");
  static_assert(BN % 16 == 0, "tiles of whole k16 steps");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t qs = smem_u32(smem_raw);
  const uint32_t ks = qs + BM * kDk * sizeof(T);       // 2 stages of [BN][kDk]
  const uint32_t vs = ks + 2 * BN * kDk * sizeof(T);   // 2 stages of [BN][kDv]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x, b = blockIdx.z, g = h / p.group;
  const int t0 = (int(gridDim.y) - 1 - int(blockIdx.y)) * BM;  // last query block first
  const int past = p.step[0], pad = p.step[1 + b];
  const int t_last = min(t0 + BM, p.tokens) - 1;
  const int lo = max(pad, p.window > 0 ? past + t0 - p.window + 1 : 0);
  const int hi = past + t_last + 1;
  const int ntiles = hi > lo ? (hi - lo + BN - 1) / BN : 0;
  const int dk_ch = p.dk / 8, dv_ch = p.dv / 8;
  // Columns below `unmasked_end` are visible to every real row of the block (j <= past + t0).
  const int unmasked_end = past + t0 + 1;
  const float scale_log2 = p.scale * 1.4426950408889634f;

  const T* qg = static_cast<const T*>(p.q);
  const T* kg = static_cast<const T*>(p.k) + int64_t(b) * p.capacity * p.k_dim + int64_t(g) * p.dk;
  const T* vg = static_cast<const T*>(p.v) + int64_t(b) * p.capacity * p.v_dim + int64_t(g) * p.v_head;

  auto load_kv = [&](int stage, int j0) {
    const uint32_t kst = ks + stage * BN * kDk * sizeof(T), vst = vs + stage * BN * kDv * sizeof(T);
    for (int idx = tid; idx < BN * dk_ch; idx += kThreads) {
      const int r = idx / dk_ch, c = idx % dk_ch, j = j0 + r;
      const bool ok = j < hi;
      cp_async_16(kst + (r * kDk + flash_swizzle(r, c) * 8) * sizeof(T), ok ? kg + int64_t(j) * p.k_dim + c * 8 : kg,
                  ok ? 16 : 0);
    }
    for (int idx = tid; idx < BN * dv_ch; idx += kThreads) {
      const int r = idx / dv_ch, c = idx % dv_ch, j = j0 + r;
      const bool ok = j < hi;
      cp_async_16(vst + (r * kDv + flash_swizzle(r, c) * 8) * sizeof(T), ok ? vg + int64_t(j) * p.v_dim + c * 8 : vg,
                  ok ? 16 : 0);
    }
  };

  if (ntiles > 0) {
    for (int idx = tid; idx < BM * dk_ch; idx += kThreads) {
      const int r = idx / dk_ch, c = idx % dk_ch, t = t0 + r;
      const bool ok = t < p.tokens;
      const T* src = ok ? qg + (int64_t(b) * p.tokens + t) * p.q_dim + int64_t(h) * p.dk + c * 8 : qg;
      cp_async_16(qs + (r * kDk + flash_swizzle(r, c) * 8) * sizeof(T), src, ok ? 16 : 0);
    }
    load_kv(0, lo);
  }
  moex::cuda::cp_async_commit();

  // Warp w owns block rows [w * 16 kMT, (w + 1) * 16 kMT): m-tile mt is rows + 16 mt.
  const int wrow = warp * 16 * kMT;
  auto load_q = [&](int mt, int kk, uint32_t* a) {
    const int r = wrow + mt * 16 + lane % 16, ch = kk * 2 + lane / 16;
    moex::cuda::ldmatrix_x4(qs + (r * kDk + flash_swizzle(r, ch) * 8) * sizeof(T), a[0], a[1], a[2], a[3]);
  };
  // Q's A fragments, read once when they fit in registers (one m-tile, head dims up to 128).
  uint32_t qf[kQInRegisters ? KK : 1][4];

  float o[kMT][NV][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int i = 0; i < NV; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  // Per m-tile, the two rows this lane holds in the C layout (lane / 4 and lane / 4 + 8):
  // m in base-2 units (scores * scale * log2 e), l the lane's share of the row sum.
  float m[kMT][2], l[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  const int row0 = wrow + lane / 4;

  for (int it = 0; it < ntiles; ++it) {
    moex::cuda::cp_async_wait<0>();
    __syncthreads();  // tile it landed for everyone; everyone is done with tile it - 1
    if (it + 1 < ntiles) load_kv((it + 1) & 1, lo + (it + 1) * BN);
    moex::cuda::cp_async_commit();
    const int j0 = lo + it * BN;
    const uint32_t kst = ks + (it & 1) * BN * kDk * sizeof(T), vst = vs + (it & 1) * BN * kDv * sizeof(T);
    if constexpr (kQInRegisters) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < KK; ++kk)
          if (kk * 16 < p.dk) load_q(0, kk, qf[kk]);
      }
    }

    // S = Q K^T: each K fragment (ldmatrix.x4: two n-tiles) feeds every m-tile of the warp.
    float s[kMT][NF][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nf = 0; nf < NF; ++nf) s[mt][nf][0] = s[mt][nf][1] = s[mt][nf][2] = s[mt][nf][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
      if (kk * 16 >= p.dk) break;
      uint32_t a_mem[kMT][4];
      const uint32_t* a[kMT];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if constexpr (kQInRegisters) {
          a[mt] = qf[kk];
        } else {
          load_q(mt, kk, a_mem[mt]);
          a[mt] = a_mem[mt];
        }
      }
#pragma unroll
      for (int nf = 0; nf < NF; nf += 2) {
        uint32_t b0[2], b1[2];
        const int r = nf * 8 + (lane / 16) * 8 + lane % 8, ch = kk * 2 + (lane / 8) % 2;
        moex::cuda::ldmatrix_x4(kst + (r * kDk + flash_swizzle(r, ch) * 8) * sizeof(T), b0[0], b0[1], b1[0], b1[1]);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          moex::cuda::mma_16816<T>(s[mt][nf], a[mt], b0);
          moex::cuda::mma_16816<T>(s[mt][nf + 1], a[mt], b1);
        }
      }
    }

    // Scale (base 2) and mask; element e of n-tile nf of m-tile mt is row row0 + 16 mt +
    // 8 (e / 2), column j0 + 8 nf + 2 (lane % 4) + e % 2. Tiles no mask reaches for the block's
    // real rows skip the test (uniform over the block).
    const bool masked = j0 + BN > unmasked_end || (p.window > 0 && past + t_last - j0 >= p.window);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      float mx[2] = {-INFINITY, -INFINITY};
      if (masked) {
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int t = t0 + row0 + 16 * mt + 8 * (e / 2), c = past + t;
            const int j = j0 + nf * 8 + 2 * (lane % 4) + (e & 1);
            const bool ok = t < p.tokens && j < hi && j <= c && (p.window <= 0 || c - j < p.window);
            s[mt][nf][e] = ok ? s[mt][nf][e] * scale_log2 : -INFINITY;
            mx[e / 2] = fmaxf(mx[e / 2], s[mt][nf][e]);
          }
      } else {
#pragma unroll
        for (int nf = 0; nf < NF; ++nf)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nf][e] *= scale_log2;
            mx[e / 2] = fmaxf(mx[e / 2], s[mt][nf][e]);
          }
      }
      float alpha[2], ref[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[mt][r], mx[r]);
        ref[r] = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = exp2f(m[mt][r] - ref[r]);
        m[mt][r] = m_new;
        l[mt][r] *= alpha[r];
      }
#pragma unroll
      for (int nf = 0; nf < NF; ++nf)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][nf][e] = exp2f(s[mt][nf][e] - ref[e / 2]);
          l[mt][e / 2] += s[mt][nf][e];  // unrounded (float32 normaliser)
        }
      // Once a row's maximum settles, alpha is exactly 1: skip the multiplications (same bits).
      if (alpha[0] != 1.f || alpha[1] != 1.f) {
#pragma unroll
        for (int nv = 0; nv < NV; ++nv) {
          o[mt][nv][0] *= alpha[0];
          o[mt][nv][1] *= alpha[0];
          o[mt][nv][2] *= alpha[1];
          o[mt][nv][3] *= alpha[1];
        }
      }
    }

    // O += P V over the tile's columns, 16 at a time; each V fragment feeds every m-tile.
#pragma unroll
    for (int kc = 0; kc < BN / 16; ++kc) {
      uint32_t a[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        a[mt][0] = moex::cuda::pack2<T>(s[mt][2 * kc][0], s[mt][2 * kc][1]);
        a[mt][1] = moex::cuda::pack2<T>(s[mt][2 * kc][2], s[mt][2 * kc][3]);
        a[mt][2] = moex::cuda::pack2<T>(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
        a[mt][3] = moex::cuda::pack2<T>(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
      }
#pragma unroll
      for (int nv = 0; nv < NV; nv += 2) {
        if (nv * 8 >= p.dv) break;
        uint32_t b0[2], b1[2];
        const int r = kc * 16 + ((lane / 8) % 2) * 8 + lane % 8, ch = nv + lane / 16;
        moex::cuda::ldmatrix_x4_trans(vst + (r * kDv + flash_swizzle(r, ch) * 8) * sizeof(T), b0[0], b0[1], b1[0],
                                      b1[1]);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          moex::cuda::mma_16816<T>(o[mt][nv], a[mt], b0);
          moex::cuda::mma_16816<T>(o[mt][nv + 1], a[mt], b1);
        }
      }
    }
  }
  moex::cuda::cp_async_wait<0>();

  T* og = static_cast<T*>(p.out);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = l[mt][r];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      // A sink joins the denominator only: rescale the row to max(m, sink), add exp(sink - max).
      // A row that saw no key (m = -inf) ends with o = 0 and sum = 1: zeros, as without a sink.
      float keep = 1.f;
      if (p.sinks) {
        const float sink = moex::cuda::load_float(p.sinks, p.sinks_code, h) * 1.4426950408889634f;
        const float m_new = fmaxf(m[mt][r], sink);
        keep = m[mt][r] == -INFINITY ? 0.f : exp2f(m[mt][r] - m_new);
        sum = sum * keep + exp2f(sink - m_new);
      }
      const int t = t0 + row0 + 16 * mt + 8 * r;
      if (t >= p.tokens) continue;
      T* orow = og + (int64_t(b) * p.tokens + t) * p.out_dim + int64_t(h) * p.dv;
#pragma unroll
      for (int nv = 0; nv < NV; ++nv) {
        if (nv * 8 >= p.dv) break;
        const float x0 = sum > 0.f ? o[mt][nv][2 * r] * keep / sum : 0.f;
        const float x1 = sum > 0.f ? o[mt][nv][2 * r + 1] * keep / sum : 0.f;
        *reinterpret_cast<uint32_t*>(orow + nv * 8 + 2 * (lane % 4)) = moex::cuda::pack2<T>(x0, x1);
      }
    }
}

}  // namespace moex::ops::cuda
