// `deepgemm` on CUDA: DeepGEMM's recipe on moex's own Hopper kernels. Pairs placed by expert on
// the device with no host synchronisation in DeepGEMM's M-grouped contiguous layout (each
// expert's rows in expert order, starting a new tile; its masked layout, expert e's rows at
// [e * T, e * T + count_e) of an [E, T] table, is built and tested but measured no faster, so the
// plan does not pick it: docs/cuda.md); the hidden rows gathered in that order, then one grouped
// GEMM per projection on TMA + wgmma (bf16: 64-row tiles while experts average at most 48 rows,
// else 128; FP8: 128): bf16 experts in bf16, FP8 experts in e4m3 with 1 x 128 activation blocks
// quantized on the device and 128 x 128 weight blocks, the products of each 128-wide K block
// promoted into float32 with both scales; the shared deterministic combine.
//
// Unlike grouped_mm it never takes another path: a call the Hopper kernels cannot run is refused
// with the reason (moex/backend_requirements.hpp), never run elsewhere under this name.
#include "cuda/experts_backend.hpp"

namespace moex::cuda {
namespace {

class DeepGemmCuda final : public CudaExpertsBackend {
 public:
  BackendCaps caps() const override {
    BackendCaps c = CudaExpertsBackend::caps();
    c.dtypes = {DType::kBF16};
    return c;
  }
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                 Device device) const override {
    if (device.kind != DeviceKind::kCUDA)
      return "runs on Hopper GPUs (cuda), not on " + device.str() + ": use grouped_mm";
    if (std::string why = deepgemm_unsupported(spec, dtype, describe_cuda_device(device.index));
        !why.empty())
      return why;
    return CudaExpertsBackend::unsupported_reason(spec, dtype, device);
  }

 protected:
  std::string description() const override {
    return "Hopper only (sm_90a): bf16 or FP8 (128 x 128 blocks) grouped GEMMs on TMA + wgmma, "
           "contiguous layout (masked built, not picked), requirement errors instead of fallbacks";
  }
  ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const override {
    return plan_deepgemm(shape_of(a), d);
  }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& p) const override {
    return grouped_mm_workspace_bytes(a, p);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan& p, void* ws, cudaStream_t s) const override {
    grouped_mm_experts(a, p, ws, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("deepgemm", DeepGemmCuda);

}  // namespace
}  // namespace moex::cuda
