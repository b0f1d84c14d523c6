// Dense linears over block-scaled FP8 / FP4 weights on the host (include/moex/quant.hpp's math),
// reading the stored codes in place: no packed or full-precision copy of the weight exists.
//
// Design:
// - Each row of x is quantized once per call (quant::quantize_activation_row: dynamic e4m3 per
//   128-wide K block) and its codes decoded to float32 (exact), so the inner products are float
//   products of two exact values summed in float32.
// - y[t][n] = sum_b s_b(t) * sum_{j in b} S[n / bn][j] * dot_j(t, n), where j runs over the
//   weight's K blocks inside activation block b (FP8: bk = 128, one per b; FP4: bk = 32, four),
//   dot_j is a float32 sum over its block in k order, and the block sums are added in block order.
//   So a row's result depends on that row only (not on the other rows of the call nor on the
//   thread count; the direct and tiled paths below add in one order). The AVX-512 path sums each
//   block in 2 x 16 lanes, the portable one in 8: the two
//   agree to float32 summation-order level, each deterministic on its own.
// - On a CPU with AVX512-BF16 every call runs the experts' block-scaled kernel instead
//   (kernels.hpp: codes decoded to bf16 in registers, VDPBF16PS against bf16 copies of the
//   quantized rows; quant_linear.cpp's run_bf16), for any row count, so rows stay independent.
//   The rest of this list describes the path of other CPUs.
// - Work is split over tiles of weight rows (parallel). Calls of 1-2 rows (decode) read the codes
//   straight into the products (AVX-512: decode 16 codes in registers, FMA; measured 3.4 GB/s of
//   FP8 codes against 7 GB/s of plain reads on a shared 2-core Xeon, 16384 x 7168); larger calls
//   decode a tile of codes to float32 once into thread-local scratch, reused by every row of x,
//   so a prefill reads the weight once per call. Decode is DRAM-bound at 1 byte per FP8 weight;
//   the gap to the floor above is the decode arithmetic on two shared cores (not tuned further).
// - AVX-512 decodes FP8 with integer ops (no table), FP4 with a 16-entry permute; the portable
//   path uses tables. Chosen at run time (cpuid).
#pragma once

#include <cstdint>

#include "moex/experts.hpp"
#include "moex/tensor.hpp"

namespace moex::cpu {

// y = x W^T + b with W given by `codes` (kF8E4M3 [out, in] or kI8 [out, in / 2], FP4 pairs) and `scale`
// [ceil(out / bn), ceil(in / bk)] (kF32 or kF8E8M0) as quant.hpp defines them. x float32
// [rows, in] contiguous; bias float32 [out] or undefined; the result float32 [rows, out] rounded
// once to act. Expects validated shapes (the loader checked them).
Tensor quant_linear(const Tensor& x, const Tensor& codes, const Tensor& scale, const QuantScheme& quant,
                    int64_t out, int64_t in, const Tensor& bias, DType act);

// The same, forcing the portable path (tests compare the two).
Tensor quant_linear_portable(const Tensor& x, const Tensor& codes, const Tensor& scale,
                             const QuantScheme& quant, int64_t out, int64_t in, const Tensor& bias,
                             DType act);

}  // namespace moex::cpu
