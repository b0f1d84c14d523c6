#include "moex/device.hpp"

#include "core/device_hooks.hpp"
#include "moex/error.hpp"

namespace moex {

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::kCPU: return "cpu";
    case DeviceKind::kCUDA: return "cuda:" + std::to_string(index);
  }
  return "?";
}

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string n = s.substr(5);
    if (!n.empty() && n.size() < 4 && n.find_first_not_of("0123456789") == std::string::npos)
      return Device::cuda(std::stoi(n));
  }
  throw InvalidInput("unknown device '" + s + "'; valid: cpu, cuda, cuda:N");
}

void require_device(const Device& d) {
  if (!d.is_cuda()) return;
  const int n = detail::cuda_device_count();
  if (d.index >= n)
    throw Unsupported("no CUDA device " + d.str() + " (" + std::to_string(n) +
                      " visible; a build without CUDA sees none); use --device cpu");
}

}  // namespace moex
