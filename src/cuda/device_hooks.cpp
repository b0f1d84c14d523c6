// Device hooks of a CUDA build (declared in core/device_hooks.hpp): forward to the CUDA runtime
// layer (src/cuda/runtime.hpp). Only CUDA builds compile this folder.
#include "core/device_hooks.hpp"
#include "cuda/runtime.hpp"

namespace moex::detail {

std::shared_ptr<Storage> device_alloc(size_t bytes, Device device) {
  return moex::cuda::alloc_storage(bytes, device.index);
}
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  moex::cuda::copy_bytes(dst, dst_dev, src, src_dev, bytes);
}
int cuda_device_count() { return moex::cuda::device_count(); }
size_t device_free_bytes(Device device) {
  moex::cuda::DeviceGuard guard(device.index);
  moex::cuda::empty_cache();
  size_t free = 0, total = 0;
  MOEX_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}
void* current_stream(Device device) {
  moex::cuda::DeviceGuard guard(device.index);
  return moex::cuda::current_stream();
}

}  // namespace moex::detail
