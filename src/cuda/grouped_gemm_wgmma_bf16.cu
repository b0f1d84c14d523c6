// bf16 instantiations of the Hopper grouped GEMM (see grouped_gemm_wgmma_impl.cuh).
#include "cuda/grouped_gemm_wgmma_impl.cuh"

namespace moex::cuda {
void launch_grouped_gemm_wgmma_bf16(const GroupedGemmArgs& a, const WgmmaConfig& c,
                                    cudaStream_t stream) {
  launch_grouped_gemm_wgmma_typed<__nv_bfloat16>(a, c, stream);
}
}  // namespace moex::cuda
