// RMSNorm on CUDA, both roundings, any group width (contract: ops.hpp; host: src/ops/cpu/norm.cpp).
//
// One team of threads per group: a warp when the group is at most kWarpGroupMax wide (per-head q/k
// norms, 64..256 wide, thousands of groups: no block-level barrier at all), else a block of
// kBlockTeam threads (hidden-size norms, one group per row). Two passes over the group's values,
// the second one from L1 / L2: the sum of squares, then the scaled, rounded output. A prompt's
// hidden-size rows (at least kWarpTeamGroups of them, 16-bit, whole 16-byte chunks) take a third
// form: a warp per row with 16-byte loads (rms_norm_vec_kernel); on 4096 rows of 2048 the block
// teams took 36 us on the H200 and a scalar warp per row 48.
//
// Agreement with the host: squares of float32 values are exact in double, so the sum of squares
// differs from the host's sequential one only by the rounding of a differently ordered double sum
// (~1e-16 relative), and r = 1 / sqrt(mean + eps) is formed with exactly the host's float32 and
// double roundings. r therefore equals the host's except when float(ss / n) falls within that
// noise of a float32 rounding boundary (about one group in 10^8), and the outputs are then equal
// bit for bit. The team reduction is a fixed tree (xor butterfly, then warps in order), so a
// result does not change from run to run; the team forms order the double sum differently,
// which moves r only in that same one-in-10^8 case.
#include <string>

#include "cuda/pdl.cuh"
#include "ops/cuda/cuda_ops.hpp"
#include "ops/cuda/small_ops.cuh"

