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
  bool out_elem;  // kDown: y rounded to the element type instead of fp32
  const void* pair_expert;  // GroupedGemmArgs::pair_expert
  bool pair_i64;
  int experts;
  int* item_claims;  // GroupedGemmArgs::item_claims
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
  p.out_elem = g.out_elem;
  p.pair_expert = g.pair_expert;
  p.pair_i64 = g.pair_i64;
  p.experts = g.experts;
  p.item_claims = g.item_claims;
  return p;
}

// Row of the stored weight matrix that holds output column j of group g (0 gate / 1 up). Ungated
// and down projections have one group whose rows are the output columns.
template <int kGroups>
__device__ __forceinline__ int64_t b_source_row(const GemmParams& p, int j, int g) {
  if (kGroups == 1) return j;
  return p.concatenated ? (g ? int64_t(p.I) + j : int64_t(j)) : 2 * int64_t(j) + g;
}

// The route tile of this block (blockIdx.x); false when the block has none (past the tiles, an
// empty slot, a sentinel pair). Per pair (p.pair_expert), the expert id comes straight from the
// router's output, so batched_mm needs no routing kernel between the router and its GEMMs.
__device__ __forceinline__ bool block_tile(const GemmParams& p, Tile& t) {
  const int b = int(blockIdx.x);
  if (p.pair_expert) {
    const int64_t id = p.pair_i64 ? static_cast<const int64_t*>(p.pair_expert)[b]
                                  : int64_t(static_cast<const int*>(p.pair_expert)[b]);
    t = Tile{int(id), b, 1, 0};
    return id >= 0 && id < p.experts;
  }
  if (b >= *p.num_tiles) return false;
  t = p.tiles[b];
  return t.rows > 0;
}

// The token whose hidden row gate_up reads at sorted position `pos`.
__device__ __forceinline__ int64_t token_at(const GemmParams& p, int pos) {
  return (p.sorted_pair ? p.sorted_pair[pos] : pos) / p.top_k;
}

// First element of A row `pos` (a sorted position).
template <class T, GemmKind kKind>
__device__ __forceinline__ const T* a_row(const GemmParams& p, int pos) {
  const T* a = static_cast<const T*>(p.a);
  if (kKind == GemmKind::kGateUp) return a + token_at(p, pos) * p.K;
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
  if (kKind == GemmKind::kDown && !p.out_elem) static_cast<float*>(p.out)[int64_t(pos) * p.N + j] = v;
  else static_cast<T*>(p.out)[int64_t(pos) * p.N + j] = from_float<T>(v);
}

// Columns j and j + 1 in one store (j even, j + 1 < N, N even: the pair is aligned).
template <class T, GemmKind kKind, int kGroups>
__device__ __forceinline__ void epilogue_store_pair(const GemmParams& p, int expert, int pos, int j,
                                                    float g0a, float g1a, float g0b, float g1b) {
  const float va = epilogue_value<T, kKind, kGroups>(p, expert, j, g0a, g1a);
  const float vb = epilogue_value<T, kKind, kGroups>(p, expert, j + 1, g0b, g1b);
  if (kKind == GemmKind::kDown && !p.out_elem) {
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
