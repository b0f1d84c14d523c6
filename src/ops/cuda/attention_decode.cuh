// Split-KV decode attention with 16-byte lanes: the bf16 / f16 decode kernel for head dims 64 and
// 128 (Qwen, Mixtral, gpt-oss), writing the same partial states as attention_split.cuh's sdpa
// pass, which its combine kernel then merges.
//
// Why a second split kernel. The general one stages 32-column tiles of K and V in shared memory
// as float32, behind three barriers per tile, and gives one thread each (query, column) dot
// product: with one query per block (batch-1 decode without GQA) 32 of its 128 threads compute
// and the loads of a tile wait for the products of the one before. On the H200 it read a 4096
// column Qwen cache at 0.33 TB/s (0.103 ms, against torch's flash decoding at 0.032 ms).
//
// Here the cache streams straight from global memory into registers: a cache row of d elements
// is d / 8 lanes' 16-byte loads (16 lanes for d 128, so a warp load covers 2 rows, 4 for d 64),
// each warp takes kDecodeKeys rows per iteration (all its loads issued before any product), and
// the four warps of a block interleave their rows over the block's split. A lane's query slice
// stays in registers, the dot product is finished by xor shuffles across the row's lanes, and
// the online softmax state (max, sum, p.v accumulator of the lane's 8 columns) lives in
// registers; the max is warp-uniform, so a rescale needs no exchange. At the end the lanes that
// hold other rows of the same columns are summed, the warps are merged through shared memory and
// the split's state (m, l, acc) goes to the workspace exactly as the general kernel writes it.
//
// Semantics: as the sdpa pass (attention_split.cuh): s = (q.k) * scale in float32, e = exp(s - m)
// with the running maximum, p = round(e) to act for p.v, the float32 sum of the unrounded e as the
// normaliser. Only the order of the float32 additions differs from the general kernel.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "ops/cuda/attention_split.cuh"

