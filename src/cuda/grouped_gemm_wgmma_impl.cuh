// Launcher body of the Hopper grouped GEMM, instantiated per element type in
// grouped_gemm_wgmma_{bf16,f16}.cu (and per output type and scale format for FP8 operands in
// grouped_gemm_wgmma_fp8.cu): tensor maps for A and B, and the run-time -> compile-time
// dispatch (kind, groups, tile width). Host-only encoding; no device memory is read here, so the
// launch is capturable (the maps are kernel parameters, baked into a captured graph together
// with the buffers they point to, which the workspace keeps fixed between replays).
#pragma once

#include <algorithm>
#include <atomic>
#include <string>

#include "cuda/grouped_gemm_wgmma.cuh"
#include "cuda/runtime.hpp"

namespace moex::cuda {

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda), for
// a row-major [rows, cols] tensor of bf16, f16 or bytes (UINT8: e4m3 codes).
CUtensorMap encode_tensor_map_2d(const void* base, CUtensorMapDataType dtype, int64_t rows,
                                 int64_t cols, int box_rows, int box_cols);

template <class T>
constexpr CUtensorMapDataType wgmma_tma_dtype() {
  if constexpr (WgmmaFormat<T>::kScaled) return CU_TENSOR_MAP_DATA_TYPE_UINT8;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Stages: as many as fit in ~200 KB of shared memory, and beside the staged epilogue's blocks
// (epi_bytes) in the 227 KB a block may use.
template <int kBRows, int kConsumers>
constexpr int wgmma_stages(int epi_bytes) {
  constexpr int stage = (64 * kConsumers + kBRows) * kWgmmaRowBytes;
  const int by_ring = (200 * 1024) / stage, by_total = (226 * 1024 - epi_bytes) / stage;
  return by_ring < by_total ? by_ring : by_total;
}

template <class T, GemmKind kKind, int kGroups, int kBRows, int kConsumers, bool kPingPong = false,
          int kCluster = 1, bool kGatherA = false, bool kStagedOut = false>
void launch_wgmma_instance(const GroupedGemmArgs& a, cudaStream_t stream,
                           const WgmmaScales& sc = {}) {
  using S1 = WgmmaSmem<T, kKind, kGroups, kBRows, 1, kConsumers, kPingPong, kStagedOut>;
  constexpr int STAGES = wgmma_stages<kBRows, kConsumers>(kConsumers * S1::kEpiWgBytes);
  constexpr int BN = kBRows / kGroups;
  auto kernel = grouped_gemm_wgmma_kernel<T, kKind, kGroups, kBRows, STAGES, kConsumers, kPingPong,
                                          kCluster, kGatherA, kStagedOut>;
  constexpr size_t smem =
      WgmmaSmem<T, kKind, kGroups, kBRows, STAGES, kConsumers, kPingPong, kStagedOut>::kBytes;
  static std::atomic<uint64_t> opted{0};
  const int dev = current_device();
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(opted.load() & bit)) {
    MOEX_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         int(smem)));
    opted.fetch_or(bit);
  }
  constexpr CUtensorMapDataType dt = wgmma_tma_dtype<T>();
  constexpr int BK = wgmma_bk<T>();
  const int64_t rows_per_expert = a.w_expert_stride / a.K;
  // B: one map over every expert's rows ([E * rows_per_expert, K]); a cluster's CTAs each load
  // half of the kBRows rows of a stage.
  const CUtensorMap mb =
      encode_tensor_map_2d(a.w, dt, a.w_rows_total, a.K, kCluster == 2 ? kBRows / 2 : BN, BK);
  // A: the sorted copy, in tiles (gathered A is loaded with cp.async: the kernel never reads
  // its A map).
  const CUtensorMap ma =
      kGatherA ? mb : encode_tensor_map_2d(a.a_sorted, dt, a.a_rows, a.K, 64 * kConsumers, BK);
  // Few-row tiles' A boxes (single CTAs reading A through TMA only).
  // MOEX_WGMMA_SMALL_A=0: every tile loads the whole stage (measuring).
  static const bool small_on = env_int("MOEX_WGMMA_SMALL_A", 1) != 0;
  // The kernel reads the boxes only when `on` (and single CTAs only): the maps are encoded then.
  WgmmaSmallA small_a;
  small_a.on = small_on && !kGatherA && kCluster == 1;
  for (int b = 0; b < WgmmaSmallA::kBoxes; ++b)
    small_a.box[b] = small_a.on ? encode_tensor_map_2d(a.a_sorted, dt, a.a_rows, a.K,
                                                       WgmmaSmallA::rows(b), BK)
                                : ma;
  // Persistent: one CTA per SM (the shared-memory ring allows one), never more than the items.
  const int64_t max_items = int64_t(a.max_tiles) * ((a.N + BN - 1) / BN);
  if constexpr (kCluster == 1) {
    dim3 grid(unsigned(std::min<int64_t>(max_items, device_info(current_device()).sm_count)));
    kernel<<<grid, wgmma_threads(kConsumers), smem, stream>>>(ma, mb, small_a, to_params(a),
                                                              int(rows_per_expert), sc);
  } else {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kCluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(wgmma_threads(kConsumers));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    // How many pairs fit on the device at once (GPCs with an odd number of free SMs leave one
    // out), read once per device.
    static std::atomic<int> fit[64];
    int clusters = fit[dev & 63].load();
    if (clusters <= 0) {
      cfg.gridDim = dim3(unsigned(device_info(dev).sm_count / kCluster * kCluster));
      MOEX_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg));
      if (clusters <= 0)
        throw DeviceError("grouped_gemm_wgmma: no 2-CTA cluster of this kernel fits on the device "
                          "(plan a tile of 128 rows instead)");
      fit[dev & 63].store(clusters);
    }
    cfg.gridDim = dim3(unsigned(kCluster * std::min<int64_t>(max_items, clusters)));
    MOEX_CUDA_CHECK(
        cudaLaunchKernelEx(&cfg, kernel, ma, mb, small_a, to_params(a), int(rows_per_expert), sc));
  }
  MOEX_CUDA_CHECK_LAUNCH(grouped_gemm_wgmma_kernel);
}

