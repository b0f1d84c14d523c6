// Host side of the Hopper grouped GEMM: when it applies, the tensor-map encoder, the gather that
// makes gate_up's A contiguous, and the element-type dispatch.
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/grouped_gemm_wgmma.cuh"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"

namespace moex::cuda {

void launch_grouped_gemm_wgmma_bf16(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream);
void launch_grouped_gemm_wgmma_f16(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream);

namespace {

bool wgmma_disabled() {
  static const bool off = [] {
    const char* e = std::getenv("MOEX_CUDA_GEMM");
    return e && std::string(e) == "mma";
  }();
  return off;
}

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

CUtensorMap encode_tensor_map_2d(const void* base, bool bf16, int64_t rows, int64_t cols,
                                 int box_rows, int box_cols) {
  CUtensorMap map;
  cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = tensor_map_encoder()(
      &map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
      const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw DeviceError("cuTensorMapEncodeTiled failed (error " + std::to_string(int(r)) + ") for a [" +
                      std::to_string(rows) + ", " + std::to_string(cols) + "] tensor");
  return map;
}

bool grouped_gemm_wgmma_clusters() {
  // Off by default: on the H200 the pairs were slower than single CTAs on 8 of 10 compute-bound
  // rows (Qwen up to 23%, DeepSeek T = 16384 14%) and faster only at DeepSeek T = 4096 (2%
  // over the single-CTA kernel with setmaxnreg); docs/cuda.md, "What session 5 changed".
  static const bool on = [] {
    const char* e = std::getenv("MOEX_WGMMA_CLUSTER");
    return e && std::string(e) == "1";
  }();
  return on;
}

bool grouped_gemm_wgmma_pingpong(GemmKind kind, int K) {
  static const int forced = [] {  // -1: the policy; else bit 0: gate_up, bit 1: down
    const char* e = std::getenv("MOEX_WGMMA_PINGPONG");
    if (!e) return -1;
    const std::string s = e;
    return s == "both" ? 3 : s == "gate_up" ? 1 : s == "down" ? 2 : 0;
  }();
  if (forced >= 0) return (forced >> (kind == GemmKind::kDown ? 1 : 0)) & 1;
  // Measured on the H200 (docs/cuda.md, "What session 5 changed"): with K = 1408 / 2048
  // (Qwen1.5-MoE, DeepSeek-V3) an item of the down GEMM is 22-32 k steps and its fp32 epilogue
  // a large share of it, which ping-pong takes off the critical path (DeepSeek T = 4096 -5.6%,
  // Qwen T = 4096 -2.6%); with K = 14336 (Mixtral) the epilogue is a small share and the narrower
  // 128-column tiles cost more (T = 16384 +1-4%). gate_up is slower with ping-pong on all three.
  return kind == GemmKind::kDown && K <= 2048;
}

int grouped_gemm_raster_tiles(int tile_rows) {
  static const int rows = [] {
    const char* e = std::getenv("MOEX_WGMMA_RASTER");
    const int r = e ? std::atoi(e) : 0;
    return 128 * (r > 0 ? r : kWgmmaRasterTiles);
  }();
  return std::max(1, rows / std::max(1, tile_rows));
}

bool grouped_gemm_wgmma_supported(const GroupedGemmArgs& a) {
  if (wgmma_disabled()) return false;
  if (a.elem == Elem::kF32 || a.transposed) return false;
  if (a.kind == GemmKind::kGateUp && a.gated && !a.concatenated) return false;
  if (a.K % 8 != 0 || a.K <= 0 || a.N <= 0) return false;
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  if (!aligned(a.w) || (a.w_expert_stride * 2) % 16 != 0) return false;
  if (device_count() == 0) return false;
  const DeviceInfo& d = device_info(current_device());
  return d.major == 9 && d.minor == 0;
}

void launch_grouped_gemm_wgmma(const GroupedGemmArgs& a, int tile_rows, cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  if (tile_rows != 64 && tile_rows != 128 && tile_rows != 256)
    throw Error("launch_grouped_gemm_wgmma: tile_rows must be 64, 128 or 256, got " +
                std::to_string(tile_rows));
  if (!a.a_sorted || a.a_rows <= 0 || a.w_rows_total <= 0)
    throw Error("launch_grouped_gemm_wgmma: A must be in sorted order (a_sorted, a_rows) and "
                "w_rows_total set");
  if (a.elem == Elem::kBF16) launch_grouped_gemm_wgmma_bf16(a, tile_rows, stream);
  else launch_grouped_gemm_wgmma_f16(a, tile_rows, stream);
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