namespace moex::ops::cuda {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeKeys = 8;  // cache rows per warp and iteration

template <class T>
__device__ __forceinline__ float lane_elem(const uint4& raw, int i) {
  return to_float<T>(reinterpret_cast<const T*>(&raw)[i]);
}

// The combine of the query block's splits, run by the block whose split arrives last (the
// threadfence-reduction pattern: each block publishes its partial state, fences, and counts
// itself in; the one that completes the count reads every split's state through L2 and resets
// the counter for the next call). The arithmetic is attention_combine_kernel's sdpa path, in the
// same order, so the output has its bits. Why: at short caches the combine kernel cost ~10 us per
// layer of a batch-1 decode step (CUPTI trace, docs/gpu_model.md), a chain of dependent L2 loads
// (one per split, three loops) queued behind the next projection's weight stream, which
// programmatic launch has already started. Here the loads are issued together: one round for the
// splits' maxima and sums (a thread each), then the acc values kSplitBatch splits at a time.
inline constexpr int kCombineMaxSplits = 64;
inline constexpr int kSplitBatch = 8;

template <int kD, int kQ>
__device__ void combine_if_last(const SplitParams& p, int qb, int g, int b, int i0, int nq) {
  __shared__ int last_sh;
  __shared__ float m_sh[kQ][kCombineMaxSplits], f_sh[kQ][kCombineMaxSplits];
  __shared__ double l_sh[kQ][kCombineMaxSplits];
  __shared__ float inv_sh[kQ];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int64_t c = (int64_t(b) * gridDim.y + g) * (gridDim.x / p.splits) + qb;
    const unsigned before = atomicAdd(&p.counters[c], 1u);
    last_sh = before == unsigned(p.splits - 1);
    if (last_sh) p.counters[c] = 0u;
  }
  __syncthreads();
  if (!last_sh) return;
  __threadfence();
  for (int t = threadIdx.x; t < nq * p.splits; t += kDecodeWarps * 32) {
    const int qi = t / p.splits, sp = t % p.splits;
    const int64_t w = int64_t(sp) * p.rows_heads + split_query_index(p, b, g, i0 + qi);
    m_sh[qi][sp] = __ldcg(p.ws_m + w);
    l_sh[qi][sp] = __ldcg(p.ws_l + w);
  }
  __syncthreads();
  if (threadIdx.x < nq) {
    const int qi = threadIdx.x;
    const int h = int(split_query_index(p, b, g, i0 + qi) % p.heads);
    float M = -INFINITY;
    for (int sp = 0; sp < p.splits; ++sp) M = fmaxf(M, m_sh[qi][sp]);
    const float sink = p.sinks ? moex::cuda::load_float(p.sinks, p.sinks_code, h) : -INFINITY;
    const float Mx = fmaxf(M, sink);
    float L = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) f_sh[qi][sp] = 0.f;
    if (Mx > -INFINITY) {
      for (int sp = 0; sp < p.splits; ++sp) {
        const float m = m_sh[qi][sp];
        if (m > -INFINITY) {
          f_sh[qi][sp] = expf(m - Mx);
          L += float(l_sh[qi][sp]) * f_sh[qi][sp];
        }
      }
      if (p.sinks) L += expf(sink - Mx);
    }
    inv_sh[qi] = L;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < nq * kD; t += kDecodeWarps * 32) {
    const int qi = t / kD, d = t % kD;
    const int64_t gq = split_query_index(p, b, g, i0 + qi);
    const float L = inv_sh[qi];
    float o = 0.f;
    if (L > 0.f)
      for (int s0 = 0; s0 < p.splits; s0 += kSplitBatch) {
        float a[kSplitBatch];
#pragma unroll
        for (int j = 0; j < kSplitBatch; ++j)
          a[j] = s0 + j < p.splits ? __ldcg(p.ws_acc + (int64_t(s0 + j) * p.rows_heads + gq) * kD + d) : 0.f;
#pragma unroll
        for (int j = 0; j < kSplitBatch; ++j)
          if (s0 + j < p.splits && m_sh[qi][s0 + j] > -INFINITY) o += a[j] * f_sh[qi][s0 + j];
      }
    store_code(p.out, p.act, gq * kD + d, L > 0.f ? round_code(o / L, p.act) : 0.f);
  }
}

