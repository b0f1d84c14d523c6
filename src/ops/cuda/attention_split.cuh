// Split-KV attention on CUDA cores ("flash decoding") and the kernel that combines its splits.
//
// Why this shape. A decode step has 1..16 query tokens per sequence, so the work is reading the
// cache once: a block takes one sequence, one kv head, up to kSplitQueries queries of that kv
// head's GQA group (tokens x heads, so K/V are read once for the whole group) and one split of
// the cache columns, stages K/V tiles of 32 columns in shared memory with 16-byte loads
// (converted to float32 there, rows padded by one float so the per-lane row reads of the score
// loop do not conflict), and keeps every query's softmax state in shared memory. The grid is
// sized from the cache CAPACITY (splits) and the shapes only; the length (past) and the pads are
// read from the device step, and a split past the length writes an empty state, so one launch
// serves every length (a captured decode graph replays at any step).
//
// Semantics (ops.hpp). Query row r = b * T + t at cache column c = past + t sees keys j with
// pad[b] <= j <= c and, with a sliding window, c - j < window. Two modes:
// - sdpa (kMode 0): one pass with an online softmax: s = (q.k) * scale in float32, e = exp(s - m)
//   with the running maximum m, p = round(e) to act for the p.v product, the float32 sum of the
//   unrounded e as the normaliser; the combine rescales the splits, adds the sink to the
//   denominator and rounds the output once.
// - eager_rounding (kModes 1, 2, 3): transformers' eager attention rounds the score minus the
//   ROW maximum and the NORMALISED probability to act, which an online softmax cannot reproduce
//   (its maximum and denominator are not final while it accumulates). Three passes over the
//   split, each recomputing the scores: 1 the maximum of the rounded scores, 2 (after reading every
//   split's maximum and the sink) the double sum of exp(round(s - M)), 3 (after reading every
//   split's sum) acc += round(e / D) * v. The combine adds the splits' acc and rounds. It costs
//   three reads of K; the eager path serves gpt-oss, whose layers alternate a 128-column window.
// A query that sees no key ends with m = -inf and l = 0 and gets zeros (no exp(-inf + inf)).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "ops/cuda/attention_plan.hpp"

