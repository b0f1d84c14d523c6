// `eager` on CUDA: route by expert, then a host loop over the experts that received tokens
// (gather, dense gate_up, activation, dense down), then the shared combine. The readable reference
// path; it reads the per-expert offsets back, so it synchronises and is not graph-capturable.
#include "cuda/experts_backend.hpp"

namespace moex::cuda {
namespace {

class EagerCuda final : public CudaExpertsBackend {
 protected:
  std::string description() const override {
    return "per-expert loop with fp32 CUDA-core products (synchronises)";
  }
  bool capturable() const override { return false; }
  ExpertsPlan plan(const ExpertsArgs&, const DeviceTraits&) const override { return {}; }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan&) const override {
    return eager_workspace_bytes(a);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan&, void* ws, cudaStream_t s) const override {
    eager_experts(a, ws, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("eager", EagerCuda);

}  // namespace
}  // namespace moex::cuda
