// Launchers of the block-scaled FP8 / FP4 kernels (quant_gemm.cuh, quant_gemv.cuh): the one run-time ->
// compile-time switch over element type, projection kind, weight format and scale format.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/launchers.hpp"
#include "cuda/quant_gemm.cuh"
#include "cuda/quant_gemv.cuh"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"

namespace moex::cuda {
namespace {

template <class T, int kKind, int kGroups>
void launch_quant_kind(const QuantGemmParams& q, const QuantWeightArgs& w, dim3 grid,
                       cudaStream_t s) {
  const dim3 block(16, 16);
  auto go = [&](auto kernel) { kernel<<<grid, block, 0, s>>>(q); };
  if (w.fp4) {
    // FP4 scales are UE8M0 by format.
    go(grouped_gemm_quant_kernel<T, kKind, kGroups, true, true>);
  } else if (w.scale_e8m0) {
    go(grouped_gemm_quant_kernel<T, kKind, kGroups, false, true>);
  } else {
    go(grouped_gemm_quant_kernel<T, kKind, kGroups, false, false>);
  }
  MOEX_CUDA_CHECK_LAUNCH(grouped_gemm_quant_kernel);
}

QuantGemmParams quant_params(const GemmParams& g, const QuantWeightArgs& w, const uint8_t* aq,
                             const float* as, int linear_rows) {
  QuantGemmParams q;
  q.g = g;
  q.aq = aq;
  q.as = as;
  q.scale = w.scale;
  q.scale_expert_stride = w.scale_expert_stride;
  q.block_n = w.block_n;
  q.linear_rows = linear_rows;
  return q;
}

}  // namespace

void launch_quantize_act(const void* x, Elem elem, int64_t rows, int K, const int* valid_rows,
                         uint8_t* q, float* s, cudaStream_t stream) {
  launch_quantize_act_gathered(x, elem, nullptr, 0, rows, K, valid_rows, q, s, false, stream);
}

void launch_quantize_act_gathered(const void* x, Elem elem, const int* sorted_pair, int top_k,
                                  int64_t rows, int K, const int* valid_rows, uint8_t* q, float* s,
                                  bool scales_by_block, cudaStream_t stream) {
  if (rows <= 0 || K <= 0) return;
  const bool rows_kernel = elem != Elem::kF32 && K % 8 == 0 &&
                           reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                           reinterpret_cast<uintptr_t>(q) % 8 == 0;
  if ((sorted_pair || scales_by_block) && !rows_kernel)
    throw Error("launch_quantize_act_gathered: needs 16-bit rows, K a multiple of 8 (got " +
                std::to_string(K) + ") and 16-byte aligned tensors");
  if (rows_kernel) {
    if (rows > int64_t(INT32_MAX)) throw Error("launch_quantize_act_gathered: too many rows");
    dispatch_elem(elem, [&](auto t) {
      using T = decltype(t);
      if constexpr (sizeof(T) == 2)
        quantize_rows_kernel<T><<<unsigned(rows), kQuantRowThreads, 0, stream>>>(
            static_cast<const T*>(x), K, valid_rows, sorted_pair, top_k, q, s, scales_by_block);
    });
    MOEX_CUDA_CHECK_LAUNCH(quantize_rows_kernel);
    return;
  }
  const int64_t warps = rows * ((K + kQuantBlockK - 1) / kQuantBlockK);
  const unsigned blocks = unsigned((warps + 7) / 8);
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    quantize_act_kernel<T><<<blocks, 256, 0, stream>>>(static_cast<const T*>(x), rows, K,
                                                       valid_rows, q, s);
  });
  MOEX_CUDA_CHECK_LAUNCH(quantize_act_kernel);
}

void launch_grouped_gemm_quant(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                               const uint8_t* aq, const float* as, cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  const QuantGemmParams q = quant_params(to_params(a), w, aq, as, -1);
  const dim3 grid(unsigned(a.max_tiles), unsigned((a.N + 31) / 32));
  dispatch_elem(a.elem, [&](auto t) {
    using T = decltype(t);
    if (a.kind == GemmKind::kDown) launch_quant_kind<T, kQuantDown, 1>(q, w, grid, stream);
    else if (a.gated) launch_quant_kind<T, kQuantGateUp, 2>(q, w, grid, stream);
    else launch_quant_kind<T, kQuantGateUp, 1>(q, w, grid, stream);
  });
}