// grid (query blocks x splits, kv heads, batch), kDecodeWarps warps. kD: head dim of K and V
// (64 or 128); kQ: queries (tokens x heads of one GQA group) per block.
template <class T, int kD, int kQ>
__global__ void __launch_bounds__(kDecodeWarps * 32) attention_decode_vec_kernel(SplitParams p) {
  moex::cuda::pdl_enter();
  static_assert(kD == 64 || kD == 128, "lanes per row must divide a warp");
  constexpr int kLanes = kD / 8;           // lanes per cache row
  constexpr int kRows = 32 / kLanes;       // rows per warp-wide load
  constexpr int kU = kDecodeKeys / kRows;  // loads per lane, per tensor and iteration
  __shared__ float m_sh[kDecodeWarps][kQ];
  __shared__ float l_sh[kDecodeWarps][kQ];
  __shared__ __align__(16) float acc_sh[kDecodeWarps][kQ][kD];

  const int split = blockIdx.x % p.splits, qb = blockIdx.x / p.splits;
  const int g = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / kLanes, part = lane % kLanes;
  const int past = p.step[0], pad = p.step[1 + b];
  const int i0 = qb * kQ;
  const int nq = min(kQ, p.tokens * p.group - i0);
  const SplitColumns cols = split_columns(p, split, past, pad, i0, nq);
  const int lo = cols.lo, hi = cols.hi;

  uint4 qr[kQ];
  int cq[kQ];  // the query's cache column (-1: no query, sees nothing)
  float m[kQ], l[kQ], acc[kQ][8];
  const T* qg = static_cast<const T*>(p.q);
#pragma unroll
  for (int qi = 0; qi < kQ; ++qi) {
    qr[qi] = make_uint4(0, 0, 0, 0);
    cq[qi] = -1;
    if (qi < nq) {
      const int i = i0 + qi, t = i / p.group, hh = i % p.group;
      qr[qi] = *reinterpret_cast<const uint4*>(qg + (int64_t(b) * p.tokens + t) * p.q_dim +
                                               int64_t(g * p.group + hh) * kD + part * 8);
      cq[qi] = past + t;
    }
    m[qi] = -INFINITY;
    l[qi] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[qi][e] = 0.f;
  }

  const T* kg = static_cast<const T*>(p.k) + int64_t(b) * p.capacity * p.k_dim + int64_t(g) * kD + part * 8;
  const T* vg = static_cast<const T*>(p.v) + int64_t(b) * p.capacity * p.v_dim + int64_t(g) * p.v_head + part * 8;
  for (int j0 = lo + warp * kDecodeKeys; j0 < hi; j0 += kDecodeWarps * kDecodeKeys) {
    uint4 kr[kU], vr[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int j = j0 + u * kRows + sub;
      kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      if (j < hi) {
        kr[u] = __ldg(reinterpret_cast<const uint4*>(kg + int64_t(j) * p.k_dim));
        vr[u] = __ldg(reinterpret_cast<const uint4*>(vg + int64_t(j) * p.v_dim));
      }
    }
#pragma unroll
    for (int qi = 0; qi < kQ; ++qi) {
      if (qi >= nq) break;
      float s[kU];
      float mt = -INFINITY;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot = fmaf(lane_elem<T>(qr[qi], e), lane_elem<T>(kr[u], e), dot);
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        const int j = j0 + u * kRows + sub;
        const bool seen = j < hi && j <= cq[qi] && (p.window <= 0 || cq[qi] - j < p.window);
        s[u] = seen ? dot * p.scale : -INFINITY;
        mt = fmaxf(mt, s[u]);
      }
#pragma unroll
      for (int o = kLanes; o < 32; o <<= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
      const float m_new = fmaxf(m[qi], mt);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = expf(m[qi] - m_use);
      l[qi] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[qi][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const float ex = expf(s[u] - m_use);
        l[qi] += ex;
        const float pe = round_code(ex, p.act);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[qi][e] = fmaf(pe, lane_elem<T>(vr[u], e), acc[qi][e]);
      }
      m[qi] = m_new;
    }
  }

  // Sum the lanes holding other rows of the same 8 columns, then merge the warps.
#pragma unroll
  for (int qi = 0; qi < kQ; ++qi) {
#pragma unroll
    for (int o = kLanes; o < 32; o <<= 1) {
      l[qi] += __shfl_xor_sync(0xffffffffu, l[qi], o);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[qi][e] += __shfl_xor_sync(0xffffffffu, acc[qi][e], o);
    }
    if (sub == 0) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc_sh[warp][qi][part * 8 + e] = acc[qi][e];
      if (part == 0) {
        m_sh[warp][qi] = m[qi];
        l_sh[warp][qi] = l[qi];
      }
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nq * kD; idx += kDecodeWarps * 32) {
    const int qi = idx / kD, d = idx % kD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) M = fmaxf(M, m_sh[w][qi]);
    float a = 0.f, L = 0.f;
    if (M > -INFINITY)
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float mw = m_sh[w][qi];
        if (mw == -INFINITY) continue;
        const float f = expf(mw - M);
        a = fmaf(acc_sh[w][qi][d], f, a);
        L = fmaf(l_sh[w][qi], f, L);
      }
    const int64_t w = int64_t(split) * p.rows_heads + split_query_index(p, b, g, i0 + qi);
    p.ws_acc[w * kD + d] = a;
    if (d == 0) {
      p.ws_m[w] = M;
      p.ws_l[w] = double(L);
    }
  }
  if (p.counters) combine_if_last<kD, kQ>(p, qb, g, b, i0, nq);
}

}  // namespace moex::ops::cuda
