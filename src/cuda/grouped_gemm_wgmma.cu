// Host side of the Hopper grouped GEMM: when it applies, the tensor-map encoder, the gather that
// makes gate_up's A contiguous, and the element-type dispatch.
#include <cudaTypedefs.h>

#include <algorithm>
#include <string>

#include "cuda/grouped_gemm_wgmma.cuh"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"

namespace moex::cuda {

void launch_grouped_gemm_wgmma_bf16(const GroupedGemmArgs& a, const WgmmaConfig& c,
                                    cudaStream_t stream);
void launch_grouped_gemm_wgmma_f16(const GroupedGemmArgs& a, const WgmmaConfig& c,
                                   cudaStream_t stream);

namespace {

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    MOEX_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                     cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p)
      throw DeviceError("cuTensorMapEncodeTiled is not available from the CUDA driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap encode_tensor_map_2d(const void* base, CUtensorMapDataType dtype, int64_t rows,
                                 int64_t cols, int box_rows, int box_cols) {
  CUtensorMap map;
  cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(cols) * (dtype == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2)};
  cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = tensor_map_encoder()(
      &map, dtype, 2,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw DeviceError("cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) + ") for a [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  return map;
}

void launch_grouped_gemm_wgmma(const GroupedGemmArgs& a, const WgmmaConfig& c,
                               cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  if (c.tile_rows != 64 && c.tile_rows != 128 && c.tile_rows != 256)
    throw Error("launch_grouped_gemm_wgmma: tile_rows must be 64, 128 or 256, got " +
                std::to_string(c.tile_rows));
  if (c.b_rows != 128 && c.b_rows != 256)
    throw Error("launch_grouped_gemm_wgmma: b_rows must be 128 or 256, got " +
                std::to_string(c.b_rows));
  if (c.gather_a) {
    if (a.kind != GemmKind::kGateUp || !a.gated || !a.concatenated || !a.a || !a.sorted_pair ||
        (c.tile_rows != 64 && c.tile_rows != 128) || c.b_rows != 256 || c.pingpong)
      throw Error("launch_grouped_gemm_wgmma: gathered A runs gated, concatenated gate_up from the "
                  "hidden states and sorted_pair, on cooperative 64- or 128-row tiles of 256 weight "
                  "rows");
  } else if (!a.a_sorted || a.a_rows <= 0) {
    throw Error("launch_grouped_gemm_wgmma: A must be in sorted order (a_sorted, a_rows)");
  }
  if (a.w_rows_total <= 0) throw Error("launch_grouped_gemm_wgmma: w_rows_total not set");
  if (a.elem == Elem::kBF16) launch_grouped_gemm_wgmma_bf16(a, c, stream);
  else launch_grouped_gemm_wgmma_f16(a, c, stream);
}

void launch_gather_sorted(const void* src, const int* sorted_pair, const int* valid, int top_k,
                          int64_t rows, int cols, Elem elem, void* dst, cudaStream_t stream) {
  if (rows <= 0) return;
  if ((int64_t(cols) * int64_t(elem_size(elem))) % 16 != 0)
    throw Error("launch_gather_sorted: row bytes must be a multiple of 16");
  const unsigned threads = 128;
  if (elem == Elem::kF32)
    gather_sorted_kernel<float><<<unsigned(rows), threads, 0, stream>>>(
        static_cast<const float*>(src), sorted_pair, valid, top_k, cols, static_cast<float*>(dst));
  else
    gather_sorted_kernel<__half><<<unsigned(rows), threads, 0, stream>>>(
        static_cast<const __half*>(src), sorted_pair, valid, top_k, cols, static_cast<__half*>(dst));
  MOEX_CUDA_CHECK_LAUNCH(gather_sorted_kernel);
}

}  // namespace moex::cuda
