// The device KV cache (ops.hpp): k [batch, capacity, k_dim] and v [batch, capacity, v_dim] in k's
// dtype on k's device (v undefined for layers whose values are part of the keys).
//
// The append kernel reads `past` from the device step instead of taking it as an argument, so a
// decode step's launch is the same at every length (a captured graph replays it). Growing past the
// capacity reallocates and copies what is cached on the device (cudaMemcpy2DAsync, one row of
// filled * dim elements per sequence); that path allocates and is meant to run outside capture
// (a graph-captured decode preallocates the capacity with KVCache's capacity hint).
#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common.cuh"
#include "cuda/pdl.cuh"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

namespace {

// cache[b, past + t, :] = x[b * T + t, :], 16 bytes per thread and step when both sides allow it
// (same dtype, dim * size a multiple of 16), else element by element with conversion. One launch
// appends keys and values (blockIdx.y picks the job): a decode step appends per layer, and the
// second launch cost as much as the copy itself. Blocks stride over rows and threads over a row's
// chunks, so the (sequence, token) of a row is divided out once per row: with a flat index four
// int64 divisions per 16-byte chunk held a 4096-token prompt's append to 0.4 TB/s on the H200.
struct CopyJob {
  const void* src;
  void* dst;
  int src_code, dst_code;
  int64_t dim;
  bool vec;
};

__global__ void kv_copy_rows_kernel(const CopyJob j0, const CopyJob j1, const int32_t* step, int64_t rows,
                                    int tokens, int64_t capacity, int elem_bytes) {
  moex::cuda::pdl_enter();
  const CopyJob& j = blockIdx.y == 0 ? j0 : j1;
  const int64_t past = step[0], dim = j.dim;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / tokens, t = r % tokens, dst_row = b * capacity + past + t;
    if (j.vec) {
      const int64_t chunks = dim * elem_bytes / 16;
      const uint4* s = reinterpret_cast<const uint4*>(static_cast<const char*>(j.src) + r * dim * elem_bytes);
      uint4* d = reinterpret_cast<uint4*>(static_cast<char*>(j.dst) + dst_row * dim * elem_bytes);
      for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) d[c] = s[c];
      continue;
    }
    for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) {
      const float x = moex::cuda::load_float(j.src, j.src_code, r * dim + e);
      const int64_t o = dst_row * dim + e;
      if (j.dst_code == moex::cuda::kCodeF16) static_cast<__half*>(j.dst)[o] = __float2half_rn(x);
      else if (j.dst_code == moex::cuda::kCodeBF16) static_cast<__nv_bfloat16*>(j.dst)[o] = __float2bfloat16_rn(x);
      else static_cast<float*>(j.dst)[o] = x;
    }
  }
}

int code_of(DType t) {
  switch (t) {
    case DType::kF32: return moex::cuda::kCodeF32;
    case DType::kF16: return moex::cuda::kCodeF16;
    case DType::kBF16: return moex::cuda::kCodeBF16;
    default: throw Unsupported("kv_append on CUDA: dtype " + std::string(dtype_name(t)));
  }
}

// A [batch, capacity, dim] tensor holding the first `filled` columns of `old` (if any).
Tensor regrow(const Tensor& old, DType dtype, Device dev, int64_t batch, int64_t capacity, int64_t dim,
              int64_t filled, cudaStream_t stream) {
  Tensor t = Tensor::empty({batch, capacity, dim}, dtype, dev);
  if (old.defined() && filled > 0 && batch > 0 && dim > 0) {
    const size_t es = dtype_size(dtype);
    MOEX_CUDA_CHECK(cudaMemcpy2DAsync(t.raw(), size_t(capacity * dim) * es, old.raw(), size_t(old.size(1) * dim) * es,
                                      size_t(filled * dim) * es, size_t(batch), cudaMemcpyDeviceToDevice, stream));
  }
  return t;
}

