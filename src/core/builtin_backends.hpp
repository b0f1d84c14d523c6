// The one table of built-in experts backends, and the per-device composition under one name.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moex/experts.hpp"

namespace moex::detail {

// name -> backend. Adding a built-in backend: its own files + one line in builtin_backends.cpp.
std::vector<std::pair<std::string, std::shared_ptr<const ExpertsBackend>>> builtin_experts_backends();

// One registered name served by per-device implementations (e.g. the CPU and the CUDA grouped_mm):
// prepare() goes by the weights' device, forward() by the inputs' device (validated equal).
class PerDeviceBackend final : public ExpertsBackend {
 public:
  explicit PerDeviceBackend(std::vector<std::shared_ptr<const ExpertsBackend>> impls);
  BackendCaps caps() const override;
  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype, Device device) const override;
  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override;
  void forward(const ExpertsProblem& problem, Tensor& out) const override;
  // Per-device capabilities, for `moex backends`.
  const std::vector<std::shared_ptr<const ExpertsBackend>>& impls() const { return impls_; }

 private:
  const ExpertsBackend* impl_for(Device d) const;  // null when no implementation
  std::vector<std::shared_ptr<const ExpertsBackend>> impls_;
};

}  // namespace moex::detail
