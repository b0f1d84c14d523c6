// Workspace: grow-only scratch memory (see moex/context.hpp).
#include "moex/context.hpp"

#include <algorithm>

#include "core/device_hooks.hpp"
#include "moex/error.hpp"

namespace moex {

void* Workspace::get(size_t bytes, bool capturing) {
  if (current_ && current_->bytes() >= bytes) return current_->data();
  if (capturing)
    throw DeviceError("workspace on " + device_.str() + " would have to grow from " +
                      std::to_string(capacity()) + " to " + std::to_string(bytes) +
                      " bytes during graph capture; run the same call once before capturing");
  // Grow geometrically so that a sequence of growing calls allocates O(log n) times; keep the
  // old block alive (a captured graph may still read it).
  size_t want = std::max(bytes, capacity() + capacity() / 2);
  auto next = device_.host_accessible() ? Storage::host(want, false, device_)
                                        : detail::device_alloc(want, device_);
  if (current_) retired_.push_back(std::move(current_));
  current_ = std::move(next);
  return current_->data();
}

ExecContext ExecContext::on(Device d) {
  ExecContext c;
  c.device = d;
  return c.resolved();
}

ExecContext ExecContext::resolved() const {
  ExecContext c = *this;
  if (!c.stream && c.device.is_cuda()) c.stream = detail::current_stream(c.device);
  return c;
}

}  // namespace moex
