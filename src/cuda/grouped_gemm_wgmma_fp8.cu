// FP8 instantiations of the Hopper grouped GEMM (see grouped_gemm_wgmma.cuh, "FP8"): e4m3
// operands with block scales, bf16 / f16 out, weight scales f32 or UE8M0. 128-row tiles, two
// cooperative consumer warpgroups, 128 or 256 weight rows per stage (the plan's b_rows).
#include <string>

#include "cuda/grouped_gemm_wgmma_impl.cuh"
#include "moex/error.hpp"

namespace moex::cuda {
namespace {

template <class Out, bool kE8M0>
void launch_fp8(const GroupedGemmArgs& a, const WgmmaScales& sc, bool wide, cudaStream_t stream) {
  using T = WgmmaFp8<Out, kE8M0>;
  if (a.kind == GemmKind::kDown) {
    if (wide) launch_wgmma_instance<T, GemmKind::kDown, 1, 256, 2>(a, stream, sc);
    else launch_wgmma_instance<T, GemmKind::kDown, 1, 128, 2>(a, stream, sc);
  } else if (wide) launch_wgmma_instance<T, GemmKind::kGateUp, 2, 256, 2>(a, stream, sc);
  else launch_wgmma_instance<T, GemmKind::kGateUp, 2, 128, 2>(a, stream, sc);
}

}  // namespace

void launch_grouped_gemm_wgmma_fp8(const GroupedGemmArgs& a, const QuantWeightArgs& w,
                                   const uint8_t* aq, const float* as_by_block, int b_rows,
                                   cudaStream_t stream) {
  if (a.max_tiles <= 0) return;
  auto fail = [](const std::string& why) {
    throw Error("launch_grouped_gemm_wgmma_fp8: " + why);
  };
  if (w.fp4 || w.block_n != kQuantBlockK) fail("FP8 weights with 128 x 128 scale blocks only");
  if (b_rows != 128 && b_rows != 256) fail("stages of 128 or 256 weight rows only");
  if (a.elem == Elem::kF32) fail("bf16 / f16 activations only");
  if (a.kind == GemmKind::kGateUp && !(a.gated && a.concatenated))
    fail("gate_up must be gated with gate and up concatenated");
  if (a.K % 16 != 0 || a.a_rows <= 0 || a.w_rows_total <= 0 || !aq || !as_by_block)
    fail("K must be a multiple of 16 and A given in sorted order (aq, as, a_rows)");
  GroupedGemmArgs g = a;
  g.a_sorted = aq;
  WgmmaScales sc;
  sc.a = as_by_block;
  sc.a_rows = a.a_rows;
  sc.b = w.scale;
  sc.b_expert_stride = w.scale_expert_stride;
  sc.kb = (a.K + kQuantBlockK - 1) / kQuantBlockK;
  sc.up_row0 = a.kind == GemmKind::kGateUp ? (a.N + kQuantBlockK - 1) / kQuantBlockK : 0;
  const bool wide = b_rows == 256;
  const bool bf = a.elem == Elem::kBF16;
  if (bf && w.scale_e8m0) launch_fp8<__nv_bfloat16, true>(g, sc, wide, stream);
  else if (bf) launch_fp8<__nv_bfloat16, false>(g, sc, wide, stream);
  else if (w.scale_e8m0) launch_fp8<__half, true>(g, sc, wide, stream);
  else launch_fp8<__half, false>(g, sc, wide, stream);
}

}  // namespace moex::cuda
