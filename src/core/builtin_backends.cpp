#include "core/builtin_backends.hpp"

#include <algorithm>

#include "cpu/backends.hpp"
#include "moex/error.hpp"
#ifdef MOEX_WITH_CUDA
#include "cuda/backends.hpp"
#endif

namespace moex::detail {

std::vector<std::pair<std::string, std::shared_ptr<const ExpertsBackend>>> builtin_experts_backends() {
  auto both = [](std::shared_ptr<const ExpertsBackend> cpu,
                 [[maybe_unused]] std::shared_ptr<const ExpertsBackend> (*cuda)()) {
    std::vector<std::shared_ptr<const ExpertsBackend>> impls{std::move(cpu)};
#ifdef MOEX_WITH_CUDA
    impls.push_back(cuda());
#endif
    return std::make_shared<PerDeviceBackend>(std::move(impls));
  };
#ifdef MOEX_WITH_CUDA
  using namespace moex::cuda;
#else
  std::shared_ptr<const ExpertsBackend> (*make_eager_backend)() = nullptr;
  auto make_batched_mm_backend = make_eager_backend, make_grouped_mm_backend = make_eager_backend;
#endif
  return {
      {"eager", both(cpu::make_eager_backend(), make_eager_backend)},
      {"batched_mm", both(cpu::make_batched_mm_backend(), make_batched_mm_backend)},
      {"grouped_mm", both(cpu::make_grouped_mm_backend(), make_grouped_mm_backend)},
  };
}

PerDeviceBackend::PerDeviceBackend(std::vector<std::shared_ptr<const ExpertsBackend>> impls)
    : impls_(std::move(impls)) {}

const ExpertsBackend* PerDeviceBackend::impl_for(Device d) const {
  for (auto& i : impls_) {
    auto devs = i->caps().devices;
    if (std::find(devs.begin(), devs.end(), d.kind) != devs.end()) return i.get();
  }
  return nullptr;
}

BackendCaps PerDeviceBackend::caps() const {
  BackendCaps c;
  for (auto& i : impls_) {
    BackendCaps ic = i->caps();
    for (auto d : ic.devices)
      if (std::find(c.devices.begin(), c.devices.end(), d) == c.devices.end()) c.devices.push_back(d);
    for (auto t : ic.dtypes)
      if (std::find(c.dtypes.begin(), c.dtypes.end(), t) == c.dtypes.end()) c.dtypes.push_back(t);
    c.quantized_weights |= ic.quantized_weights;
    if (c.description.empty()) c.description = ic.description;
  }
  // Capturable only if every device implementation is (CPU code has no graphs to be captured in,
  // so the CUDA implementation's answer is the one that matters; see caps of each impl).
  c.graph_capturable = false;
  for (auto& i : impls_)
    if (i->caps().graph_capturable) c.graph_capturable = true;
  return c;
}

std::string PerDeviceBackend::unsupported_reason(const ExpertsSpec& spec, DType dtype,
                                                 Device device) const {
  const ExpertsBackend* i = impl_for(device);
  if (!i) return ExpertsBackend::unsupported_reason(spec, dtype, device);
  return i->unsupported_reason(spec, dtype, device);
}

std::unique_ptr<PreparedExperts> PerDeviceBackend::prepare(const ExpertsSpec& spec,
                                                           const ExpertsWeights& weights) const {
  const ExpertsBackend* i = impl_for(weights.gate_up.device());
  if (!i) throw Unsupported("no implementation for device " + weights.gate_up.device().str());
  return i->prepare(spec, weights);
}

void PerDeviceBackend::forward(const ExpertsProblem& p, Tensor& out) const {
  const ExpertsBackend* i = impl_for(p.hidden.device());
  if (!i) throw Unsupported("no implementation for device " + p.hidden.device().str());
  i->forward(p, out);
}

}  // namespace moex::detail
