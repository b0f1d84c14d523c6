// Element-wise ops, embedding and the column / row reshuffles on CUDA (contracts: ops.hpp).
//
// Every kernel is a grid-stride loop over the output's elements with int64 indices, the written
// tensor's element type a template argument and the other inputs read through their FloatCode
// (small_ops.cuh says why). Loads are scalar, except in the two ops that run over a prompt's
// widest activations (gated_activation_, add_gated_): when every tensor is 16-bit of the act
// dtype, 16-byte aligned, and rows are whole 16-byte chunks, a second kernel takes 8 elements
// per thread with one 16-byte load per input and the same per-element arithmetic (same bits).
// The scalar loops ran at 0.7-1.2 TB/s on the H200 there (a 4096-token prompt of a
// Qwen1.5-MoE-shaped model: 113 + 68 us per layer). Each op returns before launching when it
// has no elements.
//
// Rounding points are the host's (src/ops/cpu/elementwise.cpp) one for one; products that feed a
// sum use __fmul_rn / __fadd_rn so that FMA contraction cannot merge two roundings.
#include <cmath>
#include <string>

#include "cuda/pdl.cuh"
#include "moex/experts.hpp"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

using moex::cuda::aligned16;

namespace {

using moex::cuda::from_float;
using moex::cuda::to_float;

// ---- kernels ----

// Activation codes (moex::Activation, minus kSwigluOai which the op rejects).
enum ActFn : int { kFnSilu = 0, kFnGelu = 1, kFnGeluTanh = 2, kFnRelu = 3 };

// The host's float formulas; the transcendental part is evaluated in double and rounded once
// (close to glibc's nearly correctly rounded float functions; see the op's note). With
// `fast_exp` (16-bit activations) silu takes CUDA's float expf (within 2 ulp) instead: the
// result is rounded to 8 or 11 bits, which hides the difference except within a few float ulps
// of a rounding boundary (about one element in 10^4-10^5 moves by one bf16 ulp), and a 4096-token
// prompt of a Qwen1.5-MoE-shaped model spends 127 us per layer in the double exp otherwise.
__device__ __forceinline__ float activation(int fn, float x, bool fast_exp) {
  switch (fn) {
    case kFnSilu: return __fdiv_rn(x, __fadd_rn(1.0f, fast_exp ? expf(-x) : exp_f(-x)));
    case kFnGelu: {
      const float e = float(erf(double(__fmul_rn(x, float(0.70710678118654752440)))));  // M_SQRT1_2
      return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, e));
    }
    case kFnGeluTanh: {
      const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
      const float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(x, cube));
      return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, float(tanh(double(inner)))));
    }
    default: return x > 0.0f ? x : 0.0f;
  }
}

template <class T>
__global__ void round_kernel(T* __restrict__ x, int64_t n, int act) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = from_float<T>(round_to(to_float(x[i]), act));
}

template <class T>
__global__ void add_kernel(T* __restrict__ a, const void* __restrict__ b, int b_code, int64_t n, int act) {
  moex::cuda::pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] = from_float<T>(round_to(__fadd_rn(to_float(a[i]), load_float(b, b_code, i)), act));
}

template <class T>
__global__ void clamp_kernel(T* __restrict__ x, int64_t n, float limit) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_float(x[i]);
    // std::clamp's comparisons, so that NaN stays NaN (fminf / fmaxf would drop it).
    x[i] = from_float<T>(v < -limit ? -limit : (limit < v ? limit : v));
  }
}

template <class T>
__global__ void gated_activation_kernel(T* __restrict__ gate, const void* __restrict__ up, int up_code,
                                        int64_t n, int fn, int act) {
  moex::cuda::pdl_enter();
  const bool fast_exp = act != kCodeF32;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = round_to(activation(fn, to_float(gate[i]), fast_exp), act);
    gate[i] = from_float<T>(round_to(__fmul_rn(a, load_float(up, up_code, i)), act));
  }
}

// With `residual`: also residual += y (rounded), the MoE block's output joining the residual stream.
template <class T>
__global__ void add_gated_kernel(T* __restrict__ y, const void* __restrict__ shared, int shared_code,
                                 const void* __restrict__ gate_logit, int gate_code, int64_t n,
                                 int64_t h, int act, T* __restrict__ residual) {
  moex::cuda::pdl_enter();
  // The gate is rounded to a 16-bit act (float expf then suffices, as for silu above).
  const bool fast_exp = act != kCodeF32;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float z = load_float(gate_logit, gate_code, i / h);
    const float g = round_to(fast_exp ? __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))) : sigmoid_f(z), act);
    const float s = round_to(__fmul_rn(g, load_float(shared, shared_code, i)), act);
    const float v = round_to(__fadd_rn(to_float(y[i]), s), act);
    y[i] = from_float<T>(v);
    if (residual) residual[i] = from_float<T>(round_to(__fadd_rn(to_float(residual[i]), v), act));
  }
}

