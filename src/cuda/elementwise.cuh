// Elementwise and small kernels around the grouped GEMMs: the deterministic combine, the gather of
// hidden rows, the stand-alone activation and eager's dense product.
#pragma once

#include "cuda/common.cuh"
#include "cuda/launchers.hpp"
#include "cuda/pdl.cuh"

namespace moex::cuda {

// One thread per (token, V consecutive columns); the slot loop is in order j = 0..k-1, so each
// output is the same fp32 sum regardless of how pairs were grouped, rounded once. V = 4 (hidden a
// multiple of 4: 16-byte loads of y) keeps 4x the bytes in flight per thread, which is what the
// small-k shapes need to approach DRAM speed (Mixtral, k = 2: 98 us at 1.7 TB/s with V = 1).
// Y: fp32 rows, or (the fused path) rows already rounded to T; round_weights: each routing weight
// rounded to T first (as transformers' sonicmoe passes the router scores in the hidden dtype).
template <class T, class Y, class Index, int V>
__global__ void combine_kernel(const Y* __restrict__ y, const int* __restrict__ pos_of_pair,
                               const Index* __restrict__ idx, const void* __restrict__ weights,
                               int weights_code, bool per_expert, bool round_weights, int top_k,
                               int experts, int hidden, T* __restrict__ out) {
  pdl_enter();
  // Tokens on grid x (up to 2^31 - 1), column blocks on grid y (at most 65535).
  const int64_t t = blockIdx.x;
  const int col = (blockIdx.y * blockDim.x + threadIdx.x) * V;
  if (col >= hidden) return;
  float acc[V] = {};
  for (int j = 0; j < top_k; ++j) {
    // No pos_of_pair: pair p's output is row p (batched_mm), none for a sentinel id.
    int pos;
    if (pos_of_pair) {
      pos = pos_of_pair[t * top_k + j];
    } else {
      const int64_t id = int64_t(idx[t * top_k + j]);
      pos = id >= 0 && id < experts ? int(t * top_k + j) : -1;
    }
    if (pos < 0) continue;
    int64_t wi = per_expert ? t * experts + int64_t(idx[t * top_k + j]) : t * top_k + j;
    float w = load_float(weights, weights_code, wi);
    if (round_weights) w = to_float(from_float<T>(w));
    const Y* yr = y + int64_t(pos) * hidden + col;
    if constexpr (V == 4 && std::is_same_v<Y, float>) {
      const float4 v = *reinterpret_cast<const float4*>(yr);
      acc[0] += w * v.x;
      acc[1] += w * v.y;
      acc[2] += w * v.z;
      acc[3] += w * v.w;
    } else if constexpr (V == 4) {  // four 16-bit values: one 8-byte load
      const uint2 u = *reinterpret_cast<const uint2*>(yr);
      Y v[4];
      memcpy(v, &u, sizeof u);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += w * to_float(v[i]);
    } else {
      acc[0] += w * to_float(yr[0]);
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) out[t * hidden + col + v] = from_float<T>(acc[v]);
}

template <class T>
__global__ void gather_kernel(const T* __restrict__ src, const int* __restrict__ sorted_pair,
                              int top_k, int cols, T* __restrict__ dst) {
  const int64_t r = blockIdx.x;
  const int64_t token = sorted_pair[r] / top_k;
  for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < cols; c += gridDim.y * blockDim.x)
    dst[r * cols + c] = src[token * cols + c];
}

template <class T>
__global__ void activation_kernel(const float* __restrict__ gu, int I, bool gated,
                                  bool concatenated, ActParams ap, T* __restrict__ h) {
  const int64_t r = blockIdx.x;
  const int R = gated ? 2 * I : I;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < I; i += gridDim.y * blockDim.x) {
    float v;
    if (gated) {
      int gi = concatenated ? i : 2 * i;
      int ui = concatenated ? I + i : 2 * i + 1;
      v = act_gated(ap, gu[r * R + gi], gu[r * R + ui]);
    } else {
      v = act_single(ap.act, gu[r * R + i]);
    }
    h[r * I + i] = from_float<T>(v);
  }
}

// Eager's product: a 16x16 thread block computes a 64x64 tile, 4x4 outputs per thread, with
// generic strides for W so one kernel serves both weight layouts. fp32 FMA throughout.
constexpr int kDenseTile = 64;
constexpr int kDenseK = 16;
template <class T>
__global__ void dense_linear_kernel(const T* __restrict__ a, int64_t m, int k,
                                    const T* __restrict__ w, int64_t sn, int64_t sk,
                                    const T* __restrict__ bias, int n, float* __restrict__ c) {
  __shared__ float As[kDenseK][kDenseTile + 1];
  __shared__ float Bs[kDenseK][kDenseTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int64_t m0 = int64_t(blockIdx.y) * kDenseTile;
  const int n0 = blockIdx.x * kDenseTile;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += kDenseK) {
    for (int i = tid; i < kDenseTile * kDenseK; i += 256) {
      int r = i / kDenseK, kk = i % kDenseK;
      int64_t gm = m0 + r;
      int gk = k0 + kk;
      As[kk][r] = (gm < m && gk < k) ? to_float(a[gm * k + gk]) : 0.f;
      int gn = n0 + r;
      Bs[kk][r] = (gn < n && gk < k) ? to_float(w[gn * sn + int64_t(gk) * sk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDenseK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int64_t gm = m0 + ty + 16 * i;
    if (gm >= m) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int gn = n0 + tx + 16 * j;
      if (gn < n) c[gm * n + gn] = acc[i][j] + (bias ? to_float(bias[gn]) : 0.f);
    }
  }
}

}  // namespace moex::cuda