namespace {
// Output columns one GEMV block of W warps covers: W warps of kQuantGemvWeightRows weight rows
// (gate and up rows of a column side by side when gated).
int64_t gemv_col_blocks(int64_t N, int groups, int W = kQuantGemvWarps) {
  const int64_t cols = int64_t(W) * (kQuantGemvWeightRows / groups);
  return (N + cols - 1) / cols;
}

template <class T, int kKind, int kGroups, int kChunk, int W = kQuantGemvWarps>
void launch_gemv_quant_chunk(const QuantGemmParams& q, const QuantWeightArgs& w, unsigned tiles,
                             cudaStream_t s) {
  const dim3 grid(tiles, unsigned(gemv_col_blocks(q.g.N, kGroups, W)));
  auto go = [&](auto kernel) { launch_pdl(kernel, grid, dim3(W * 32), 0, s, current_device(), q); };
  constexpr int R = kQuantGemvWeightRows;
  if (w.fp4) go(grouped_gemv_quant_kernel<T, kKind, kGroups, true, true, W, R, kChunk>);
  else if (w.scale_e8m0) go(grouped_gemv_quant_kernel<T, kKind, kGroups, false, true, W, R, kChunk>);
  else go(grouped_gemv_quant_kernel<T, kKind, kGroups, false, false, W, R, kChunk>);
}

template <class T, int kKind, int kGroups>
void launch_gemv_quant_kind(const QuantGemmParams& q, const QuantWeightArgs& w, unsigned tiles,
                            int max_tile_rows, cudaStream_t s) {
  constexpr int kOneRowWarps = kKind == kQuantLinear ? kQuantGemvWarps : kQuantGemvOneRowWarps;
  if (max_tile_rows <= 1) launch_gemv_quant_chunk<T, kKind, kGroups, 1, kOneRowWarps>(q, w, tiles, s);
  else launch_gemv_quant_chunk<T, kKind, kGroups, kQuantGemvRowChunk>(q, w, tiles, s);
}
}  // namespace

void launch_grouped_gemv_quant(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                               const uint8_t* aq, const float* as, int max_tile_rows,
                               cudaStream_t stream) {
  if (a.max_tiles <= 0 || a.N <= 0) return;
  if (a.K % (w.fp4 ? 32 : 16) != 0)
    throw Error("launch_grouped_gemv_quant: K must be a multiple of 16 (FP8) / 32 (FP4)");
  const int groups = a.kind == GemmKind::kGateUp && a.gated ? 2 : 1;
  // The one-row instance's narrower blocks make the most column blocks.
  if (gemv_col_blocks(a.N, groups, std::min(kQuantGemvWarps, kQuantGemvOneRowWarps)) > 65535)
    throw Unsupported("quantized GEMV: " + std::to_string(a.N) + " output columns");
  const QuantGemmParams q = quant_params(to_params(a), w, aq, as, -1);
  const unsigned tiles = unsigned(a.max_tiles);
  dispatch_elem(a.elem, [&](auto t) {
    using T = decltype(t);
    const int rows = max_tile_rows;
    if (a.kind == GemmKind::kDown) launch_gemv_quant_kind<T, kQuantDown, 1>(q, w, tiles, rows, stream);
    else if (a.gated) launch_gemv_quant_kind<T, kQuantGateUp, 2>(q, w, tiles, rows, stream);
    else launch_gemv_quant_kind<T, kQuantGateUp, 1>(q, w, tiles, rows, stream);
  });
}

void launch_linear_quant(const uint8_t* aq, const float* as, int64_t rows, int K, int N,
                         const void* w, const QuantWeightArgs& qw, const void* bias, Elem elem,
                         void* out, cudaStream_t stream) {
  if (rows <= 0 || N <= 0) return;
  GroupedGemmArgs a;
  a.elem = elem;
  a.w = w;
  a.ldw = K;
  a.bias = bias;
  a.K = K;
  a.N = N;
  a.out = out;
  GemmParams g = to_params(a);
  g.I = 0;
  const QuantGemmParams q = quant_params(g, qw, aq, as, int(rows));
  // Decode-sized calls stream the weight through the GEMV (all rows in one tile).
  const bool gemv = rows <= kQuantLinearGemvMaxRows && K % (qw.fp4 ? 32 : 16) == 0 &&
                    (reinterpret_cast<uintptr_t>(w) & 15) == 0 &&
                    gemv_col_blocks(N, 1) <= 65535;
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    if (gemv) {
      launch_gemv_quant_kind<T, kQuantLinear, 1>(q, qw, 1u, int(rows), stream);
    } else {
      const dim3 grid(unsigned((rows + 31) / 32), unsigned((N + 31) / 32));
      launch_quant_kind<T, kQuantLinear, 1>(q, qw, grid, stream);
    }
  });
}

}  // namespace moex::cuda
