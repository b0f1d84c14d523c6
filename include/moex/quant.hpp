// Block-scaled FP8 / FP4 weights: the one definition of the quantized math every backend,
// device and reference in moex follows.
//
// Weights (as DeepSeek-style hub checkpoints store them; transformers' FineGrainedFP8 reads the same):
//   FP8: W [N, K] float8_e4m3fn, scale S [ceil(N/bn), ceil(K/bk)] (float32 or UE8M0), bn = bk = 128;
//        W_real[n][k] = e4m3(W[n][k]) * S[n / bn][k / bk]   (`weight_scale_inv` despite the name
//        multiplies).
//   FP4: W [N, K/2] int8, two e2m1 codes per byte along K, low nibble = even column; scale
//        S [N, K/32] UE8M0 (bn = 1, bk = 32); W_real[n][k] = e2m1(W[n][k]) * S[n][k / 32].
// Fused experts (gate_up [E, 2I, H]) keep gate's and up's scale rows one after the other:
// gate_up_scale [E, 2 * ceil(I/bn), ceil(H/bk)], so row r reads scale row
// fused_scale_row(r, I, bn) and a gate block never straddles into up (transformers' fused
// FP8Experts allocates at least two scale rows for the same reason).
//
// Activations (dynamic scheme): each row of x is quantized per kActBlock-wide block along K:
//   s_b = max(amax_b / 448, 1e-12) (float32), q = e4m3_rne(x / s_b)
// (transformers' fine-grained FP8 kernel: amax / 448 floored at 1e-12), and
//   y[n] = sum_b s_b * sum_{k in b} q[k] * W_real[n][k]
// accumulated in float32 (float64 in the reference). FP4 weights use the same activation
// blocks (their 32-wide weight blocks nest inside).
#pragma once

#include <cstdint>

#include "moex/dtype.hpp"

namespace moex::quant {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kMinActScale = 1e-12f;
inline constexpr int64_t kActBlock = 128;
inline constexpr int64_t kFp8Block = 128;  // bn = bk for FP8 weights
inline constexpr int64_t kFp4BlockK = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale row of fused gate_up row r (intermediate I, block rows bn): gate rows first, then up.
inline int64_t fused_scale_row(int64_t r, int64_t intermediate, int64_t bn) {
  return r < intermediate ? r / bn : ceil_div(intermediate, bn) + (r - intermediate) / bn;
}

// One stored scale (float32 or UE8M0 byte) as float.
inline float scale_value(const void* scales, DType dt, int64_t i) {
  return dt == DType::kF8E8M0 ? e8m0_to_float(static_cast<const uint8_t*>(scales)[i])
                              : static_cast<const float*>(scales)[i];
}

// Weight (n, k) of an FP4 matrix whose row n starts at `row` (K/2 bytes), before its scale.
inline float fp4_weight(const uint8_t* row, int64_t k) {
  const uint8_t b = row[k / 2];
  return fp4_e2m1_to_float(k % 2 ? uint8_t(b >> 4) : uint8_t(b & 0xf));
}

// Number of scale rows / columns of a block-scaled [N, K] matrix (bn, bk of its scheme); for a
// fused gated gate_up (N = 2I) the rows are 2 * ceil(I / bn), see fused_scale_row.
inline int64_t scale_rows(int64_t N, int64_t bn, bool fused_gated) {
  return fused_gated ? 2 * ceil_div(N / 2, bn) : ceil_div(N, bn);
}
inline int64_t scale_cols(int64_t K, int64_t bk) { return ceil_div(K, bk); }

// Quantizes x[0, K) per kActBlock block: q[k] e4m3 codes, scales[ceil(K / kActBlock)].
void quantize_activation_row(const float* x, int64_t K, uint8_t* q, float* scales);

// The same, returning the dequantized values q * s (what the quantized product sees of x).
void fake_quantize_activation_row(const float* x, int64_t K, float* out);

}  // namespace moex::quant
