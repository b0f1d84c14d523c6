// The step's device mirror (ops.hpp): {past, pad[batch], position[rows], id[rows]} as int32,
// built on the host and uploaded with one copy on the current stream.
//
// Why one int32 vector: every per-step fact a CUDA op needs (cache column, padding, rope position,
// token id) then lives at a fixed device address whose contents change between decode steps while
// the launches do not, which is what lets a step be captured once and replayed. int32 halves the
// bytes and is what the kernels index with; values beyond it are rejected here, at the boundary.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

namespace {

int32_t checked_i32(int64_t v, const char* what) {
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
    throw InvalidInput(std::string("make_device_step: ") + what + " " + std::to_string(v) +
                       " does not fit the device step's int32");
  return int32_t(v);
}

}  // namespace

void make_device_step(Step& step, Device device) {
  const int64_t B = step.batch, rows = step.rows();
  if (B < 0 || step.tokens < 0) throw InvalidInput("make_device_step: negative batch or token count");
  if (!step.pad.empty() && int64_t(step.pad.size()) != B)
    throw InvalidInput("make_device_step: " + std::to_string(step.pad.size()) + " pads for batch " +
                       std::to_string(B));
  if (!step.ids.empty() && int64_t(step.ids.size()) != rows)
    throw InvalidInput("make_device_step: " + std::to_string(step.ids.size()) + " ids for " +
                       std::to_string(rows) + " rows");

  std::vector<int32_t> host(size_t(1 + B + 2 * rows));
  host[0] = checked_i32(step.past, "past");
  checked_i32(step.past + step.tokens, "last cache column");
  for (int64_t b = 0; b < B; ++b) host[size_t(1 + b)] = checked_i32(step.pad_of(b), "pad");
  const int64_t pos0 = device_step_position_offset(step), id0 = device_step_id_offset(step);
  for (int64_t r = 0; r < rows; ++r) {
    host[size_t(pos0 + r)] = checked_i32(step.position(r), "position");
    // Steps that never reach embedding() (tests of single ops) carry no ids: zeros.
    host[size_t(id0 + r)] = step.ids.empty() ? 0 : checked_i32(step.ids[size_t(r)], "token id");
  }

  moex::cuda::DeviceGuard guard(device.index);
  // A step that already has a mirror of this size on this device is updated in place: a captured
  // decode step keeps reading the same address at every replay.
  Tensor t = step.device.defined() && step.device.device() == device && step.device.numel() == int64_t(host.size())
                 ? step.device
                 : Tensor::empty({int64_t(host.size())}, DType::kI32, device);
  // From pageable memory the runtime stages the bytes before returning, so `host` may go out of
  // scope right after the call; the kernels that read the mirror are queued behind it.
  MOEX_CUDA_CHECK(cudaMemcpyAsync(t.raw(), host.data(), host.size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, moex::cuda::current_stream()));
  step.device = std::move(t);
}

}  // namespace moex::ops::cuda
