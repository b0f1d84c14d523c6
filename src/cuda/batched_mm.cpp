// `batched_mm` on CUDA: every (token, slot) pair is its own 16-row tile whose expert rows are
// streamed straight from the weight tensor (nothing is copied); best for very few tokens.
#include "cuda/experts_backend.hpp"

namespace moex::cuda {
namespace {

class BatchedMmCuda final : public CudaExpertsBackend {
 protected:
  std::string description() const override {
    return "streams each (token, slot)'s expert rows (mma.sync for bf16/f16)";
  }
  ExpertsPlan plan(const ExpertsArgs& a, const DeviceTraits& d) const override {
    return plan_batched_mm(shape_of(a), d);
  }
  size_t workspace_bytes(const ExpertsArgs& a, const ExpertsPlan& p) const override {
    return batched_mm_workspace_bytes(a, p);
  }
  void run(const ExpertsArgs& a, const ExpertsPlan& p, void* ws, cudaStream_t s) const override {
    batched_mm_experts(a, p, ws, s);
  }
};

MOEX_REGISTER_EXPERTS_BACKEND("batched_mm", BatchedMmCuda);

}  // namespace
}  // namespace moex::cuda
