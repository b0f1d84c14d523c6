// The decode-sized quantized product (FP8 e4m3 / FP4 e2m1 weights, e4m3 activation codes): route
// tiles of one or a few rows (batched_mm's one pair per tile, grouped_mm up to 16 rows per tile,
// quantized linears up to 16 rows), reading the weights in place, the quant.hpp math to float32
// rounding (quant_gemm.cuh says why CUDA cores).
//
// Layout: a warp owns kWRows weight rows (gate and up of kWRows / 2 output columns for gated
// gate_up, kWRows columns otherwise) and streams them along the whole of K: each lane issues one
// 16-byte load per weight row per 512-byte step (coalesced: 32 lanes read 512 contiguous bytes of
// a row), with the next step's loads issued before the current step is computed. A block is
// kWarps independent warps (no shared memory, no block barrier), so a block ends as soon as its
// warps do and small K (the down projection's K = I) still keeps every lane busy.
//
// Rows: the rows of a tile are computed in chunks of up to kQuantGemvRowChunk rows, each weight
// byte decoded once per chunk and multiplied with every row of it; chunks of 1, 2, 4 or 8 rows
// are compiled separately, so a one-row tile does no padding work. A tile of up to 8 rows (every
// grouped_mm tile at DeepSeek-like decode sizes) reads its weights from DRAM once.
//
// Decode: e4m3 pairs with the hardware conversion to f16x2 (e4m3 is a subset of f16, exact), then
// f16x2 -> float2. e2m1 nibbles with bit operations into f16 at 2^-14 times their value: the
// three magnitude bits go under the f16 exponent's two low bits (e2m1 and f16 subnormals line up
// at that offset: 0.5 -> 2^-15, 1 -> 2^-14, ..., 6 -> 1.5 * 2^-12), the sign to bit 15; the
// 2^-14 is undone (exactly) on each 32-wide block sum. Products of the decoded values are exact
// in fp32.
//
// Sums: each lane sums the products of one 16-byte load (16 FP8 weights: inside one 128-wide
// block; 32 FP4 weights: exactly one 32-wide FP4 scale block) in fp32 and adds that partial times
// (activation scale x weight scale) of its block to its fp32 accumulator, the same grouping as the
// tile kernel's per-block sums to float32 rounding. Lanes are then reduced with shuffle-xor in a
// fixed order: the result does not depend on the launch.
//
// Needs K a multiple of 16 (FP8) / 32 (FP4) and 16-byte aligned weight rows (quant_gemv_applies
// in experts_plan.hpp).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "cuda/quant_gemm.cuh"

