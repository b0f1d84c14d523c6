// Pieces shared by the two grouped-GEMM kernels (tensor-core and SIMT): where a B row lives in the
// weight tensor for each layout flag, where an A row comes from, and the fused epilogues.
#pragma once

#include "cuda/common.cuh"
#include "cuda/launchers.hpp"

namespace moex::cuda {

// Runs f(T{}) with T the element type: the one run-time -> compile-time switch on Elem (host
// code of the launchers).
template <class F>
void dispatch_elem(Elem e, F&& f) {
  switch (e) {
    case Elem::kF32: f(float{}); break;
    case Elem::kF16: f(__half{}); break;
    case Elem::kBF16: f(__nv_bfloat16{}); break;
  }
}

// Plain-old-data view of GroupedGemmArgs for the device (no host types, passed by value).
struct GemmParams {
  const void* a;
  const int* sorted_pair;
  int top_k;
  const Tile* tiles;
  const int* num_tiles;
  const void* w;
  int64_t w_expert_stride;
  int64_t ldw;
  const void* bias;
  int64_t bias_expert_stride;
  int K, N, I;
  bool concatenated;
  ActParams ap;
  void* out;
};

inline GemmParams to_params(const GroupedGemmArgs& g) {
  GemmParams p;
  p.a = g.a;
  p.sorted_pair = g.sorted_pair;
  p.top_k = g.top_k;
  p.tiles = g.tiles;
  p.num_tiles = g.num_tiles;
  p.w = g.w;
  p.w_expert_stride = g.w_expert_stride;
  p.ldw = g.ldw;
  p.bias = g.bias;
  p.bias_expert_stride = g.bias_expert_stride;
  p.K = g.K;
  p.N = g.N;
  p.I = g.kind == GemmKind::kGateUp ? g.N : 0;
  p.concatenated = g.concatenated;
  p.ap = ActParams{g.act, g.limit, g.alpha};
  p.out = g.out;
  return p;
}

// Row of the stored weight matrix that holds output column j of group g (0 gate / 1 up). Ungated
// and down projections have one group whose rows are the output columns.
template <int kGroups>
__device__ __forceinline__ int64_t b_source_row(const GemmParams& p, int j, int g) {
  if (kGroups == 1) return j;
  return p.concatenated ? (g ? int64_t(p.I) + j : int64_t(j)) : 2 * int64_t(j) + g;
}

// First element of A row `pos` (a sorted position).
template <class T, GemmKind kKind>
__device__ __forceinline__ const T* a_row(const GemmParams& p, int pos) {
  const T* a = static_cast<const T*>(p.a);
  if (kKind == GemmKind::kGateUp) return a + int64_t(p.sorted_pair[pos] / p.top_k) * p.K;
  return a + int64_t(pos) * p.K;
}

// The fused epilogue of one output element: v[0] = group 0 (gate, or the only group), v[1] = up;
// returns the value to store (fp32 for down, before rounding to T for gate_up).
template <class T, GemmKind kKind, int kGroups>
__device__ __forceinline__ float epilogue_value(const GemmParams& p, int expert, int j, float g0,
                                                float g1) {
  if (kKind == GemmKind::kDown) {
    if (p.bias) g0 += to_float(static_cast<const T*>(p.bias)[expert * p.bias_expert_stride + j]);
    return g0;
  }
  const T* bias = static_cast<const T*>(p.bias);
  if (bias) {
    g0 += to_float(bias[expert * p.bias_expert_stride + b_source_row<kGroups>(p, j, 0)]);
    if (kGroups == 2)
      g1 += to_float(bias[expert * p.bias_expert_stride + b_source_row<kGroups>(p, j, 1)]);
  }
  return kGroups == 2 ? act_gated(p.ap, g0, g1) : act_single(p.ap.act, g0);
}

template <class T, GemmKind kKind, int kGroups>
__device__ __forceinline__ void epilogue_store(const GemmParams& p, int expert, int pos, int j,
                                               float g0, float g1) {
  const float v = epilogue_value<T, kKind, kGroups>(p, expert, j, g0, g1);
  if (kKind == GemmKind::kDown) static_cast<float*>(p.out)[int64_t(pos) * p.N + j] = v;
  else static_cast<T*>(p.out)[int64_t(pos) * p.N + j] = from_float<T>(v);
}

// Columns j and j + 1 in one store (j even, j + 1 < N, N even: the pair is aligned).
template <class T, GemmKind kKind, int kGroups>
__device__ __forceinline__ void epilogue_store_pair(const GemmParams& p, int expert, int pos, int j,
                                                    float g0a, float g1a, float g0b, float g1b) {
  const float va = epilogue_value<T, kKind, kGroups>(p, expert, j, g0a, g1a);
  const float vb = epilogue_value<T, kKind, kGroups>(p, expert, j + 1, g0b, g1b);
  if (kKind == GemmKind::kDown) {
    *reinterpret_cast<float2*>(static_cast<float*>(p.out) + int64_t(pos) * p.N + j) =
        make_float2(va, vb);
  } else {
    const T h[2] = {from_float<T>(va), from_float<T>(vb)};
    uint32_t u;
    memcpy(&u, h, sizeof u);
    *reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + int64_t(pos) * p.N + j) = u;
  }
}

}  // namespace moex::cuda
