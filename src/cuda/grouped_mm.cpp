// `grouped_mm` on CUDA: tokens sorted by expert on the device, one grouped GEMM per projection
// (gather fused in the A loads or, on Hopper, one gather pass then TMA + wgmma tiles; activation
// fused in the gate_up epilogue), then the shared combine. The plan (tile rows, kernel path,
// ping-pong) is plan_grouped_mm of the shape and device.
#include "cuda/experts_backend.hpp"

namespace moex::cuda {
namespace {

class GroupedMmCuda final : public CudaExpertsBackend {
 protected:
  std::string description() const override {
    return "grouped GEMM over tokens sorted by expert on the device (mma.sync / Hopper wgmma)";
  }
  ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const override {
    return plan_grouped_mm(shape_of(a), d);
  }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& p) const override {
    return grouped_mm_workspace_bytes(a, p);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan& p, void* ws, cudaStream_t s) const override {
    grouped_mm_experts(a, p, ws, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("grouped_mm", GroupedMmCuda);

}  // namespace
}  // namespace moex::cuda