namespace moex::cuda {

constexpr int kQuantGemvWarps = 4;       // warps per block
constexpr int kQuantGemvWeightRows = 4;  // weight rows per warp
// Warps per block of the experts' one-row instance: half the block, twice the blocks, a shorter
// tail at the grid's end. H100, DeepSeek-V3 shape (256 experts), T = 1 batched_mm: FP8 0.1376 /
// 0.1379 -> 0.1357 / 0.1360 ms, FP4 level (0.0909 / 0.0910 -> 0.0910 / 0.0910), T = 4 0.7-0.4 %
// faster. Fewer registers per thread (2 weight rows, or launch bounds of 6-12 blocks per SM)
// lost for both formats (docs/cuda.md, "The one-row GEMV's shape").
constexpr int kQuantGemvOneRowWarps = 2;
// Tile rows per pass over the weights: 4 for tiles of several rows; calls whose tiles hold one
// row (batched_mm's pairs, any call at T = 1) launch the 1-row instance, whose registers do not
// pay for the wider chunks (lab/cuda/quant_gemv_lab.cu on the H200: 8-row chunks cost 28 % at
// T = 1 and 4-row chunks beat 8 at T = 4 and 16).
constexpr int kQuantGemvRowChunk = 4;

// Four e4m3 codes (one 32-bit word, lowest byte first) -> four floats, in order.
__device__ __forceinline__ void e4m3x4_to_float(uint32_t v, float* f) {
  const __half2 lo(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3));
  const __half2 hi(__nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// Eight e2m1 codes (one 32-bit word, column c in bits [4c, 4c + 4)) -> four f16x2 at 2^-14
// times their values: columns {0,2}, {4,6}, {1,3}, {5,7}.
//
// An e2m1 code s e1 e0 m placed as an f16's high byte s 000 e1 e0 m 0 (low byte zero) is 2^-14
// times its value (the layout above). That byte is ((x & 7) << 1) | ((x & 8) << 4) of the
// nibble x, formed for the four even columns (bytes of v) and the four odd ones (bytes of v >> 4)
// at once, and a byte permute with the zero register moves two such bytes into the high bytes of
// an f16x2: 11 integer instructions per word where shifting each pair into place took 16 (on an
// H100 the FP4 GEMV at T = 1 went 0.1074 -> 0.1005 ms with this and e8m0_value's selects; fewer
// instructions still, by staging the activation row or by mma.sync, did not pay: docs/cuda.md).
__device__ __forceinline__ void e2m1x8_to_h2_scaled(uint32_t v, uint32_t* h) {
  const uint32_t even = ((v << 1) & 0x0e0e0e0eu) | ((v << 4) & 0x80808080u);  // columns 0 2 4 6
  const uint32_t odd = ((v >> 3) & 0x0e0e0e0eu) | (v & 0x80808080u);          // columns 1 3 5 7
  // Selector nibbles (lowest first) pick a byte of (x, 0): 4 = a zero byte.
  h[0] = __byte_perm(even, 0u, 0x1404u);  // columns 0, 2
  h[1] = __byte_perm(even, 0u, 0x3424u);  // 4, 6
  h[2] = __byte_perm(odd, 0u, 0x1404u);   // 1, 3
  h[3] = __byte_perm(odd, 0u, 0x3424u);   // 5, 7
}

// The same eight codes as floats, in column order.
__device__ __forceinline__ void e2m1x8_to_float_scaled(uint32_t v, float* f) {
  uint32_t h[4];
  e2m1x8_to_h2_scaled(v, h);
  constexpr int kFirst[4] = {0, 4, 1, 5};  // column of each f16x2's low half (high: + 2)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 p;
    memcpy(&p, &h[i], sizeof p);
    const float2 a = __half22float2(p);
    f[kFirst[i]] = a.x;
    f[kFirst[i] + 2] = a.y;
  }
}

// Where one warp reads and writes, fixed for the whole kernel.
template <int kWRows>
struct QuantGemvWarp {
  const uint8_t* wrow[kWRows];  // first byte of each weight row
  int64_t srow[kWRows];         // index of each row's first weight scale
  int64_t row_bytes;            // bytes of one weight row
  int j0, cols;                 // first output column, valid columns (<= kWRows / kGroups)
};

// A row of a tile: the activation row it reads.
template <int kKind>
__device__ __forceinline__ int64_t quant_gemv_arow(const GemmParams& p, int pos) {
  return kKind == kQuantGateUp ? token_at(p, pos) : int64_t(pos);
}

// Rows [r0, r0 + n) of the tile (n <= R; rows past n repeat the last one and are not stored).
template <class T, int kKind, int kGroups, bool kFp4, bool kE8M0, int kWRows, int R>
__device__ __forceinline__ void quant_gemv_rows(const QuantGemmParams& q, const Tile& tile,
                                                const QuantGemvWarp<kWRows>& w, int r0, int n,
                                                int lane) {
  const GemmParams& p = q.g;
  constexpr int kCols = kWRows / kGroups;
  constexpr int kPerLoad = kFp4 ? 32 : 16;  // weights per 16-byte load
  constexpr int kPieces = 4;                // 32-bit words per load
  constexpr int kPerPiece = kPerLoad / kPieces;
  const int K = p.K, nb = (K + kQuantBlockK - 1) / kQuantBlockK;
  int arow[R];  // activation row of each tile row
#pragma unroll
  for (int r = 0; r < R; ++r) arow[r] = int(quant_gemv_arow<kKind>(p, tile.row_start + r0 + min(r, n - 1)));
  float acc[R][kWRows];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < kWRows; ++i) acc[r][i] = 0.0f;

