// grouped_mm on one caller-chosen CPU kernel path (moex/cpu_kernels.hpp): the engine's prepare and
// run with the path passed down explicitly, for benchmarks and tests that compare paths on one
// machine. The default grouped_mm (grouped_mm.cpp) runs the path plan_kernels picks.
#include <memory>
#include <string>

#include "cpu/engine.hpp"
#include "moex/cpu_kernels.hpp"
#include "moex/error.hpp"

namespace moex::cpu {
namespace {

class GroupedMmOnPath final : public ExpertsBackend {
 public:
  explicit GroupedMmOnPath(KernelPath path) : path_(path) {}

  BackendCaps caps() const override {
    BackendCaps c;
    c.devices = {DeviceKind::kCPU};
    c.dtypes = {DType::kF32, DType::kBF16};
    c.reads_per_expert = true;  // prepare_cpu_experts packs either form
    c.description = "grouped_mm on the CPU kernel path " + std::string(kernel_path_name(path_));
    return c;
  }

  std::string unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                 Device device) const override {
    if (std::string why = ExpertsBackend::unsupported_reason(spec, dtype, device); !why.empty())
      return why;
    if (!kernel_path_supported(path_))
      return "needs the CPU kernel path " + std::string(kernel_path_name(path_)) +
             ", which this CPU cannot run (it runs " +
             std::string(kernel_path_name(best_kernel_path())) + " and below)";
    return cpu_engine_unsupported_reason(spec, dtype, dtype);
  }

  std::unique_ptr<PreparedExperts> prepare(const ExpertsSpec& spec,
                                           const ExpertsWeights& weights) const override {
    return prepare_cpu_experts(spec, weights, path_);
  }

  void forward(const ExpertsProblem& p, Tensor& out, const ExecContext&) const override {
    const auto* packed = dynamic_cast<const PreparedCpuExperts*>(p.prepared);
    if (packed == nullptr)
      throw Unsupported("grouped_mm on a forced CPU kernel path runs only on experts it prepared");
    run_cpu_experts(*packed, p, out);
  }

 private:
  KernelPath path_;
};

}  // namespace
}  // namespace moex::cpu

namespace moex {

std::shared_ptr<const ExpertsBackend> make_cpu_grouped_mm_backend(CpuKernelPath path) {
  return std::make_shared<cpu::GroupedMmOnPath>(path);
}

}  // namespace moex
