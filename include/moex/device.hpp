// Where a tensor lives: the host, or a CUDA device addressed by index.
#pragma once

#include <string>

namespace moex {

enum class DeviceKind : unsigned char { kCPU, kCUDA };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::kCUDA, i}; }

  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  // Data of this device is directly addressable by host code.
  bool host_accessible() const { return kind == DeviceKind::kCPU; }

  bool operator==(const Device&) const = default;
  std::string str() const;
};

// "cpu", "cuda", "cuda:1". Throws InvalidInput.
Device parse_device(const std::string& s);

// Throws Unsupported naming the device when `d` is a CUDA device this process cannot see (no
// GPU, no driver, an index past the last, or a build without CUDA): the one message every
// command gives before it touches the device.
void require_device(const Device& d);

}  // namespace moex