template <class T, GemmKind kKind, int kGroups, int kConsumers>
void launch_wgmma_width(const GroupedGemmArgs& a, const WgmmaConfig& c, cudaStream_t stream) {
  if (c.b_rows == 128) launch_wgmma_instance<T, kKind, kGroups, 128, kConsumers>(a, stream);
  else launch_wgmma_instance<T, kKind, kGroups, 256, kConsumers>(a, stream);
}

// The one run-time -> compile-time switch of the Hopper GEMM: tile rows 64 (one consumer
// warpgroup), 128 (two; cooperative or ping-pong), or 256 (a 2-CTA cluster of 128-row CTAs
// sharing the weight tiles).
template <class T, GemmKind kKind, int kGroups>
void launch_wgmma_rows(const GroupedGemmArgs& a, const WgmmaConfig& c, cudaStream_t stream) {
  if constexpr (kKind == GemmKind::kDown && !WgmmaFormat<T>::kScaled) {
    // Element-type y through the staged epilogue (the fused path's down): cooperative tiles,
    // 256 weight rows per stage.
    if (c.staged_out) {
      if (!a.out_elem)
        throw Error("grouped_gemm_wgmma: the staged down epilogue writes y in the element type");
      if (c.tile_rows == 64)
        launch_wgmma_instance<T, kKind, kGroups, 256, 1, false, 1, false, true>(a, stream);
      else launch_wgmma_instance<T, kKind, kGroups, 256, 2, false, 1, false, true>(a, stream);
      return;
    }
  }
  if constexpr (kKind == GemmKind::kGateUp && kGroups == 2) {
    // Gathered A (the fused path): cooperative tiles, 256 weight rows per stage.
    if (c.gather_a) {
      if (c.tile_rows == 64) launch_wgmma_instance<T, kKind, kGroups, 256, 1, false, 1, true>(a, stream);
      else launch_wgmma_instance<T, kKind, kGroups, 256, 2, false, 1, true>(a, stream);
      return;
    }
  }
  if (c.tile_rows == 256) launch_wgmma_instance<T, kKind, kGroups, 256, 2, false, 2>(a, stream);
  else if (c.tile_rows == 64) launch_wgmma_width<T, kKind, kGroups, 1>(a, c, stream);
  else if (c.pingpong) launch_wgmma_instance<T, kKind, kGroups, 128, 2, true>(a, stream);
  else launch_wgmma_width<T, kKind, kGroups, 2>(a, c, stream);
}

template <class T>
void launch_grouped_gemm_wgmma_typed(const GroupedGemmArgs& a, const WgmmaConfig& c,
                                     cudaStream_t stream) {
  if (a.kind == GemmKind::kDown) launch_wgmma_rows<T, GemmKind::kDown, 1>(a, c, stream);
  else if (a.gated) launch_wgmma_rows<T, GemmKind::kGateUp, 2>(a, c, stream);
  else launch_wgmma_rows<T, GemmKind::kGateUp, 1>(a, c, stream);
}

}  // namespace moex::cuda