namespace moex::ops::cuda {

using moex::cuda::aligned16;

namespace {

using moex::cuda::from_float;
using moex::cuda::to_float;

constexpr int kWarpGroupMax = 1024;
constexpr int64_t kWarpTeamGroups = 1024;
constexpr int kBlockTeam = 512;
constexpr int kWarpsPerBlock = kThreads / 32;

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// kTeam = 32: a warp per group, kWarpsPerBlock groups per block; otherwise the block is the team.
// x and out may alias (in place): each element is read and then written by the same thread.
// With `delta` (add_rms_norm): x is a TO tensor updated first, x = round(x + delta), and the
// norm reads the updated values; the thread that writes an element is the one that reads it back.
template <class TO, int kTeam>
__global__ void __launch_bounds__(kTeam == 32 ? kThreads : kTeam)
    rms_norm_kernel(const void* x, int x_code, const void* __restrict__ w, int w_code, int64_t groups,
                    int64_t group, float eps, int act, int inner, TO* out, const void* __restrict__ delta,
                    int delta_code) {
  moex::cuda::pdl_enter();
  __shared__ double partial[kTeam == 32 ? 1 : kTeam / 32];
  const int lane = threadIdx.x % kTeam;
  const int64_t g = kTeam == 32 ? blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32 : int64_t(blockIdx.x);
  // A warp team past the last group still takes part in nothing block-wide: it may leave.
  if (kTeam == 32 && g >= groups) return;
  const int64_t base = g * group;

  double ss = 0;
  if (delta) {
    TO* h = static_cast<TO*>(const_cast<void*>(x));
    for (int64_t i = lane; i < group; i += kTeam) {
      const float v = round_to(__fadd_rn(to_float(h[base + i]), load_float(delta, delta_code, base + i)), act);
      h[base + i] = from_float<TO>(v);
      ss += double(v) * double(v);
    }
  } else {
    for (int64_t i = lane; i < group; i += kTeam) {
      const double v = load_float(x, x_code, base + i);
      ss += v * v;
    }
  }
  ss = warp_sum(ss);
  if constexpr (kTeam > 32) {
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = 0;
    for (int j = 0; j < kTeam / 32; ++j) ss += partial[j];
  }
  // The host's expression: float mean, float + eps, float sqrt, double reciprocal, float.
  const float mean = float(ss / double(group));
  const float r = float(1.0 / double(__fsqrt_rn(__fadd_rn(mean, eps))));

  for (int64_t i = lane; i < group; i += kTeam) {
    const float v = round_to(__fmul_rn(load_float(x, x_code, base + i), r), inner);
    out[base + i] = from_float<TO>(round_to(__fmul_rn(load_float(w, w_code, i), v), act));
  }
}

// The wide-row form: a warp per group, x, delta and out all T (16-bit, act), groups of whole
// 16-byte chunks from 16-byte aligned bases; otherwise rms_norm_kernel's arithmetic.
template <class T>
__global__ void __launch_bounds__(kThreads)
    rms_norm_vec_kernel(T* x, const void* __restrict__ w, int w_code, int64_t groups, int64_t group, float eps,
                        int act, int inner, T* out, const T* __restrict__ delta) {
  moex::cuda::pdl_enter();
  const int lane = threadIdx.x % 32;
  const int64_t g = blockIdx.x * int64_t(kWarpsPerBlock) + threadIdx.x / 32;
  if (g >= groups) return;
  const int64_t chunks = group / 8;
  uint4* xv = reinterpret_cast<uint4*>(x + g * group);
  double ss = 0;
  for (int64_t c = lane; c < chunks; c += 32) {
    float v[8];
    moex::cuda::widen8<T>(xv[c], v);
    if (delta) {
      float d[8];
      moex::cuda::widen8<T>(__ldg(reinterpret_cast<const uint4*>(delta + g * group) + c), d);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = round_to(__fadd_rn(v[i], d[i]), act);
      xv[c] = moex::cuda::narrow8<T>(v);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += double(v[i]) * double(v[i]);
  }
  ss = warp_sum(ss);
  const float mean = float(ss / double(group));
  const float r = float(1.0 / double(__fsqrt_rn(__fadd_rn(mean, eps))));
  uint4* ov = reinterpret_cast<uint4*>(out + g * group);
  for (int64_t c = lane; c < chunks; c += 32) {
    float v[8];
    moex::cuda::widen8<T>(xv[c], v);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[i] = round_to(__fmul_rn(load_float(w, w_code, c * 8 + i), round_to(__fmul_rn(v[i], r), inner)), act);
    ov[c] = moex::cuda::narrow8<T>(v);
  }
}

// x_code / x_raw: the input; out: the output of element type TO (x itself when in place).
template <class TO>
void launch_rms_norm(const void* x_raw, int x_code, const Tensor& weight, int64_t numel, int64_t group,
                     float eps, DType act, RmsNormStyle style, TO* out, const void* delta = nullptr,
                     int delta_code = 0) {
  const int64_t groups = numel / group;
  const int act_code = float_code(act, "rms_norm"), w_code = float_code(weight.dtype(), "rms_norm");
  // Llama casts x * r to the activation dtype before the weight product; gpt-oss does not.
  const int inner = style == RmsNormStyle::kLlama ? act_code : kCodeF32;
  cudaStream_t s = moex::cuda::current_stream();
  if constexpr (sizeof(TO) == 2) {
    const bool same = x_code == act_code && (!delta || delta_code == act_code);
    if (group > kWarpGroupMax && groups >= kWarpTeamGroups && same && group % 8 == 0 && aligned16(x_raw) &&
        aligned16(out) && (!delta || aligned16(delta))) {
      const int64_t blocks = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
      if (blocks > 0x7fffffff) throw Unsupported("rms_norm: " + std::to_string(groups) + " groups");
      moex::cuda::launch_pdl_here(rms_norm_vec_kernel<TO>, dim3(unsigned(blocks)), dim3(kThreads), 0, s,
          static_cast<TO*>(const_cast<void*>(x_raw)), weight.raw(), w_code, groups, group, eps, act_code, inner,
          out, static_cast<const TO*>(delta));
      MOEX_CUDA_CHECK_LAUNCH(rms_norm_vec_kernel);
      return;
    }
  }
  if (group <= kWarpGroupMax) {
    const int64_t blocks = (groups + kWarpsPerBlock - 1) / kWarpsPerBlock;
    if (blocks > 0x7fffffff) throw Unsupported("rms_norm: " + std::to_string(groups) + " groups");
    moex::cuda::launch_pdl_here(rms_norm_kernel<TO, 32>, dim3(unsigned(blocks)), dim3(kThreads), 0, s, x_raw, x_code, weight.raw(), w_code, groups,
                                                                  group, eps, act_code, inner, out, delta, delta_code);
  } else {
    if (groups > 0x7fffffff) throw Unsupported("rms_norm: " + std::to_string(groups) + " groups");
    moex::cuda::launch_pdl_here(rms_norm_kernel<TO, kBlockTeam>, dim3(unsigned(groups)), dim3(kBlockTeam), 0, s,
        x_raw, x_code, weight.raw(), w_code, groups, group, eps, act_code, inner, out, delta, delta_code);
  }
  MOEX_CUDA_CHECK_LAUNCH(rms_norm_kernel);
}

}  // namespace

void rms_norm_(Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  if (group <= 0) group = x.size(1);
  const int64_t numel = x.numel();
  if (numel == 0 || group == 0) return;
  const int x_code = float_code(x.dtype(), "rms_norm");
  moex::cuda::DeviceGuard g(x.device().index);
  with_float_type(x.dtype(), "rms_norm", [&](auto t) {
    using T = decltype(t);
    launch_rms_norm<T>(x.raw(), x_code, weight, numel, group, eps, act, style, x.data<T>());
  });
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps, DType act, int64_t group, RmsNormStyle style) {
  if (group <= 0) group = x.size(1);
  const int x_code = float_code(x.dtype(), "rms_norm");
  moex::cuda::DeviceGuard g(x.device().index);
  Tensor out = Tensor::empty(x.shape(), act, x.device());
  const int64_t numel = x.numel();
  if (numel == 0 || group == 0) return out;
  with_float_type(act, "rms_norm", [&](auto t) {
    using T = decltype(t);
    launch_rms_norm<T>(x.raw(), x_code, weight, numel, group, eps, act, style, out.data<T>());
  });
  return out;
}

Tensor add_rms_norm(Tensor& h, const Tensor& delta, const Tensor& weight, float eps, DType act, RmsNormStyle style) {
  const int64_t numel = h.numel(), group = h.size(1);
  if (h.dtype() != act || delta.numel() != numel) {  // not the residual stream of a model: the two ops
    cuda::add_(h, delta, act);
    return cuda::rms_norm(h, weight, eps, act, 0, style);
  }
  moex::cuda::DeviceGuard g(h.device().index);
  Tensor out = Tensor::empty(h.shape(), act, h.device());
  if (numel == 0 || group == 0) return out;
  const int code = float_code(act, "add_rms_norm"), d_code = float_code(delta.dtype(), "add_rms_norm");
  with_float_type(act, "add_rms_norm", [&](auto t) {
    using T = decltype(t);
    launch_rms_norm<T>(h.raw(), code, weight, numel, group, eps, act, style, out.data<T>(), delta.raw(), d_code);
  });
  return out;
}

}  // namespace moex::ops::cuda
