// Launchers of the routing, elementwise and SIMT GEMM kernels, and the element-type dispatch of
// the tensor-core GEMM (its instantiations live in grouped_gemm_mma_{bf16,f16}.cu).
#include <algorithm>
#include <cstdint>

#include "cuda/elementwise.cuh"
#include "cuda/grouped_gemm_simt.cuh"
#include "cuda/launchers.hpp"
#include "cuda/pdl.cuh"
#include "cuda/routing.cuh"
#include "cuda/runtime.hpp"

namespace moex::cuda {

void launch_grouped_gemm_mma_bf16(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream);
void launch_grouped_gemm_mma_f16(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream);

size_t elem_size(Elem e) { return e == Elem::kF32 ? 4 : 2; }
// The kernels read the routing weights' dtype as a FloatCode (common.cuh): the same values.
static_assert(int(Elem::kF32) == kCodeF32 && int(Elem::kF16) == kCodeF16 &&
              int(Elem::kBF16) == kCodeBF16);

// ---------------------------------------------------------------- routing

int64_t route_max_tiles(int64_t pairs, int64_t experts, int tile_rows) {
  // sum_e ceil(c_e / r) <= floor(P / r) + (number of non-empty experts), and <= P.
  return std::max<int64_t>(1, std::min<int64_t>(pairs, pairs / tile_rows + std::min(experts, pairs)));
}

namespace {
void launch_route(const void* idx, bool index_i64, int64_t pairs, int experts, int tile_rows,
                  int raster_tiles, int masked_rows, int* offsets, int* sorted_pair,
                  int* pos_of_pair, Tile* tiles, int max_tiles, int* num_tiles,
                  cudaStream_t stream) {
  raster_tiles = std::clamp(raster_tiles, 1, 0xffff);
  const size_t smem = size_t(3) * experts * sizeof(int);
  auto launch = [&](auto kernel, auto* index) {
    if (smem > 48 * 1024)
      MOEX_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_pdl_here(kernel, dim3(1), dim3(kRouteThreads), smem, stream, index, pairs, experts,
                    tile_rows, raster_tiles, masked_rows, offsets, sorted_pair, pos_of_pair,
                    tiles, max_tiles, num_tiles);
  };
  if (index_i64) launch(route_by_expert_kernel<int64_t>, static_cast<const int64_t*>(idx));
  else launch(route_by_expert_kernel<int32_t>, static_cast<const int32_t*>(idx));
  MOEX_CUDA_CHECK_LAUNCH(route_by_expert_kernel);
}
}  // namespace

void launch_route_by_expert(const void* idx, bool index_i64, int64_t pairs, int experts,
                            int tile_rows, int raster_tiles, int* offsets, int* sorted_pair,
                            int* pos_of_pair, Tile* tiles, int max_tiles, int* num_tiles,
                            cudaStream_t stream) {
  launch_route(idx, index_i64, pairs, experts, tile_rows, raster_tiles, 0, offsets, sorted_pair,
               pos_of_pair, tiles, max_tiles, num_tiles, stream);
}

void launch_route_masked(const void* idx, bool index_i64, int64_t pairs, int experts,
                         int masked_rows, int tile_rows, int raster_tiles, int* offsets,
                         int* sorted_pair, int* pos_of_pair, Tile* tiles, int max_tiles,
                         int* num_tiles, cudaStream_t stream) {
  if (masked_rows <= 0 || int64_t(experts) * masked_rows > int64_t(INT32_MAX))
    throw Error("launch_route_masked: masked_rows must be positive and E * masked_rows fit an int");
  launch_route(idx, index_i64, pairs, experts, tile_rows, raster_tiles, masked_rows, offsets,
               sorted_pair, pos_of_pair, tiles, max_tiles, num_tiles, stream);
}

void launch_linear_quant_wgmma(const void* x, Elem elem, int64_t rows, int K, int N,
                               const void* w, const QuantWeightArgs& qw, const void* bias,
                               void* out, uint8_t* codes, float* scales, Tile* tiles,
                               int* num_tiles, cudaStream_t stream) {
  if (rows <= 0 || N <= 0) return;
  if (rows > (int64_t(1) << 30)) throw Error("launch_linear_quant_wgmma: rows past 2^30");
  constexpr int kTileRows = kLinearWgmmaTileRows, kRasterTiles = 8;
  const int max_tiles = int((rows + kTileRows - 1) / kTileRows);
  linear_tiles_kernel<<<1, 256, 0, stream>>>(int(rows), kTileRows, kRasterTiles, tiles, num_tiles);
  MOEX_CUDA_CHECK_LAUNCH(linear_tiles_kernel);
  launch_quantize_act_gathered(x, elem, nullptr, 0, rows, K, nullptr, codes, scales,
                               /*scales_by_block=*/true, stream);
  GroupedGemmArgs g;
  g.kind = GemmKind::kDown;  // one weight, y rounded to elem: the down GEMM's contract
  g.elem = elem;
  g.tiles = tiles;
  g.num_tiles = num_tiles;
  g.max_tiles = max_tiles;
  g.w = w;
  g.w_expert_stride = int64_t(N) * K;
  g.ldw = K;
  g.bias = bias;
  g.K = K;
  g.N = N;
  g.out = out;
  g.out_elem = true;
  g.a_rows = rows;
  g.w_rows_total = N;
  launch_grouped_gemm_wgmma_fp8(g, qw, codes, scales, kLinearWgmmaBRows, stream);
}

// ---------------------------------------------------------------- grouped GEMMs

void launch_grouped_gemm_mma(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  // (256-row tiles are the Hopper cluster kernel's; this kernel would compute half of each.)
  if (tile_rows != 16 && tile_rows != 64 && tile_rows != 128)
    throw Error("launch_grouped_gemm_mma: tile_rows must be 16, 64 or 128, got " +
                std::to_string(tile_rows));
  if (a.elem == Elem::kBF16) launch_grouped_gemm_mma_bf16(a, tile_rows, stream);
  else launch_grouped_gemm_mma_f16(a, tile_rows, stream);
}

template <class T, GemmKind kKind, int kGroups>
void launch_simt_layout(const GroupedGemmArgs& a, cudaStream_t stream) {
  dim3 grid(unsigned(a.max_tiles), unsigned((a.N + kSimtBN - 1) / kSimtBN));
  dim3 block(16, 16);
  if (a.transposed)
    grouped_gemm_simt_kernel<T, kKind, kGroups, true><<<grid, block, 0, stream>>>(to_params(a));
  else
    grouped_gemm_simt_kernel<T, kKind, kGroups, false><<<grid, block, 0, stream>>>(to_params(a));
  MOEX_CUDA_CHECK_LAUNCH(grouped_gemm_simt_kernel);
}

void launch_grouped_gemm_simt(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  dispatch_elem(a.elem, [&](auto t) {
    using T = decltype(t);
    if (a.kind == GemmKind::kDown) launch_simt_layout<T, GemmKind::kDown, 1>(a, stream);
    else if (a.gated) launch_simt_layout<T, GemmKind::kGateUp, 2>(a, stream);
    else launch_simt_layout<T, GemmKind::kGateUp, 1>(a, stream);
  });
}

// ---------------------------------------------------------------- elementwise

void launch_combine(const void* y, bool y_elem, const int* pos_of_pair, const void* idx,
                    bool index_i64, const void* weights, Elem weights_elem, bool per_expert,
                    bool round_weights, int64_t tokens, int top_k, int experts, int hidden,
                    Elem elem, void* out, cudaStream_t stream) {
  if (tokens <= 0) return;
  // 4 columns per thread where rows of y are 16-byte aligned (the workspace base is).
  const bool vec = hidden % 4 == 0 && (reinterpret_cast<uintptr_t>(y) & 15) == 0;
  const int per_block = 256 * (vec ? 4 : 1);
  dim3 grid(unsigned(tokens), unsigned((hidden + per_block - 1) / per_block));
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    auto go = [&](auto kernel, auto yt, auto index) {
      using I = decltype(index);
      using Y = decltype(yt);
      launch_pdl_here(kernel, grid, dim3(256), 0, stream, static_cast<const Y*>(y), pos_of_pair,
                      static_cast<const I*>(idx), weights, int(weights_elem), per_expert,
                      round_weights, top_k, experts, hidden, static_cast<T*>(out));
    };
    auto rows = [&](auto yt) {
      using Y = decltype(yt);
      if (index_i64) {
        if (vec) go(combine_kernel<T, Y, int64_t, 4>, yt, int64_t{});
        else go(combine_kernel<T, Y, int64_t, 1>, yt, int64_t{});
      } else {
        if (vec) go(combine_kernel<T, Y, int32_t, 4>, yt, int32_t{});
        else go(combine_kernel<T, Y, int32_t, 1>, yt, int32_t{});
      }
    };
    if (y_elem && !std::is_same_v<T, float>) rows(T{});
    else rows(float{});
  });
  MOEX_CUDA_CHECK_LAUNCH(combine_kernel);
}

