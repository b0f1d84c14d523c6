// `deepgemm_megamoe`: the name transformers gives DeepGEMM's Blackwell kernel that fuses
// expert-parallel dispatch, both projections, SwiGLU and the combine over FP4 experts. moex has
// no build of such a kernel (it targets Hopper; its expert-parallel path is separate), so this
// backend validates the call and refuses it, naming the first unmet requirement
// (moex/backend_requirements.hpp) and what to use instead: the name is known, never a silent
// fallback to another backend.
#include "cuda/experts_backend.hpp"
#include "moex/error.hpp"

namespace moex::cuda {
namespace {

class DeepGemmMegaMoe final : public ExpertsBackend {
 public:
  BackendCaps caps() const override {
    BackendCaps c;
    c.devices = {DeviceKind::kCUDA};
    c.dtypes = {DType::kBF16};
    c.quantized_weights = true;
    c.description =
        "CUDA, Blackwell (CC >= 10.0), FP4 experts + an expert-parallel group: fused dispatch, "
        "MLP and combine; not built in moex (checks the requirements and says so)";
    return c;
  }
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                 Device device) const override {
    if (device.kind != DeviceKind::kCUDA)
      return "runs on Blackwell GPUs (cuda), not on " + device.str() + ": use grouped_mm";
    // A call through the experts interface carries no expert-parallel group.
    return deepgemm_megamoe_unsupported(spec, dtype, describe_cuda_device(device.index), 1);
  }
  void forward(const ExpertsProblem& p, Tensor&, const ExecContext&) const override {
    throw Unsupported("experts backend 'deepgemm_megamoe' " +
                      unsupported_reason(*p.spec, p.hidden.dtype(), p.hidden.device()));
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("deepgemm_megamoe", DeepGemmMegaMoe);

}  // namespace
}  // namespace moex::cuda