// The vectorised forms: n8 chunks of 8 elements, every tensor T (16-bit) and act T's code.
template <class T>
__global__ void gated_activation_vec_kernel(T* __restrict__ gate, const T* __restrict__ up, int64_t n8, int fn,
                                            int act) {
  moex::cuda::pdl_enter();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n8; c += int64_t(gridDim.x) * blockDim.x) {
    float g[8], u[8];
    moex::cuda::widen8<T>(reinterpret_cast<const uint4*>(gate)[c], g);
    moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(up) + c), u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float a = round_to(activation(fn, g[i], true), act);
      g[i] = round_to(__fmul_rn(a, u[i]), act);
    }
    reinterpret_cast<uint4*>(gate)[c] = moex::cuda::narrow8<T>(g);
  }
}

template <class T>
__global__ void add_gated_vec_kernel(T* __restrict__ y, const T* __restrict__ shared,
                                     const void* __restrict__ gate_logit, int gate_code, int64_t n8, int64_t h8,
                                     int act, T* __restrict__ residual) {
  moex::cuda::pdl_enter();
  for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < n8; c += int64_t(gridDim.x) * blockDim.x) {
    const float z = load_float(gate_logit, gate_code, c / h8);
    const float g = round_to(__fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))), act);
    float yv[8], sv[8];
    moex::cuda::widen8<T>(reinterpret_cast<const uint4*>(y)[c], yv);
    moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(shared) + c), sv);
#pragma unroll
    for (int i = 0; i < 8; ++i) yv[i] = round_to(__fadd_rn(yv[i], round_to(__fmul_rn(g, sv[i]), act)), act);
    reinterpret_cast<uint4*>(y)[c] = moex::cuda::narrow8<T>(yv);
    if (residual) {
      float rv[8];
      moex::cuda::widen8<T>(reinterpret_cast<const uint4*>(residual)[c], rv);
#pragma unroll
      for (int i = 0; i < 8; ++i) rv[i] = round_to(__fadd_rn(rv[i], yv[i]), act);
      reinterpret_cast<uint4*>(residual)[c] = moex::cuda::narrow8<T>(rv);
    }
  }
}

template <class T>
__global__ void embedding_kernel(const void* __restrict__ table, int table_code,
                                 const int32_t* __restrict__ ids, int64_t n, int64_t h, int act,
                                 T* __restrict__ out) {
  moex::cuda::pdl_enter();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, c = i - r * h;
    out[i] = from_float<T>(round_to(load_float(table, table_code, int64_t(ids[r]) * h + c), act));
  }
}

// out[rg, c] = x[rg, begin + c] over rg = row * groups + group: x viewed as [rows * groups, g_in].
template <class T>
__global__ void slice_columns_kernel(const T* __restrict__ x, int64_t n, int64_t g_in, int64_t begin,
                                     int64_t width, T* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t rg = i / width, c = i - rg * width;
    out[i] = x[rg * g_in + begin + c];
  }
}

// out[rg] = [a[rg], b[rg] or b[row]] with rg = row * groups + group.
template <class T>
__global__ void concat_columns_kernel(const T* __restrict__ a, const void* __restrict__ b, int b_code,
                                      int64_t n, int64_t groups, int64_t wa, int64_t wb,
                                      bool b_shared, T* __restrict__ out) {
  const int64_t w = wa + wb;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t rg = i / w, c = i - rg * w;
    if (c < wa) {
      out[i] = a[rg * wa + c];
    } else {
      const int64_t src_row = b_shared ? rg / groups : rg;
      out[i] = from_float<T>(load_float(b, b_code, src_row * wb + (c - wa)));
    }
  }
}

template <class T>
__global__ void last_rows_kernel(const T* __restrict__ x, int64_t n, int64_t tokens, int64_t w,
                                 T* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = i / w, c = i - b * w;
    out[i] = x[((b + 1) * tokens - 1) * w + c];
  }
}

// ---- launch helpers ----

cudaStream_t stream() { return moex::cuda::current_stream(); }