namespace moex::ops::cuda {

using moex::cuda::from_float;
using moex::cuda::to_float;

inline constexpr int kSplitThreads = 128;
inline constexpr int kSplitColumns = 32;  // columns per staged tile: one per lane

struct SplitParams {
  const void* q;
  const void* k;
  const void* v;
  const int32_t* step;
  const void* sinks;
  int sinks_code;
  int act;
  int tokens, heads, group, dk, dv;
  int64_t capacity, q_dim, k_dim, v_dim;  // v_dim: V's row stride
  int v_head;          // offset of kv head g's values in a V row: g * v_head
  bool v_in_k;         // V is K (AttentionSpec::v_from_k): p.v reads the staged K tile
  int64_t rows_heads;  // rows * heads: queries of the call
  int chunk;           // columns per split
  int splits;
  float scale;
  int window;
  bool vec_k, vec_v;   // 16-byte loads of K / V rows
  double* ws_l;
  float* ws_m;
  float* ws_acc;
  // Vector kernel only: one arrival counter per (query block, kv head, sequence), zero between
  // calls; non-null: the last split of a block to finish combines the block's queries into `out`
  // itself (no combine kernel). Null: the combine kernel runs after the split pass.
  unsigned* counters;
  void* out;
};

// x rounded to the act dtype (code as moex::cuda::FloatCode), returned as float.
__device__ __forceinline__ float round_code(float x, int code) {
  if (code == 1) return __half2float(__float2half_rn(x));
  if (code == 2) return __bfloat162float(__float2bfloat16_rn(x));
  return x;
}
__device__ __forceinline__ void store_code(void* p, int code, int64_t i, float x) {
  if (code == 1) static_cast<__half*>(p)[i] = __float2half_rn(x);
  else if (code == 2) static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else static_cast<float*>(p)[i] = x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
template <class A>
__device__ __forceinline__ A warp_sum(A x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Stages `rows` rows of `width` elements (row r at src + r * ld) as float32 into
// dst[r * dst_ld + e], 16 bytes per load when `vec` (width * sizeof(T) a multiple of 16 and
// 16-byte aligned rows).
template <class T>
__device__ __forceinline__ void stage_rows_f32(float* dst, int dst_ld, const T* src, int64_t ld, int rows,
                                               int width, bool vec) {
  if (vec) {
    constexpr int kPer = 16 / int(sizeof(T));
    const int chunks = width / kPer;
    for (int idx = threadIdx.x; idx < rows * chunks; idx += blockDim.x) {
      const int r = idx / chunks, c = idx % chunks;
      const uint4 raw = *reinterpret_cast<const uint4*>(src + r * ld + c * kPer);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPer; ++i) dst[r * dst_ld + c * kPer + i] = to_float<T>(e[i]);
    }
  } else {
    for (int idx = threadIdx.x; idx < rows * width; idx += blockDim.x) {
      const int r = idx / width, c = idx % width;
      dst[r * dst_ld + c] = to_float<T>(src[r * ld + c]);
    }
  }
}

// The cache columns [lo, hi) that split `split` reads for the block's queries i0 .. i0 + nq - 1
// of one sequence (left pad `pad`, `past` columns before this step): from the first column any
// of them may see (pad, the window of the first query) to the last query's own column, cut to
// the split's chunk. Empty (lo >= hi) when the split lies past the length.
struct SplitColumns {
  int lo, hi;
};
__device__ __forceinline__ SplitColumns split_columns(const SplitParams& p, int split, int past, int pad, int i0,
                                                      int nq) {
  const int c_first = past + i0 / p.group, c_last = past + (i0 + nq - 1) / p.group;
  int lo = max(pad, p.window > 0 ? c_first - p.window + 1 : 0);
  lo = int(max(int64_t(lo), int64_t(split) * p.chunk));
  const int hi = int(min(int64_t(c_last) + 1, int64_t(split + 1) * p.chunk));
  return {lo, hi};
}

// Global index (row * heads + h) of the block's query i (i = t * group + hh) of sequence b, kv
// head g: where its partial state and output go.
__device__ __forceinline__ int64_t split_query_index(const SplitParams& p, int b, int g, int i) {
  const int t = i / p.group, hh = i % p.group;
  return (int64_t(b) * p.tokens + t) * p.heads + int64_t(g) * p.group + hh;
}

// Dynamic shared memory of the split kernel, in bytes (the launcher sizes it and opts in beyond
// 48 KiB; layout below). No V tile when V is K. DeepSeek MLA absorbed (dk 576, dv 512, V in K):
// 146 KB; separate 576 / 512 tiles would take 212 KB, still under the H200's 227 KB.
inline int64_t split_smem_bytes(int dk, int dv, bool v_in_k) {
  const int64_t doubles = 2 * kSplitQueries;
  const int64_t floats = 2 * kSplitQueries + int64_t(kSplitQueries) * dk + kSplitQueries * kSplitColumns +
                         int64_t(kSplitQueries) * dv + int64_t(kSplitColumns) * (dk + 1) +
                         (v_in_k ? 0 : int64_t(kSplitColumns) * (dv + 1));
  return doubles * 8 + floats * 4;
}

// grid (query blocks x splits, kv heads, batch), kSplitThreads threads.
template <class T, int kMode>
__global__ void __launch_bounds__(kSplitThreads) attention_split_kernel(SplitParams p) {
  moex::cuda::pdl_enter();
  constexpr int kQ = kSplitQueries, kC = kSplitColumns;
  constexpr bool kUsesV = kMode == 0 || kMode == 3;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* l_s = reinterpret_cast<double*>(smem_raw);  // [kQ] running / partial sum
  double* d_s = l_s + kQ;                               // [kQ] eager: the denominator
  float* m_s = reinterpret_cast<float*>(d_s + kQ);      // [kQ] running max / eager: M
  float* a_s = m_s + kQ;                                // [kQ] rescale of this tile
  float* qs = a_s + kQ;                                 // [kQ][dk]
  float* ps = qs + kQ * p.dk;                           // [kQ][kC] scores, then p
  float* acc = ps + kQ * kC;                            // [kQ][dv]
  float* ks = acc + kQ * p.dv;                          // [kC][dk + 1]
  float* vs = ks + kC * (p.dk + 1);                     // [kC][dv + 1] (absent when V is K)

  const int split = blockIdx.x % p.splits, qb = blockIdx.x / p.splits;
  const int g = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int past = p.step[0], pad = p.step[1 + b];
  const int i0 = qb * kQ;  // first query of the block within the group: i = t * group + hh
  const int nq = min(kQ, p.tokens * p.group - i0);
  const int kdk = p.dk + 1;
  // The staged V rows: their own tile, or the leading dv floats of each staged K row.
  const float* vt = p.v_in_k ? ks : vs;
  const int kdv = p.v_in_k ? kdk : p.dv + 1;

  const SplitColumns cols = split_columns(p, split, past, pad, i0, nq);
  const int lo = cols.lo, hi = cols.hi;
  auto global_query = [&](int qi) { return split_query_index(p, b, g, i0 + qi); };

  if (tid < kQ) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0;
    a_s[tid] = 1.f;
    if ((kMode == 2 || kMode == 3) && tid < nq) {
      // The row maximum over every split (and the rounded sink), then the denominator.
      const int64_t gq = global_query(tid);
      const int h = int(gq % p.heads);
      const float sink = p.sinks ? round_code(moex::cuda::load_float(p.sinks, p.sinks_code, h), p.act) : -INFINITY;
      float M = sink;
      for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.ws_m[int64_t(s) * p.rows_heads + gq]);
      m_s[tid] = M;
      if (kMode == 3) {
        double D = 0.0;
        for (int s = 0; s < p.splits; ++s) D += p.ws_l[int64_t(s) * p.rows_heads + gq];
        if (p.sinks && M > -INFINITY) D += exp(double(round_code(sink - M, p.act)));
        d_s[tid] = D;
      }
    }
  }
  const T* qg = static_cast<const T*>(p.q);
  for (int idx = tid; idx < kQ * p.dk; idx += kSplitThreads) {
    const int qi = idx / p.dk, d = idx % p.dk;
    float x = 0.f;
    if (qi < nq) {
      const int i = i0 + qi, t = i / p.group, hh = i % p.group;
      x = to_float<T>(qg[(int64_t(b) * p.tokens + t) * p.q_dim + int64_t(g * p.group + hh) * p.dk + d]);
    }
    qs[idx] = x;
  }
  if (kUsesV)
    for (int idx = tid; idx < kQ * p.dv; idx += kSplitThreads) acc[idx] = 0.f;
  __syncthreads();