  int64_t kb = int64_t(lane) * 16;  // byte offset in a weight row
  uint4 cur[kWRows] = {};
  if (kb < w.row_bytes) {
#pragma unroll
    for (int i = 0; i < kWRows; ++i) cur[i] = __ldg(reinterpret_cast<const uint4*>(w.wrow[i] + kb));
  }
  for (; kb < w.row_bytes; kb += 32 * 16) {
    // The next step's weights are in flight while this step is computed.
    uint4 nxt[kWRows] = {};
    const int64_t kn = kb + 32 * 16;
    if (kn < w.row_bytes) {
#pragma unroll
      for (int i = 0; i < kWRows; ++i) nxt[i] = __ldg(reinterpret_cast<const uint4*>(w.wrow[i] + kn));
    }
    const int64_t k = kFp4 ? 2 * kb : kb;  // first weight (column of K) of this load
    float part[R][kWRows];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kWRows; ++i) part[r][i] = 0.0f;
#pragma unroll
    for (int pc = 0; pc < kPieces; ++pc) {
      float wf[kWRows][kPerPiece];
#pragma unroll
      for (int i = 0; i < kWRows; ++i) {
        const uint32_t word = (&cur[i].x)[pc];
        if constexpr (kFp4) e2m1x8_to_float_scaled(word, wf[i]);
        else e4m3x4_to_float(word, wf[i]);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float af[kPerPiece];
        const uint8_t* ap = q.aq + int64_t(arow[r]) * K + k + pc * kPerPiece;
        if constexpr (kFp4) {
          const uint2 a2 = __ldg(reinterpret_cast<const uint2*>(ap));
          e4m3x4_to_float(a2.x, af);
          e4m3x4_to_float(a2.y, af + 4);
        } else {
          e4m3x4_to_float(__ldg(reinterpret_cast<const uint32_t*>(ap)), af);
        }
#pragma unroll
        for (int i = 0; i < kWRows; ++i)
#pragma unroll
          for (int e = 0; e < kPerPiece; ++e) part[r][i] = fmaf(af[e], wf[i][e], part[r][i]);
      }
    }
    // Scales of this load's block: one activation scale per row, one weight scale per weight row.
    float sw[kWRows];
#pragma unroll
    for (int i = 0; i < kWRows; ++i)
      sw[i] = scale_at<kE8M0>(q.scale, w.srow[i] + (kFp4 ? k / kQuantFp4BlockK : k / kQuantBlockK));
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float sa = __ldg(q.as + int64_t(arow[r]) * nb + k / kQuantBlockK);
#pragma unroll
      for (int i = 0; i < kWRows; ++i) {
        // FP4: the decoded weights were 2^-14 times their value (a power of two: exact).
        const float s = kFp4 ? part[r][i] * 16384.0f : part[r][i];
        acc[r][i] = fmaf(s, sa * sw[i], acc[r][i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kWRows; ++i) cur[i] = nxt[i];
  }

  // Fixed-order reduction over the lanes; then lane r * kCols + c stores row r, column c.
  float mine[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < kWRows; ++i) {
      float v = acc[r][i];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == r * kCols + i % kCols) mine[i / kCols] = v;
    }
  static_assert(R * kCols <= 32, "one lane per stored output");
  const int r = lane / kCols, c = lane % kCols;
  if (lane >= R * kCols || r >= n || c >= w.cols) return;
  const int pos = tile.row_start + r0 + r, j = w.j0 + c;
  if constexpr (kKind == kQuantLinear) {
    float y = mine[0];
    if (p.bias) y += to_float(static_cast<const T*>(p.bias)[j]);
    static_cast<T*>(p.out)[int64_t(pos) * p.N + j] = from_float<T>(y);
  } else {
    constexpr GemmKind kind = kKind == kQuantGateUp ? GemmKind::kGateUp : GemmKind::kDown;
    epilogue_store<T, kind, kGroups>(p, tile.expert, pos, j, mine[0], mine[kGroups - 1]);
  }
}