CopyJob job_of(Tensor& cache, const Tensor& x) {
  const int elem_bytes = int(dtype_size(cache.dtype()));
  const int64_t dim = cache.size(2);
  const bool vec = x.dtype() == cache.dtype() && (dim * elem_bytes) % 16 == 0 &&
                   (reinterpret_cast<uintptr_t>(x.raw()) & 15) == 0 && (reinterpret_cast<uintptr_t>(cache.raw()) & 15) == 0;
  return CopyJob{x.raw(), cache.raw(), code_of(x.dtype()), code_of(cache.dtype()), dim, vec};
}

// Appends x to cache and, when given, x2 to cache2 (same rows, capacity and dtype), in one launch.
void copy_rows(Tensor& cache, const Tensor& x, Tensor* cache2, const Tensor* x2, const Step& step,
               cudaStream_t stream) {
  const int64_t rows = step.rows();
  if (rows == 0) return;
  const int elem_bytes = int(dtype_size(cache.dtype()));
  const CopyJob j0 = job_of(cache, x), j1 = cache2 ? job_of(*cache2, *x2) : j0;
  if (std::max(j0.dim, j1.dim) == 0) return;
  const int64_t blocks = std::min<int64_t>(rows, 65535);  // a block per row (strided beyond)
  const dim3 grid(unsigned(blocks), cache2 ? 2u : 1u);
  moex::cuda::launch_pdl_here(kv_copy_rows_kernel, grid, dim3(256), 0, stream, j0, j1, step.device.data<int32_t>(), rows, int(step.tokens),
                                                cache.size(1), elem_bytes);
  MOEX_CUDA_CHECK_LAUNCH(kv_copy_rows_kernel);
}

}  // namespace

void kv_reserve(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step) {
  const Device dev = k.device();
  moex::cuda::DeviceGuard guard(dev.index);
  const int64_t need = kv.filled + step.tokens;
  if (!kv.k.defined() || need > kv.capacity()) {
    // First use: what the caller planned for; later: double, so that appends stay amortised O(1).
    cudaStream_t stream = moex::cuda::current_stream();
    const int64_t cap = kv.k.defined() ? std::max(need, 2 * kv.capacity()) : std::max(need, kv.capacity_hint);
    const DType dtype = kv.k.defined() ? kv.k.dtype() : k.dtype();
    kv.k = regrow(kv.k, dtype, dev, step.batch, cap, k.size(1), kv.filled, stream);
    if (v.defined()) kv.v = regrow(kv.v, dtype, dev, step.batch, cap, v.size(1), kv.filled, stream);
  }
}

void kv_append(LayerKV& kv, const Tensor& k, const Tensor& v, const Step& step) {
  const Device dev = k.device();
  moex::cuda::DeviceGuard guard(dev.index);
  cudaStream_t stream = moex::cuda::current_stream();
  const int64_t need = kv.filled + step.tokens;
  kv_reserve(kv, k, v, step);
  if (step.rows() > 0) {
    if (!step.device.defined()) throw InvalidInput("kv_append on CUDA: the step has no device mirror (make_device_step)");
    copy_rows(kv.k, k, v.defined() ? &kv.v : nullptr, v.defined() ? &v : nullptr, step, stream);
  }
  kv.filled = need;
}

Tensor kv_columns(const Tensor& cache, int64_t n) {
  const Device dev = cache.device();
  moex::cuda::DeviceGuard guard(dev.index);
  const int64_t batch = cache.size(0), cap = cache.size(1), dim = cache.size(2);
  Tensor out = Tensor::empty({batch * n, dim}, cache.dtype(), dev);
  if (batch > 0 && n > 0 && dim > 0) {
    const size_t es = dtype_size(cache.dtype());
    MOEX_CUDA_CHECK(cudaMemcpy2DAsync(out.raw(), size_t(n * dim) * es, cache.raw(), size_t(cap * dim) * es,
                                      size_t(n * dim) * es, size_t(batch), cudaMemcpyDeviceToDevice,
                                      moex::cuda::current_stream()));
  }
  return out;
}

}  // namespace moex::ops::cuda
