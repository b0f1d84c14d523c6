// Shared pieces of the small CUDA ops (src/ops/cuda/*.cu): the float-dtype codes side inputs are
// read with, rounding to the activation dtype, the one run-time -> compile-time switch on the
// stored element type, launch sizing and the step's device mirror.
//
// Why run-time codes for side inputs: an op templated on every input's dtype multiplies its
// instantiations (3 x 3 x ...) for inputs that are, in a model, almost always `act` itself. The
// written tensor's type is a template argument (the store is the hot path); every other float
// input is read through load_float(ptr, code, i), one uniform branch per load.
//
// Exactness: the host ops round with round-to-nearest-even at fixed points; the kernels do the
// same with __float2bfloat16_rn / __float2half_rn, and use __fmul_rn / __fadd_rn where a product
// feeds a sum, so that nvcc's default FMA contraction cannot skip a rounding the host performs.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "cuda/common.cuh"
#include "cuda/runtime.hpp"
#include "moex/error.hpp"
#include "ops/ops.hpp"

namespace moex::ops::cuda {

using moex::cuda::FloatCode;
using moex::cuda::kCodeBF16;
using moex::cuda::kCodeF16;
using moex::cuda::kCodeF32;
using moex::cuda::load_float;

// ---- host side ----

// The FloatCode of a float tensor dtype; anything else is a request this build cannot serve.
inline int float_code(DType t, const char* what) {
  switch (t) {
    case DType::kF32: return kCodeF32;
    case DType::kF16: return kCodeF16;
    case DType::kBF16: return kCodeBF16;
    default: break;
  }
  throw Unsupported(std::string(what) + ": dtype " + std::string(dtype_name(t)) +
                    " (the CUDA ops read float32, float16 and bfloat16)");
}

// Runs f(T{}) with T the element type of a float dtype (float, __half, __nv_bfloat16).
template <class F>
void with_float_type(DType t, const char* what, F&& f) {
  switch (float_code(t, what)) {
    case kCodeF32: f(float{}); break;
    case kCodeF16: f(__half{}); break;
    default: f(__nv_bfloat16{}); break;
  }
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill every SM several times over,
// never more than the grid's x limit.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t want = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(want, 1, int64_t(1) << 20));
}

// The int32 mirror of a step (ops.hpp), checked once here because a missing mirror would make
// every kernel of the step read garbage.
inline const int32_t* device_step_data(const Step& step, Device device, const char* what) {
  if (!step.device.defined() || step.device.device() != device || step.device.dtype() != DType::kI32 ||
      step.device.numel() < 1 + step.batch + 2 * step.rows())
    throw InvalidInput(std::string(what) + ": the step has no device mirror on " + device.str() +
                       " (call make_device_step first)");
  return step.device.data<int32_t>();
}

// ---- device side ----

// Rounds to the activation dtype (code) and returns the value as a float.
__device__ __forceinline__ float round_to(float v, int code) {
  if (code == kCodeBF16) return __bfloat162float(__float2bfloat16_rn(v));
  if (code == kCodeF16) return __half2float(__float2half_rn(v));
  return v;
}

// 1 / (1 + exp(-x)) as the host computes it with glibc's expf: exp is evaluated in double and
// rounded once to float, which is the correctly rounded expf except within ~1e-9 ulp of a tie
// (CUDA's expf is allowed 2 ulp, which would differ from the host far more often). The sum and
// the division are IEEE float operations, as on the host.
__device__ __forceinline__ float exp_f(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float sigmoid_f(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_f(-x)));
}

}  // namespace moex::ops::cuda