  const T* kg = static_cast<const T*>(p.k) + int64_t(b) * p.capacity * p.k_dim + int64_t(g) * p.dk;
  const T* vg = static_cast<const T*>(p.v) + int64_t(b) * p.capacity * p.v_dim + int64_t(g) * p.v_head;
  for (int j0 = lo; j0 < hi; j0 += kC) {
    const int n = min(kC, hi - j0);
    stage_rows_f32<T>(ks, kdk, kg + int64_t(j0) * p.k_dim, p.k_dim, n, p.dk, p.vec_k);
    if (kUsesV && !p.v_in_k) stage_rows_f32<T>(vs, kdv, vg + int64_t(j0) * p.v_dim, p.v_dim, n, p.dv, p.vec_v);
    __syncthreads();

    // Scores of the tile, -inf where masked (causal, window, columns past this split's end).
    for (int idx = tid; idx < kQ * kC; idx += kSplitThreads) {
      const int qi = idx / kC, jj = idx % kC;
      float s = -INFINITY;
      if (qi < nq && jj < n) {
        const int c = past + (i0 + qi) / p.group, j = j0 + jj;
        if (j <= c && (p.window <= 0 || c - j < p.window)) {
          const float* qr = qs + qi * p.dk;
          const float* kr = ks + jj * kdk;
          float dot = 0.f;
          for (int d = 0; d < p.dk; ++d) dot = fmaf(qr[d], kr[d], dot);
          s = kMode == 0 ? dot * p.scale : round_code(round_code(dot, p.act) * p.scale, p.act);
        }
      }
      ps[idx] = s;
    }
    __syncthreads();

    // Softmax state, one warp per query, one lane per column.
    for (int qi = warp; qi < nq; qi += kSplitThreads / 32) {
      const float s = ps[qi * kC + lane];
      if constexpr (kMode == 0) {
        const float m_old = m_s[qi];
        const float m_new = fmaxf(m_old, warp_max(s));
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float e = expf(s - m_use);
        const float sum = warp_sum(e);
        ps[qi * kC + lane] = round_code(e, p.act);
        if (lane == 0) {
          const float alpha = expf(m_old - m_use);
          l_s[qi] = l_s[qi] * alpha + sum;
          m_s[qi] = m_new;
          a_s[qi] = alpha;
        }
      } else if constexpr (kMode == 1) {
        const float mt = warp_max(s);
        if (lane == 0) m_s[qi] = fmaxf(m_s[qi], mt);
      } else {
        const float M = m_s[qi];
        const float e = s == -INFINITY ? 0.f : float(exp(double(round_code(s - M, p.act))));
        if constexpr (kMode == 2) {
          const double sum = warp_sum(double(e));
          if (lane == 0) l_s[qi] += sum;
        } else {
          const double D = d_s[qi];
          ps[qi * kC + lane] = D > 0.0 ? round_code(float(double(e) / D), p.act) : 0.f;
        }
      }
    }
    __syncthreads();

    if (kUsesV) {
      for (int idx = tid; idx < kQ * p.dv; idx += kSplitThreads) {
        const int qi = idx / p.dv, d = idx % p.dv;
        if (qi >= nq) continue;
        float a = acc[idx];
        if (kMode == 0) a *= a_s[qi];
        const float* pr = ps + qi * kC;
        for (int jj = 0; jj < n; ++jj) a = fmaf(pr[jj], vt[jj * kdv + d], a);
        acc[idx] = a;
      }
    }
    __syncthreads();
  }

