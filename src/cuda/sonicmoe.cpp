// `sonicmoe` on CUDA: the fused forward of gated bf16 / f16 experts on Hopper, in the manner of
// SonicMoE. Pairs sorted by expert on the device; gate_up on TMA + wgmma with its A rows read in
// place from the hidden states (cp.async gathers each tile's rows into the wgmma stages: no
// gathered [P, H] copy is written or read), the gated activation in its epilogue; down writing
// each pair's row in the element type (no fp32 [P, H] buffer); the combine gathering and summing
// each token's rows in slot order (deterministic, no atomics), the routing weights in the hidden
// dtype as transformers passes them to its sonicmoe kernel.
//
// Like deepgemm it never takes another path: a call the fused kernels cannot run is refused with
// the reason (moex/backend_requirements.hpp), never run elsewhere under this name.
#include "cuda/experts_backend.hpp"

namespace moex::cuda {
namespace {

class SonicMoeCuda final : public CudaExpertsBackend {
 public:
  BackendCaps caps() const override {
    BackendCaps c = CudaExpertsBackend::caps();
    c.dtypes = {DType::kBF16, DType::kF16};
    c.quantized_weights = false;
    return c;
  }
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                 Device device) const override {
    if (device.kind != DeviceKind::kCUDA)
      return "runs on Hopper GPUs (cuda), not on " + device.str() + ": use grouped_mm";
    if (std::string why = sonicmoe_unsupported(spec, dtype, describe_cuda_device(device.index));
        !why.empty())
      return why;
    return CudaExpertsBackend::unsupported_reason(spec, dtype, device);
  }

 protected:
  std::string description() const override {
    return "Hopper only (sm_90a): fused gated bf16 / f16 experts (gather inside the gate_up loads, "
           "activation in its epilogue, down, per-token gather-and-sum), requirement errors instead "
           "of fallbacks";
  }
  ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const override {
    return plan_sonicmoe(shape_of(a), d);
  }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& p) const override {
    return sonicmoe_workspace_bytes(a, p);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan& p, void* ws, cudaStream_t s) const override {
    sonicmoe_experts(a, p, ws, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("sonicmoe", SonicMoeCuda);

}  // namespace
}  // namespace moex::cuda
