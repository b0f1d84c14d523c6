// Block-scaled FP8 / FP4 products on the CUDA cores: the dynamic 1 x 128 activation quantizer and
// a grouped GEMM that reads e4m3 / e2m1 weights in place, following include/moex/quant.hpp exactly
// (the decode-sized GEMV that shares these helpers is quant_gemv.cuh).
//
// Why CUDA cores: any shape and layout, FP4, and the quant.hpp math to float32 rounding (the
// experts harness compares every backend with one float64 reference): e4m3 x e4m3 products are
// exact in fp32, summed in fp32 over each 128-wide K block, then scaled by the activation and
// weight scales of that block. Large FP8 grouped calls on Hopper run the tensor-core version of
// the same math instead (grouped_gemm_wgmma.cuh, FP8: block sums from wgmma e4m3, scaled and
// added in fp32 per block).
//
// Tiles: a 16 x 16 thread block computes 32 rows x 32 output columns of kGroups weight groups
// (gate and up side by side, so the activation is fused as in grouped_gemm_simt.cuh), walking a
// tile's rows 32 at a time (eager hands whole experts as one tile). A rows are activation codes
// (quantize_act_kernel), B rows are decoded to float in shared memory.
#pragma once

#include <cuda_fp8.h>

#include "cuda/gemm_common.cuh"
#include "cuda/pdl.cuh"

namespace moex::cuda {

constexpr int kQuantBlockK = 128;  // quant::kActBlock = the FP8 weight block
constexpr int kQuantFp4BlockK = 32;

__device__ __forceinline__ float e4m3_value(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(b), __NV_E4M3);
  return __half2float(__half(h));
}
// Selects, not branches: the GEMV reads one per weight row and load.
__device__ __forceinline__ float e8m0_value(uint8_t c) {
  uint32_t v = c == 0 ? 0x00400000u : uint32_t(c) << 23;  // 0: 2^-127
  v = c == 0xff ? 0x7fc00000u : v;
  return __uint_as_float(v);
}
// e2m1 code (low 4 bits): sign, two exponent bits (bias 1), one mantissa bit.
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t e = (code >> 1) & 3u, m = code & 1u;
  const float mag = e == 0 ? 0.5f * float(m) : (1.f + 0.5f * float(m)) * float(1u << (e - 1));
  return (code & 8u) ? -mag : mag;
}

