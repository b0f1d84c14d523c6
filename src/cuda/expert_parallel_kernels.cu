// mark_sentinels of router ids held on a GPU (declared in core/device_hooks.hpp): the one piece
// of expert-parallel index math the replicated mode needs per MoE layer, kept on the device so
// that a decode step with expert parallelism stays one captured graph.
#include <algorithm>
#include <cstdint>

#include "core/device_hooks.hpp"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"

namespace moex::detail {
namespace {

template <class Id>
__global__ void mark_sentinels_kernel(const Id* __restrict__ in, Id* __restrict__ out, int64_t n, int64_t first,
                                      int64_t count) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t id = int64_t(in[i]);
    out[i] = Id(id >= first && id < first + count ? id - first : count);
  }
}

}  // namespace

void mark_sentinels_on_device(const Tensor& in, Tensor& out, int64_t first, int64_t count) {
  if (!in.device().is_cuda() || out.device() != in.device() || in.dtype() != out.dtype() ||
      in.shape() != out.shape() || !in.is_contiguous() || !out.is_contiguous())
    throw InvalidInput("mark_sentinels_on_device: contiguous ids of one dtype and shape on one CUDA device, got " +
                       in.str() + " and " + out.str());
  const int64_t n = in.numel();
  if (n == 0) return;
  cuda::DeviceGuard g(in.device().index);
  const int threads = 256;
  const int blocks = int(std::min<int64_t>((n + threads - 1) / threads, 1024));
  cudaStream_t s = cuda::current_stream();
  if (in.dtype() == DType::kI64)
    mark_sentinels_kernel<<<blocks, threads, 0, s>>>(static_cast<const int64_t*>(in.raw()),
                                                     static_cast<int64_t*>(out.raw()), n, first, count);
  else if (in.dtype() == DType::kI32)
    mark_sentinels_kernel<<<blocks, threads, 0, s>>>(static_cast<const int32_t*>(in.raw()),
                                                     static_cast<int32_t*>(out.raw()), n, first, count);
  else
    throw InvalidInput("mark_sentinels_on_device: int32 or int64 ids, got " + in.str());
  MOEX_CUDA_CHECK(cudaPeekAtLastError());
}

}  // namespace moex::detail
