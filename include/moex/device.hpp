// Where a tensor lives. CPU now; CUDA devices are addressed by index. kFakeGpu exists for tests of
// device-dependent policy (the decode-stage switch) on machines without a GPU: it stores data on
// the host and is treated as a GPU by policy code only.
#pragma once

#include <string>

namespace moex {

enum class DeviceKind : unsigned char { kCPU, kCUDA, kFakeGpu };

struct Device {
  DeviceKind kind = DeviceKind::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::kCPU, 0}; }
  static Device cuda(int i = 0) { return {DeviceKind::kCUDA, i}; }
  static Device fake_gpu() { return {DeviceKind::kFakeGpu, 0}; }

  bool is_cpu() const { return kind == DeviceKind::kCPU; }
  bool is_cuda() const { return kind == DeviceKind::kCUDA; }
  // True for devices the decode-stage policy treats as GPUs (real CUDA and the test fake).
  bool is_gpu_like() const { return kind != DeviceKind::kCPU; }
  // Data of this device is directly addressable by host code (CPU and the fake GPU).
  bool host_accessible() const { return kind != DeviceKind::kCUDA; }

  bool operator==(const Device&) const = default;
  std::string str() const;
};

// "cpu", "cuda", "cuda:1". Throws InvalidInput.
Device parse_device(const std::string& s);

}  // namespace moex
