// The execution context: where a call runs and with what, passed down the call chain.
//
// Every layer below the public API (model -> ops / experts -> kernels) takes an ExecContext
// instead of deciding on its own which device, stream or scratch memory to use. That is what
// makes a forward pass capturable in a CUDA graph and free of hidden costs:
//   - `stream`: all device work of the call is enqueued there, in order; nothing below the caller
//     synchronises it (the caller decides when to wait).
//   - `workspace`: scratch memory comes from the caller's arena, which only grows; once a call of
//     a given size has run, the same call allocates nothing (a requirement while capturing).
//   - `capturing`: the caller is recording a CUDA graph; code that would have to allocate or
//     synchronise throws instead of breaking the capture.
// An ExecContext is a small value; copying it is cheap and shares the workspace.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "moex/device.hpp"
#include "moex/tensor.hpp"

namespace moex {

// Grow-only scratch memory on one device. get(bytes) returns at least `bytes` of memory that stays
// valid until the next get() that has to grow, and every block it ever handed out stays allocated
// until the Workspace dies (a captured graph may still point into an old one). Not thread-safe:
// one Workspace per stream.
class Workspace {
 public:
  explicit Workspace(Device device) : device_(device) {}
  Device device() const { return device_; }
  // Throws DeviceError when it would have to grow while `capturing` (run the call once before
  // capture), and the allocator's errors when memory runs out.
  void* get(size_t bytes, bool capturing = false);
  size_t capacity() const { return current_ ? current_->bytes() : 0; }

 private:
  Device device_;
  std::shared_ptr<Storage> current_;
  std::vector<std::shared_ptr<Storage>> retired_;
};

struct ExecContext {
  Device device = Device::cpu();
  // CUDA: the cudaStream_t to enqueue on (as void* so that this header needs no CUDA headers).
  // The library fills a null stream in with the calling thread's current moex stream of `device`
  // before a backend sees the context, so backends always get a concrete stream.
  void* stream = nullptr;
  // Scratch memory for the call; null: each backend uses the grow-only workspace it keeps in its
  // prepared state, one per stream.
  Workspace* workspace = nullptr;
  bool capturing = false;

  // The default context of a device: the calling thread's current moex stream there, no caller
  // workspace, not capturing.
  static ExecContext on(Device d);
  // This context with a null stream replaced by the calling thread's current stream of `device`.
  ExecContext resolved() const;
};

}  // namespace moex