// grid (tiles, ceil(N / (kWarps * kWRows / kGroups))); block kWarps * 32 threads.
template <class T, int kKind, int kGroups, bool kFp4, bool kE8M0, int kWarps = kQuantGemvWarps,
          int kWRows = kQuantGemvWeightRows, int kRowChunk = kQuantGemvRowChunk>
__global__ void __launch_bounds__(kWarps * 32) grouped_gemv_quant_kernel(QuantGemmParams q) {
  static_assert(kWRows % kGroups == 0);
  static_assert(kRowChunk == 1 || kRowChunk == 2 || kRowChunk == 4 || kRowChunk == 8);
  constexpr int kCols = kWRows / kGroups;
  // The tiles come from the routing kernel just before (pdl.cuh).
  pdl_wait();
  pdl_trigger();
  const GemmParams& p = q.g;
  Tile tile{0, 0, q.linear_rows, 0};  // a plain linear: every row in one tile
  if (kKind != kQuantLinear) {
    if (!block_tile(p, tile)) return;
  }
  if (tile.rows <= 0) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  QuantGemvWarp<kWRows> w;
  w.j0 = (int(blockIdx.y) * kWarps + warp) * kCols;
  if (w.j0 >= p.N) return;  // warps are independent: no barrier follows
  w.cols = min(kCols, p.N - w.j0);
  const int K = p.K;
  w.row_bytes = kFp4 ? K / 2 : K;
  const int s_cols = kFp4 ? K / kQuantFp4BlockK : (K + kQuantBlockK - 1) / kQuantBlockK;
  const uint8_t* wb = static_cast<const uint8_t*>(p.w) + tile.expert * p.w_expert_stride;
  const int64_t s_base = tile.expert * q.scale_expert_stride;
#pragma unroll
  for (int g = 0; g < kGroups; ++g)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      // Columns past N read the last valid one (not stored).
      const int64_t src = b_source_row<kGroups>(p, w.j0 + min(c, w.cols - 1), g);
      w.wrow[g * kCols + c] = wb + src * w.row_bytes;
      w.srow[g * kCols + c] = s_base + (kFp4 ? src : fp8_scale_row<kGroups>(q, src)) * s_cols;
    }
  for (int r0 = 0; r0 < tile.rows; r0 += kRowChunk) {
    const int n = min(kRowChunk, tile.rows - r0);
    if (kRowChunk >= 8 && n > 4)
      quant_gemv_rows<T, kKind, kGroups, kFp4, kE8M0, kWRows, (kRowChunk >= 8 ? 8 : 1)>(q, tile, w, r0, n, lane);
    else if (kRowChunk >= 4 && n > 2)
      quant_gemv_rows<T, kKind, kGroups, kFp4, kE8M0, kWRows, (kRowChunk >= 4 ? 4 : 1)>(q, tile, w, r0, n, lane);
    else if (kRowChunk >= 2 && n == 2)
      quant_gemv_rows<T, kKind, kGroups, kFp4, kE8M0, kWRows, (kRowChunk >= 2 ? 2 : 1)>(q, tile, w, r0, n, lane);
    else
      quant_gemv_rows<T, kKind, kGroups, kFp4, kE8M0, kWRows, 1>(q, tile, w, r0, n, lane);
  }
}

}  // namespace moex::cuda
