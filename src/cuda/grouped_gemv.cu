// Launcher of the grouped GEMV (grouped_gemv.cuh): the run-time -> compile-time dispatch on the
// element type, the GEMM kind and gating.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/grouped_gemv.cuh"
#include "cuda/launchers.hpp"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"

namespace moex::cuda {

namespace {

template <class T, GemmKind kKind, int kGroups, bool kEarly = false>
void launch_gemv(const GroupedGemmArgs& a, cudaStream_t stream) {
  const int64_t col_blocks = (int64_t(a.N) + kGemvColumns - 1) / kGemvColumns;
  if (col_blocks > 65535) throw Unsupported("grouped GEMV: " + std::to_string(a.N) + " output columns");
  dim3 grid(unsigned(a.max_tiles), unsigned(col_blocks));
  launch_pdl(grouped_gemv_kernel<T, kKind, kGroups, kEarly>, grid, dim3(kGemvWarps * 32), 0, stream, current_device(),
             to_params(a));
}

template <class T>
void launch_gemv_typed(const GroupedGemmArgs& a, cudaStream_t stream) {
  // down loads its first weights before waiting for gate_up (grouped_gemv.cuh). H200, batch-1
  // decode of a 24-layer Qwen1.5-MoE-shaped model (docs/gpu_model.md): 531 / 532 -> 534 / 535
  // tokens/s. MOEX_GROUPED_GEMV_EARLY=0 (measuring only) waits first.
  static const bool early = env_int("MOEX_GROUPED_GEMV_EARLY", 1) != 0;
  if (a.kind == GemmKind::kDown && early) launch_gemv<T, GemmKind::kDown, 1, true>(a, stream);
  else if (a.kind == GemmKind::kDown) launch_gemv<T, GemmKind::kDown, 1, false>(a, stream);
  else if (a.gated) launch_gemv<T, GemmKind::kGateUp, 2>(a, stream);
  else launch_gemv<T, GemmKind::kGateUp, 1>(a, stream);
}

}  // namespace

void launch_grouped_gemv(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.max_tiles <= 0 || a.N <= 0) return;
  if (a.transposed || a.K % 8 != 0 || a.elem == Elem::kF32)
    throw Error("launch_grouped_gemv: needs bf16 / f16 row-major weights with K a multiple of 8");
  if (a.elem == Elem::kBF16) launch_gemv_typed<__nv_bfloat16>(a, stream);
  else launch_gemv_typed<__half>(a, stream);
}

}  // namespace moex::cuda