void launch_gather(const void* src, const int* sorted_pair, int top_k, int64_t rows, int cols,
                   Elem elem, void* dst, cudaStream_t stream) {
  if (rows <= 0) return;
  dim3 grid(unsigned(rows), unsigned(std::min(32, (cols + 255) / 256)));
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    gather_kernel<T><<<grid, 256, 0, stream>>>(static_cast<const T*>(src), sorted_pair, top_k,
                                               cols, static_cast<T*>(dst));
  });
  MOEX_CUDA_CHECK_LAUNCH(gather_kernel);
}

void launch_activation(const float* gu, int64_t rows, int I, bool gated, bool concatenated,
                       int act, float limit, float alpha, Elem elem, void* h,
                       cudaStream_t stream) {
  if (rows <= 0) return;
  dim3 grid(unsigned(rows), unsigned(std::min(32, (I + 255) / 256)));
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    activation_kernel<T><<<grid, 256, 0, stream>>>(gu, I, gated, concatenated,
                                                   ActParams{act, limit, alpha}, static_cast<T*>(h));
  });
  MOEX_CUDA_CHECK_LAUNCH(activation_kernel);
}

void launch_dense_linear(const void* a, int64_t m, int k, const void* w, int64_t sn, int64_t sk,
                         const void* bias, int n, Elem elem, float* c, cudaStream_t stream) {
  if (m <= 0) return;
  dim3 grid(unsigned((n + kDenseTile - 1) / kDenseTile), unsigned((m + kDenseTile - 1) / kDenseTile));
  dispatch_elem(elem, [&](auto t) {
    using T = decltype(t);
    dense_linear_kernel<T><<<grid, dim3(16, 16), 0, stream>>>(
        static_cast<const T*>(a), m, k, static_cast<const T*>(w), sn, sk,
        static_cast<const T*>(bias), n, c);
  });
  MOEX_CUDA_CHECK_LAUNCH(dense_linear_kernel);
}

}  // namespace moex::cuda