int activation_fn(Activation a) {
  switch (a) {
    case Activation::kSilu: return kFnSilu;
    case Activation::kGelu: return kFnGelu;
    case Activation::kGeluTanh: return kFnGeluTanh;
    case Activation::kRelu: return kFnRelu;
    case Activation::kSwigluOai: break;
  }
  throw Unsupported("activation " + std::string(activation_name(a)) + " is not a plain MLP activation");
}

}  // namespace

void round_(Tensor& x, DType act) {
  const int64_t n = x.numel();
  // float32 activations and tensors already stored in act hold act values: nothing to round.
  if (n == 0 || act == DType::kF32 || x.dtype() == act) return;
  const int code = float_code(act, "round");
  moex::cuda::DeviceGuard g(x.device().index);
  with_float_type(x.dtype(), "round", [&](auto t) {
    using T = decltype(t);
    round_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(x.data<T>(), n, code);
  });
  MOEX_CUDA_CHECK_LAUNCH(round_kernel);
}

void add_(Tensor& a, const Tensor& b, DType act) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const int act_code = float_code(act, "add"), b_code = float_code(b.dtype(), "add");
  moex::cuda::DeviceGuard g(a.device().index);
  with_float_type(a.dtype(), "add", [&](auto t) {
    using T = decltype(t);
    moex::cuda::launch_pdl_here(add_kernel<T>, grid_for(n), dim3(kThreads), 0, stream(), a.data<T>(), b.raw(), b_code, n, act_code);
  });
  MOEX_CUDA_CHECK_LAUNCH(add_kernel);
}

void clamp_(Tensor& x, float limit) {
  const int64_t n = x.numel();
  if (n == 0) return;
  moex::cuda::DeviceGuard g(x.device().index);
  with_float_type(x.dtype(), "clamp", [&](auto t) {
    using T = decltype(t);
    clamp_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(x.data<T>(), n, limit);
  });
  MOEX_CUDA_CHECK_LAUNCH(clamp_kernel);
}

// The transcendental functions are evaluated in double and rounded to float, the closest a GPU
// gets to glibc's float functions without reimplementing them: silu then matches the host in
// every element in practice (glibc's expf is within 0.502 ulp), gelu / gelu_tanh in all but a
// rare last float bit (glibc's erff / tanhf are not correctly rounded), which the rounding to
// bf16 hides almost always. relu is exact. silu with a 16-bit act uses the float expf (see
// activation()): one bf16 ulp now and then, tested at most 1 % of elements and one ulp.
void gated_activation_(Tensor& gate, const Tensor& up, Activation act_fn, DType act) {
  const int fn = activation_fn(act_fn);
  const int64_t n = gate.numel();
  if (n == 0) return;
  const int act_code = float_code(act, "gated_activation"), up_code = float_code(up.dtype(), "gated_activation");
  moex::cuda::DeviceGuard g(gate.device().index);
  const bool vec = gate.dtype() != DType::kF32 && up.dtype() == gate.dtype() && act == gate.dtype() &&
                   n % 8 == 0 && aligned16(gate.raw()) && aligned16(up.raw()) && gate.is_contiguous() &&
                   up.is_contiguous();
  with_float_type(gate.dtype(), "gated_activation", [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      if (vec) {
        moex::cuda::launch_pdl_here(gated_activation_vec_kernel<T>, grid_for(n / 8), dim3(kThreads), 0, stream(),
            gate.data<T>(), static_cast<const T*>(up.raw()), n / 8, fn, act_code);
        return;
      }
    }
    moex::cuda::launch_pdl_here(gated_activation_kernel<T>, grid_for(n), dim3(kThreads), 0, stream(), gate.data<T>(), up.raw(), up_code,
                                                                       n, fn, act_code);
  });
  MOEX_CUDA_CHECK_LAUNCH(gated_activation_kernel);
}

namespace {
void launch_add_gated(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act, Tensor* residual) {
  const int64_t n = y.numel(), h = y.size(1);
  if (n == 0) return;
  const int act_code = float_code(act, "add_gated");
  const int s_code = float_code(shared.dtype(), "add_gated"), g_code = float_code(gate_logit.dtype(), "add_gated");
  moex::cuda::DeviceGuard g(y.device().index);
  const bool vec = y.dtype() != DType::kF32 && act == y.dtype() && shared.dtype() == y.dtype() && h % 8 == 0 &&
                   aligned16(y.raw()) && aligned16(shared.raw()) && (!residual || aligned16(residual->raw()));
  with_float_type(y.dtype(), "add_gated", [&](auto t) {
    using T = decltype(t);
    if constexpr (sizeof(T) == 2) {
      if (vec) {
        moex::cuda::launch_pdl_here(add_gated_vec_kernel<T>, grid_for(n / 8), dim3(kThreads), 0, stream(),
            y.data<T>(), static_cast<const T*>(shared.raw()), gate_logit.raw(), g_code, n / 8, h / 8, act_code,
            residual ? residual->data<T>() : nullptr);
        return;
      }
    }
    moex::cuda::launch_pdl_here(add_gated_kernel<T>, grid_for(n), dim3(kThreads), 0, stream(), y.data<T>(), shared.raw(), s_code,
                                                                gate_logit.raw(), g_code, n, h, act_code,
                                                                residual ? residual->data<T>() : nullptr);
  });
  MOEX_CUDA_CHECK_LAUNCH(add_gated_kernel);
}
}  // namespace