// x / s rounded to e4m3 (nearest even). The host quantizer (quant::float_to_f8e4m3) does not
// saturate, but here |x / s| <= 448 (s >= amax / 448, rounded), where saturating and not agree,
// and NaN stays NaN in both; Hopper converts with saturation in hardware (cvt ... satfinite,
// two values per instruction), without it in a software sequence of some 30 instructions,
// which bound the quantizers below at a quarter of DRAM bandwidth.
__device__ __forceinline__ uint8_t act_code(float v) {
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ uint32_t act_codes2(float lo, float hi) {
  return uint32_t(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

// One warp per (row, 128-block): s = max(amax / 448, 1e-12), q = e4m3_rne(x / s).
// Rows at or past *valid_rows (when given) are skipped.
template <class T>
__global__ void __launch_bounds__(256) quantize_act_kernel(const T* __restrict__ x, int64_t rows,
                                                           int K, const int* valid_rows,
                                                           uint8_t* __restrict__ q,
                                                           float* __restrict__ s) {
  const int nb = (K + kQuantBlockK - 1) / kQuantBlockK;
  const int64_t id = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (id >= rows * nb) return;
  const int64_t row = id / nb;
  const int b = int(id % nb);
  if (valid_rows && row >= *valid_rows) return;
  const T* xr = x + row * K;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = b * kQuantBlockK + lane + 32 * i;
    v[i] = k < K ? to_float(xr[k]) : 0.f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float sc = fmaxf(amax / 448.f, 1e-12f);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int k = b * kQuantBlockK + lane + 32 * i;
    if (k < K) q[row * K + k] = act_code(v[i] / sc);
  }
  if (lane == 0) s[row * nb + b] = sc;
}

// The same quantizer, vectorised: one CTA per row, each half-warp one 128-wide block at a time
// (16 bytes of x per lane, amax over the half-warp by shuffles, 8 codes per lane). The codes
// and scales are bit for bit those of quantize_act_kernel (same per-element math). Rows r >=
// *valid_rows are skipped, or with valid_rows null those with sorted_pair[r] < 0 (the masked
// layout's free positions). With sorted_pair and top_k > 0 the row r
// is read from x[sorted_pair[r] / top_k] (the FP8 wgmma path's gather fused into the quantizer:
// the gathered bf16 copy [P, K] is neither written nor read back); with by_block the scales are
// stored s[b, r] ([nb, rows], rows = the grid). Needs K % 8 == 0 and 16-byte aligned rows
// (launch_quantize_act_gathered checks).
// Why: on the H200 the gather (0.45 ms) and the quantizer (1.37 ms, 21 % of DRAM bandwidth)
// of a DeepSeek-V3-sized FP8 call at T = 8192 took half as long as its gate_up GEMM
// (docs/cuda.md); 16-byte loads, 8-byte stores and the conversions two at a time (act_codes2).
constexpr int kQuantRowThreads = 256;
constexpr int kQuantRowUnroll = 4;  // 128-wide blocks in flight per half-warp
template <class T>
__global__ void __launch_bounds__(kQuantRowThreads) quantize_rows_kernel(
    const T* __restrict__ x, int K, const int* valid_rows, const int* __restrict__ sorted_pair,
    int top_k, uint8_t* __restrict__ q, float* __restrict__ s, bool by_block) {
  static_assert(sizeof(T) == 2, "16-bit activations");
  const int64_t r = blockIdx.x;
  if (valid_rows ? r >= *valid_rows : sorted_pair && sorted_pair[r] < 0) return;
  const int64_t src = sorted_pair && top_k > 0 ? int64_t(sorted_pair[r] / top_k) : r;
  const int nb = (K + kQuantBlockK - 1) / kQuantBlockK;
  const int half = threadIdx.x / 16, l = threadIdx.x % 16;
  constexpr int kHalves = kQuantRowThreads / 16;
  const T* xr = x + src * K;
  for (int b0 = half; b0 < nb; b0 += kHalves * kQuantRowUnroll) {
    uint4 raw[kQuantRowUnroll];
#pragma unroll
    for (int u = 0; u < kQuantRowUnroll; ++u) {
      const int k = (b0 + u * kHalves) * kQuantBlockK + 8 * l;
      raw[u] = k < K ? __ldg(reinterpret_cast<const uint4*>(xr + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kQuantRowUnroll; ++u) {
      const int b = b0 + u * kHalves;
      if (b >= nb) break;  // (uniform across the half-warp, whose lanes alone shuffle below)
      const T* e = reinterpret_cast<const T*>(&raw[u]);
      float v[8], amax = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[i] = to_float(e[i]);
        amax = fmaxf(amax, fabsf(v[i]));
      }
      const unsigned mask = 0xffffu << (threadIdx.x & 16);
#pragma unroll
      for (int o = 8; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, o, 16));
      const float sc = fmaxf(amax / 448.f, 1e-12f);
      const int k = b * kQuantBlockK + 8 * l;
      if (k < K) {
        uint32_t w[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i += 2)
          w[i / 4] |= act_codes2(v[i] / sc, v[i + 1] / sc) << (8 * (i % 4));
        *reinterpret_cast<uint2*>(q + r * K + k) = make_uint2(w[0], w[1]);
      }
      if (l == 0) s[by_block ? int64_t(b) * gridDim.x + r : r * nb + b] = sc;
    }
  }
}

// What the quantized GEMM reads beyond GemmParams.
struct QuantGemmParams {
  GemmParams g;            // w: e4m3 bytes [E, N_rows, K] or e2m1 pairs [E, N_rows, K / 2]
  const uint8_t* aq;       // activation codes [rows, K] (gate_up: one row per token)
  const float* as;         // activation scales [rows, ceil(K / 128)]
  const void* scale;       // weight scales: FP8 [E, scale_rows, ceil(K / 128)], FP4 [E, N_rows, K / 32]
  int64_t scale_expert_stride;
  int block_n;             // FP8 weight rows per scale row (128)
  int linear_rows;         // >= 0: a plain linear over this many rows (no tiles, no experts)
};

// FP8 scale row of weight row `src`: one group reads row src / block_n; a gated gate_up keeps
// gate's scale rows, then up's (quant::fused_scale_row in include/moex/quant.hpp).
template <int kGroups>
__device__ __forceinline__ int64_t fp8_scale_row(const QuantGemmParams& q, int64_t src) {
  const int64_t bn = q.block_n;
  if (kGroups == 1) return src / bn;
  const int64_t I = q.g.I;
  return src < I ? src / bn : (I + bn - 1) / bn + (src - I) / bn;
}

enum QuantKind : int { kQuantGateUp = 0, kQuantDown = 1, kQuantLinear = 2 };

template <bool kE8M0>
__device__ __forceinline__ float scale_at(const void* s, int64_t i) {
  if constexpr (kE8M0) return e8m0_value(static_cast<const uint8_t*>(s)[i]);
  else return static_cast<const float*>(s)[i];
}

template <class T, int kKind, int kGroups, bool kFp4, bool kE8M0>
__global__ void __launch_bounds__(256) grouped_gemm_quant_kernel(QuantGemmParams q) {
  constexpr int BM = 32, BN = 32, BK = 32;
  static_assert(kQuantBlockK % BK == 0 && BK % kQuantFp4BlockK == 0);
  const GemmParams& p = q.g;
  Tile tile;
  if (kKind == kQuantLinear) {
    const int r0 = int(blockIdx.x) * BM;
    if (r0 >= q.linear_rows) return;
    tile = Tile{0, r0, min(BM, q.linear_rows - r0), 0};
  } else {
    if (!block_tile(p, tile)) return;
  }
  const int n0 = blockIdx.y * BN;
  if (n0 >= p.N) return;
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[kGroups][BK][BN + 1];
  __shared__ int a_row[BM];
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
  const int K = p.K, nb = (K + kQuantBlockK - 1) / kQuantBlockK;
  const int64_t w_row_bytes = kFp4 ? K / 2 : K;
  const uint8_t* w = static_cast<const uint8_t*>(p.w) + tile.expert * p.w_expert_stride;
  const int64_t s_base = tile.expert * q.scale_expert_stride;
  const int s_cols = kFp4 ? K / kQuantFp4BlockK : nb;

  for (int r0 = 0; r0 < tile.rows; r0 += BM) {
    const int rows = min(BM, tile.rows - r0);
    __syncthreads();  // a_row of the previous chunk is no longer read
    if (tid < BM) {
      const int pos = tile.row_start + r0 + tid;
      a_row[tid] = tid >= rows ? -1 : kKind == kQuantGateUp ? int(token_at(p, pos)) : pos;
    }
    __syncthreads();
    float acc[kGroups][2][2] = {}, part[kGroups][2][2] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
      for (int i = tid; i < BM * BK; i += 256) {
        const int r = i / BK, kk = i % BK, gk = k0 + kk;
        As[kk][r] = (a_row[r] >= 0 && gk < K) ? e4m3_value(q.aq[int64_t(a_row[r]) * K + gk]) : 0.f;
      }
      for (int i = tid; i < kGroups * BN * BK; i += 256) {
        const int g = i / (BN * BK), rem = i % (BN * BK), c = rem / BK, kk = rem % BK;
        const int j = n0 + c, gk = k0 + kk;
        float v = 0.f;
        if (j < p.N && gk < K) {
          const int64_t src = b_source_row<kGroups>(p, j, g);
          if constexpr (kFp4) {
            const uint8_t byte = w[src * w_row_bytes + gk / 2];
            v = e2m1_value((gk & 1) ? byte >> 4 : byte & 15u) *
                scale_at<kE8M0>(q.scale, s_base + src * s_cols + gk / kQuantFp4BlockK);
          } else {
            v = e4m3_value(w[src * w_row_bytes + gk]);
          }
        }
        Bs[g][kk][c] = v;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; ++kk) {
        const float a0 = As[kk][ty], a1 = As[kk][ty + 16];
#pragma unroll
        for (int g = 0; g < kGroups; ++g) {
          const float b0 = Bs[g][kk][tx], b1 = Bs[g][kk][tx + 16];
          part[g][0][0] = fmaf(a0, b0, part[g][0][0]);
          part[g][0][1] = fmaf(a0, b1, part[g][0][1]);
          part[g][1][0] = fmaf(a1, b0, part[g][1][0]);
          part[g][1][1] = fmaf(a1, b1, part[g][1][1]);
        }
      }
      __syncthreads();
      // End of a 128-wide K block: apply its activation and weight scales.
      if ((k0 + BK) % kQuantBlockK == 0 || k0 + BK >= K) {
        const int b = k0 / kQuantBlockK;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int r = ty + 16 * i;
          const float sa = a_row[r] >= 0 ? q.as[int64_t(a_row[r]) * nb + b] : 0.f;
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            const int j = n0 + tx + 16 * jj;
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
              float sw = 1.f;
              if (!kFp4 && j < p.N)
                sw = scale_at<kE8M0>(q.scale,
                                     s_base + fp8_scale_row<kGroups>(q, b_source_row<kGroups>(p, j, g)) * s_cols + b);
              acc[g][i][jj] = fmaf(part[g][i][jj], sa * sw, acc[g][i][jj]);
              part[g][i][jj] = 0.f;
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = ty + 16 * i;
      if (r >= rows) continue;
      const int pos = tile.row_start + r0 + r;
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = n0 + tx + 16 * jj;
        if (j >= p.N) continue;
        if (kKind == kQuantLinear) {
          float v = acc[0][i][jj];
          if (p.bias) v += to_float(static_cast<const T*>(p.bias)[j]);
          static_cast<T*>(p.out)[int64_t(pos) * p.N + j] = from_float<T>(v);
        } else {
          constexpr GemmKind kind = kKind == kQuantGateUp ? GemmKind::kGateUp : GemmKind::kDown;
          epilogue_store<T, kind, kGroups>(p, tile.expert, pos, j, acc[0][i][jj],
                                           acc[kGroups - 1][i][jj]);
        }
      }
    }
  }
}

// The decode-sized counterpart (tiles of one or a few rows) is grouped_gemv_quant_kernel in
// quant_gemv.cuh.

}  // namespace moex::cuda
