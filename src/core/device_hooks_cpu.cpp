// Device hooks of a CPU-only build (see device_hooks.hpp).
#ifndef MOEX_WITH_CUDA
#include "core/device_hooks.hpp"

#include "moex/error.hpp"

namespace moex::detail {

std::shared_ptr<Storage> device_alloc(size_t, Device device) {
  throw Unsupported("device " + device.str() +
                    " requested, but this moex was built without CUDA (configure with -DMOEX_CUDA=ON)");
}
void device_copy(void*, Device dst, const void*, Device src, size_t) {
  throw Unsupported("copy " + src.str() + " -> " + dst.str() +
                    " requested, but this moex was built without CUDA");
}
int cuda_device_count() { return 0; }
size_t device_free_bytes(Device) { return 0; }
std::unique_ptr<CapturedGraph> capture_graph(Device device, const std::function<void()>&,
                                             const std::function<void()>&) {
  throw Unsupported("graph capture on " + device.str() + " requested, but this moex was built without CUDA");
}
std::unique_ptr<AsyncDownload> make_async_download(Device device, size_t, int) {
  throw Unsupported("an asynchronous download from " + device.str() +
                    " was requested, but this moex was built without CUDA");
}
void* current_stream(Device device) {
  throw Unsupported("a stream of " + device.str() +
                    " was requested, but this moex was built without CUDA");
}

std::unique_ptr<StreamBranch> open_stream_branch(Device device) {
  throw Unsupported("a stream branch on " + device.str() + " was requested, but this moex was built without CUDA");
}

int64_t stream_branches_opened() { return 0; }

bool capturing(Device) { return false; }
void gather_rows_on_device(const Tensor& src, const Tensor&, Tensor&) {
  throw Unsupported("a row gather of " + src.str() + " was requested, but this moex was built without CUDA");
}
void sum_rows_on_device(const Tensor& rows, const Tensor&, int64_t, Tensor&) {
  throw Unsupported("a row sum of " + rows.str() + " was requested, but this moex was built without CUDA");
}
void mark_sentinels_on_device(const Tensor& in, Tensor&, int64_t, int64_t) {
  throw Unsupported("sentinel marking of " + in.str() + " was requested, but this moex was built without CUDA");
}
std::string device_name(Device device) {
  if (device.is_cpu()) return "cpu";
  throw Unsupported("device " + device.str() + " requested, but this moex was built without CUDA");
}

}  // namespace moex::detail
#endif
