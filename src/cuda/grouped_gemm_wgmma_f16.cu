// f16 instantiations of the Hopper grouped GEMM (see grouped_gemm_wgmma_impl.cuh).
#include "cuda/grouped_gemm_wgmma_impl.cuh"

namespace moex::cuda {
void launch_grouped_gemm_wgmma_f16(const GroupedGemmArgs& a, const WgmmaConfig& c,
                                   cudaStream_t stream) {
  launch_grouped_gemm_wgmma_typed<__half>(a, c, stream);
}
}  // namespace moex::cuda
