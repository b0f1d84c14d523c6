// Expert parallelism's device pieces (declared in core/device_hooks.hpp): mark_sentinels of
// router ids held on a GPU (the replicated mode's one piece of index math per MoE layer, kept on
// the device so that a decode step stays one captured graph), and the all-to-all mode's row
// gather (dispatch, and the final exchange of token slices) and its per-token combine.
#include <algorithm>
#include <cstdint>

#include "core/device_hooks.hpp"
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/common.cuh"
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

template <class Word>
__global__ void gather_rows_kernel(const Word* __restrict__ src, const int64_t* __restrict__ idx, Word* __restrict__ out,
                                   int64_t rows, int64_t words) {
  for (int64_t p = blockIdx.x; p < rows; p += gridDim.x) {
    const Word* from = src + idx[p] * words;
    Word* to = out + p * words;
    for (int64_t w = threadIdx.x; w < words; w += blockDim.x) to[w] = from[w];
  }
}


template <class T>
__global__ void sum_rows_kernel(const T* __restrict__ rows, const int64_t* __restrict__ pos, T* __restrict__ out,
                                int64_t tokens, int64_t k, int64_t width) {
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x)
    for (int64_t h = threadIdx.x; h < width; h += blockDim.x) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = pos[t * k + j];
        if (p >= 0) acc = __fadd_rn(acc, cuda::to_float(rows[p * width + h]));
      }
      out[t * width + h] = cuda::from_float<T>(acc);
    }
}

int grid_for(int64_t rows) { return int(std::min<int64_t>(std::max<int64_t>(rows, 1), 65535)); }

}  // namespace

void gather_rows_on_device(const Tensor& src, const Tensor& idx, Tensor& out) {
  const int64_t P = idx.numel();
  if (!src.device().is_cuda() || idx.device() != src.device() || out.device() != src.device() ||
      idx.dtype() != DType::kI64 || out.dtype() != src.dtype() || !src.is_contiguous() || !out.is_contiguous() ||
      !idx.is_contiguous() || src.dim() < 1 || out.dim() != src.dim() || out.size(0) != P ||
      (src.dim() > 0 && shape_numel(src.shape()) / std::max<int64_t>(src.size(0), 1) !=
                            shape_numel(out.shape()) / std::max<int64_t>(P, 1)))
    throw InvalidInput("gather_rows_on_device: rows of " + src.str() + " by " + idx.str() + " into " + out.str());
  if (P == 0) return;
  const size_t row_bytes = out.nbytes() / size_t(P);
  cuda::DeviceGuard g(src.device().index);
  cudaStream_t s = cuda::current_stream();
  const auto* ix = static_cast<const int64_t*>(idx.raw());
  if (row_bytes % 16 == 0)
    gather_rows_kernel<<<grid_for(P), 128, 0, s>>>(static_cast<const uint4*>(src.raw()), ix,
                                                   static_cast<uint4*>(out.raw()), P, int64_t(row_bytes / 16));
  else if (row_bytes % 4 == 0)
    gather_rows_kernel<<<grid_for(P), 128, 0, s>>>(static_cast<const uint32_t*>(src.raw()), ix,
                                                   static_cast<uint32_t*>(out.raw()), P, int64_t(row_bytes / 4));
  else
    gather_rows_kernel<<<grid_for(P), 128, 0, s>>>(static_cast<const uint8_t*>(src.raw()), ix,
                                                   static_cast<uint8_t*>(out.raw()), P, int64_t(row_bytes));
  MOEX_CUDA_CHECK(cudaPeekAtLastError());
}

void sum_rows_on_device(const Tensor& rows, const Tensor& pos, int64_t k, Tensor& out) {
  if (!rows.device().is_cuda() || pos.device() != rows.device() || out.device() != rows.device() ||
      pos.dtype() != DType::kI64 || out.dtype() != rows.dtype() || rows.dim() != 2 || out.dim() != 2 ||
      rows.size(1) != out.size(1) || pos.numel() != out.size(0) * k || !rows.is_contiguous() ||
      !out.is_contiguous() || !pos.is_contiguous())
    throw InvalidInput("sum_rows_on_device: rows " + rows.str() + ", positions " + pos.str() + " and k = " +
                       std::to_string(k) + " into " + out.str());
  const int64_t T = out.size(0), H = out.size(1);
  if (T == 0 || H == 0) return;
  cuda::DeviceGuard g(rows.device().index);
  cudaStream_t s = cuda::current_stream();
  const auto* ps = static_cast<const int64_t*>(pos.raw());
  if (rows.dtype() == DType::kF32)
    sum_rows_kernel<<<grid_for(T), 256, 0, s>>>(static_cast<const float*>(rows.raw()), ps,
                                                static_cast<float*>(out.raw()), T, k, H);
  else if (rows.dtype() == DType::kBF16)
    sum_rows_kernel<<<grid_for(T), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(rows.raw()), ps,
                                                static_cast<__nv_bfloat16*>(out.raw()), T, k, H);
  else if (rows.dtype() == DType::kF16)
    sum_rows_kernel<<<grid_for(T), 256, 0, s>>>(static_cast<const __half*>(rows.raw()), ps,
                                                static_cast<__half*>(out.raw()), T, k, H);
  else
    throw InvalidInput("sum_rows_on_device: float32, bfloat16 or float16 rows, got " + rows.str());
  MOEX_CUDA_CHECK(cudaPeekAtLastError());
}

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