void add_gated_(Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  launch_add_gated(y, shared, gate_logit, act, nullptr);
}

void add_gated_residual_(Tensor& residual, Tensor& y, const Tensor& shared, const Tensor& gate_logit, DType act) {
  if (residual.dtype() != y.dtype() || residual.numel() != y.numel()) {
    launch_add_gated(y, shared, gate_logit, act, nullptr);
    cuda::add_(residual, y, act);
    return;
  }
  launch_add_gated(y, shared, gate_logit, act, &residual);
}

Tensor embedding(const Tensor& table, const Step& step, DType act) {
  const Device dev = table.device();
  const int64_t rows = step.rows(), h = table.size(1), n = rows * h;
  const int act_code = float_code(act, "embedding"), t_code = float_code(table.dtype(), "embedding");
  moex::cuda::DeviceGuard g(dev.index);
  Tensor out = Tensor::empty({rows, h}, act, dev);
  if (n == 0) return out;
  const int32_t* ids = device_step_data(step, dev, "embedding") + device_step_id_offset(step);
  with_float_type(act, "embedding", [&](auto t) {
    using T = decltype(t);
    moex::cuda::launch_pdl_here(embedding_kernel<T>, grid_for(n), dim3(kThreads), 0, stream(), table.raw(), t_code, ids, n, h, act_code,
                                                                out.data<T>());
  });
  MOEX_CUDA_CHECK_LAUNCH(embedding_kernel);
  return out;
}

Tensor slice_columns(const Tensor& x, int64_t groups, int64_t begin, int64_t width) {
  const int64_t rows = x.size(0), g_in = x.size(1) / groups, n = rows * groups * width;
  moex::cuda::DeviceGuard g(x.device().index);
  Tensor out = Tensor::empty({rows, groups * width}, x.dtype(), x.device());
  if (n == 0) return out;
  with_float_type(x.dtype(), "slice_columns", [&](auto t) {
    using T = decltype(t);
    slice_columns_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(x.data<T>(), n, g_in, begin, width,
                                                                    out.data<T>());
  });
  MOEX_CUDA_CHECK_LAUNCH(slice_columns_kernel);
  return out;
}

// The output has a's dtype; b is converted when it differs (exact from a narrower dtype).
Tensor concat_columns(const Tensor& a, const Tensor& b, int64_t groups, bool b_shared) {
  const int64_t rows = a.size(0), wa = a.size(1) / groups;
  const int64_t wb = b_shared ? b.size(1) : b.size(1) / groups, n = rows * groups * (wa + wb);
  const int b_code = float_code(b.dtype(), "concat_columns");
  moex::cuda::DeviceGuard g(a.device().index);
  Tensor out = Tensor::empty({rows, groups * (wa + wb)}, a.dtype(), a.device());
  if (n == 0) return out;
  with_float_type(a.dtype(), "concat_columns", [&](auto t) {
    using T = decltype(t);
    concat_columns_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(a.data<T>(), b.raw(), b_code, n, groups,
                                                                     wa, wb, b_shared, out.data<T>());
  });
  MOEX_CUDA_CHECK_LAUNCH(concat_columns_kernel);
  return out;
}

Tensor last_rows(const Tensor& x, const Step& step) {
  const int64_t w = x.size(1), n = step.batch * w;
  moex::cuda::DeviceGuard g(x.device().index);
  Tensor out = Tensor::empty({step.batch, w}, x.dtype(), x.device());
  if (n == 0 || step.tokens == 0) return out;
  with_float_type(x.dtype(), "last_rows", [&](auto t) {
    using T = decltype(t);
    last_rows_kernel<T><<<grid_for(n), kThreads, 0, stream()>>>(x.data<T>(), n, step.tokens, w, out.data<T>());
  });
  MOEX_CUDA_CHECK_LAUNCH(last_rows_kernel);
  return out;
}

}  // namespace moex::ops::cuda
