// ops::linear for decode-sized inputs (a few rows) with 16-bit weights: a bandwidth-bound GEMV.
//
// Why not cuBLASLt here: at one to eight rows a projection only streams its weight once, and
// the time is bytes / bandwidth plus the launch. Measured on the H200 (ncu, one decode step of
// a 24-layer Qwen1.5-MoE-shaped model, docs/gpu_model.md), cuBLASLt's kernels for these shapes
// reached 1.2 TB/s with the bias epilogue and 2.2 TB/s without (the 2048 x 2048 projections
// took 7-8.4 us for 8.4 MB), and a one-column output (qwen2_moe's shared-expert gate) ran as
// two kernels (a dot and a reduce). Nothing about these shapes needs tensor cores.
//
// Shape of the work: a block of 8 warps owns kColumns output columns for every row; the warps
// split K into 256-element chunks (32 lanes x 8 elements, one 16-byte load per lane per column),
// so each block keeps kColumns x 4 KiB of weight loads in flight and even a 2048-column matrix
// gives 512 blocks. x is read through the L1 (it is at most 8 rows). Partial sums are reduced
// in a fixed order (lanes by shuffle-xor, then warps 0..7 in order), the bias added in float32,
// and the result rounded once to act: the ops contract of linear(), with an accumulation order
// of its own (so its bits differ from cuBLASLt's, as cuBLASLt's differ between its kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/runtime.hpp"
#include "ops/cuda/cuda_ops.hpp"

namespace moex::ops::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kColumns = 4;
constexpr int kChunk = 256;  // K elements one warp reads per column per step

__device__ __forceinline__ void widen8(const uint4& v, const __nv_bfloat16*, float* f) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void widen8(const uint4& v, const __half*, float* f) {
  const __half2* p = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(p[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

template <class T, int M>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias,
                T* __restrict__ y, int64_t in, int64_t out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = int64_t(blockIdx.x) * kColumns;
  const int cols = out - n0 < kColumns ? int(out - n0) : kColumns;
  float acc[M][kColumns];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) acc[m][c] = 0.0f;

  for (int64_t k = int64_t(warp) * kChunk + lane * 8; k < in; k += int64_t(kWarps) * kChunk) {
    uint4 wv[kColumns];
#pragma unroll
    for (int c = 0; c < kColumns; ++c)
      wv[c] = c < cols ? __ldcs(reinterpret_cast<const uint4*>(w + (n0 + c) * in + k)) : make_uint4(0, 0, 0, 0);
    float wf[kColumns][8];
#pragma unroll
    for (int c = 0; c < kColumns; ++c) widen8(wv[c], w, wf[c]);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      widen8(__ldg(reinterpret_cast<const uint4*>(x + m * in + k)), x, xf);
#pragma unroll
      for (int c = 0; c < kColumns; ++c)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m][c] = fmaf(xf[i], wf[c][i], acc[m][c]);
    }
  }

  __shared__ float part[kWarps][M][kColumns];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      float v = acc[m][c];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][m][c] = v;
    }
  __syncthreads();
  if (threadIdx.x < M * kColumns) {
    const int m = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
    if (c < cols) {
      float v = 0.0f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) v += part[q][m][c];
      if (bias) v += moex::cuda::to_float<T>(bias[n0 + c]);
      y[int64_t(m) * out + n0 + c] = moex::cuda::from_float<T>(v);
    }
  }
}

template <class T, int M>
void launch(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, cudaStream_t s) {
  const int64_t in = w.size(1), out = w.size(0);
  const int64_t blocks = (out + kColumns - 1) / kColumns;
  gemv_kernel<T, M><<<unsigned(blocks), kWarps * 32, 0, s>>>(
      static_cast<const T*>(x.raw()), static_cast<const T*>(w.raw()),
      b.defined() ? static_cast<const T*>(b.raw()) : nullptr, static_cast<T*>(y.raw()), in, out);
  MOEX_CUDA_CHECK_LAUNCH("gemv_kernel");
}

template <class T>
void launch_rows(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, cudaStream_t s) {
  switch (x.size(0)) {
    case 1: launch<T, 1>(x, w, b, y, s); break;
    case 2: launch<T, 2>(x, w, b, y, s); break;
    case 3: launch<T, 3>(x, w, b, y, s); break;
    case 4: launch<T, 4>(x, w, b, y, s); break;
    case 5: launch<T, 5>(x, w, b, y, s); break;
    case 6: launch<T, 6>(x, w, b, y, s); break;
    case 7: launch<T, 7>(x, w, b, y, s); break;
    default: launch<T, 8>(x, w, b, y, s); break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool gemv_serves(const Tensor& x, const Tensor& weight, const Tensor& bias, DType act) {
  const DType wt = weight.dtype();
  if (wt != DType::kBF16 && wt != DType::kF16) return false;
  if (x.dtype() != wt || act != wt || (bias.defined() && bias.dtype() != wt)) return false;
  const int64_t rows = x.size(0), in = weight.size(1);
  return rows >= 1 && rows <= kGemvMaxRows && in % 8 == 0 && weight.nbytes() <= kGemvMaxWeightBytes &&
         x.is_contiguous() &&
         weight.is_contiguous() && aligned16(x.raw()) && aligned16(weight.raw());
}

Tensor linear_gemv(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = Tensor::empty({x.size(0), weight.size(0)}, weight.dtype(), x.device());
  if (weight.size(0) == 0) return y;
  cudaStream_t s = moex::cuda::current_stream();
  if (weight.dtype() == DType::kBF16) launch_rows<__nv_bfloat16>(x, weight, bias, y, s);
  else launch_rows<__half>(x, weight, bias, y, s);
  return y;
}

}  // namespace moex::ops::cuda