  // This split's partial state (empty splits write m = -inf, l = 0, acc = 0).
  if (tid < nq) {
    const int64_t w = int64_t(split) * p.rows_heads + global_query(tid);
    if (kMode == 0 || kMode == 1) p.ws_m[w] = m_s[tid];
    if (kMode == 0 || kMode == 2) p.ws_l[w] = l_s[tid];
  }
  if (kUsesV)
    for (int idx = tid; idx < nq * p.dv; idx += kSplitThreads) {
      const int qi = idx / p.dv, d = idx % p.dv;
      p.ws_acc[(int64_t(split) * p.rows_heads + global_query(qi)) * p.dv + d] = acc[idx];
    }
}

struct CombineParams {
  const void* sinks;
  int sinks_code;
  int act;
  int heads, dv, splits;
  int64_t rows_heads;
  bool eager;
  const double* ws_l;
  const float* ws_m;
  const float* ws_acc;
  void* out;  // [rows, heads * dv] of dtype act
};

inline constexpr int kCombineThreads = 128;

// One warp per (row, head). sdpa: M = max over splits (and the unrounded sink), output
// round(sum_s acc_s exp(m_s - M) / (sum_s l_s exp(m_s - M) + exp(sink - M))). eager: the splits
// already hold normalised, rounded products: round(sum_s acc_s).
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(CombineParams p) {
  moex::cuda::pdl_enter();
  const int64_t gq = int64_t(blockIdx.x) * (kCombineThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (gq >= p.rows_heads) return;
  if (p.eager) {
    for (int d = lane; d < p.dv; d += 32) {
      float o = 0.f;
      for (int s = 0; s < p.splits; ++s) o += p.ws_acc[(int64_t(s) * p.rows_heads + gq) * p.dv + d];
      store_code(p.out, p.act, gq * p.dv + d, round_code(o, p.act));
    }
    return;
  }
  const int h = int(gq % p.heads);
  float M = -INFINITY;
  for (int s = 0; s < p.splits; ++s) M = fmaxf(M, p.ws_m[int64_t(s) * p.rows_heads + gq]);
  const float sink = p.sinks ? moex::cuda::load_float(p.sinks, p.sinks_code, h) : -INFINITY;
  const float Mx = fmaxf(M, sink);
  float L = 0.f;
  if (Mx > -INFINITY) {
    for (int s = 0; s < p.splits; ++s) {
      const float m = p.ws_m[int64_t(s) * p.rows_heads + gq];
      if (m > -INFINITY) L += float(p.ws_l[int64_t(s) * p.rows_heads + gq]) * expf(m - Mx);
    }
    if (p.sinks) L += expf(sink - Mx);
  }
  for (int d = lane; d < p.dv; d += 32) {
    float o = 0.f;
    if (L > 0.f)
      for (int s = 0; s < p.splits; ++s) {
        const float m = p.ws_m[int64_t(s) * p.rows_heads + gq];
        if (m > -INFINITY) o += p.ws_acc[(int64_t(s) * p.rows_heads + gq) * p.dv + d] * expf(m - Mx);
      }
    store_code(p.out, p.act, gq * p.dv + d, L > 0.f ? round_code(o / L, p.act) : 0.f);
  }
}

}  // namespace moex::ops::cuda
