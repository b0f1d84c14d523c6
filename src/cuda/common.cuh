// Device-side helpers shared by the CUDA kernels: element types, the activations of the experts
// core, and thin wrappers over the PTX the tensor-core kernels use (cp.async, ldmatrix, mma.sync).
// Header-only and free of runtime types, so every kernel file stays a pure function of its
// template arguments (three-tier layout: kernels here and in *.cuh, launchers in *.cu, ops above).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace moex::cuda {

// ---- element types ----
template <class T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Two values rounded to T (16-bit) and packed into one 32-bit register, the first in the low half
// (the order mma / stmatrix fragments and little-endian stores use).
template <class T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  static_assert(sizeof(T) == 2, "pack2: 16-bit element types");
  const T lo = from_float<T>(a), hi = from_float<T>(b);
  unsigned short ul, uh;
  __builtin_memcpy(&ul, &lo, 2);
  __builtin_memcpy(&uh, &hi, 2);
  return uint32_t(ul) | (uint32_t(uh) << 16);
}

// Eight 16-bit values of one 16-byte load widened to float, two per conversion (the GEMVs'
// inner loop: weights and activations arrive as uint4).
template <class T>
__device__ __forceinline__ void widen8(const uint4& v, float* f) {
  static_assert(sizeof(T) == 2, "widen8: 16-bit element types");
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t;
    if constexpr (std::is_same_v<T, __half>) t = __half22float2(reinterpret_cast<const __half2*>(&v)[i]);
    else t = __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(&v)[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// Whether a pointer may be read or written with 16-byte vector accesses (host-side checks that
// pick a vectorised kernel).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Eight floats rounded to T (16-bit) and packed for one 16-byte store (widen8's inverse).
template <class T>
__device__ __forceinline__ uint4 narrow8(const float* f) {
  uint4 v;
  v.x = pack2<T>(f[0], f[1]);
  v.y = pack2<T>(f[2], f[3]);
  v.z = pack2<T>(f[4], f[5]);
  v.w = pack2<T>(f[6], f[7]);
  return v;
}

// Run-time float dtype codes for small side inputs (routing weights): avoids multiplying kernel
// instantiations by the routing-weight dtype, which costs one branch per load.
enum FloatCode : int { kCodeF32 = 0, kCodeF16 = 1, kCodeBF16 = 2 };
__device__ __forceinline__ float load_float(const void* p, int code, int64_t i) {
  if (code == kCodeF32) return static_cast<const float*>(p)[i];
  if (code == kCodeF16) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

// ---- activations (the experts core; see include/moex/experts.hpp) ----
// act codes follow moex::Activation: 0 silu, 1 gelu, 2 gelu_tanh, 3 relu, 4 swiglu_oai.
struct ActParams {
  int act = 0;
  float limit = 7.f;
  float alpha = 1.702f;
};

// SiLU (every gated model but gpt-oss) is inlined; the others are out-of-line calls. Why: the
// GEMM epilogues are fully unrolled over a thread's outputs (64 per thread in the wgmma kernel),
// and with every variant inlined at every output the epilogue grew to ~100 KB of code, which
// missed the instruction cache on every item: ncu showed the wgmma gate_up kernel stalled on
// instruction fetch 40% of the time (docs/cuda.md). The formulas are unchanged.
static __device__ __noinline__ float act_single_other(int act, float x) {
  switch (act) {
    case 1: return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
    case 2: {
      float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.f + tanhf(inner));
    }
    case 3: return x > 0.f ? x : 0.f;
    default: return x;
  }
}
static __device__ __noinline__ float act_swiglu_oai(float g, float u, float limit, float alpha) {
  g = fminf(g, limit);
  u = fminf(fmaxf(u, -limit), limit);
  return (u + 1.f) * g / (1.f + expf(-alpha * g));
}
// Fast exp and division (MUFU ex2 / rcp, ~2 ulp in fp32): the result is rounded to bf16 / f16
// or compared at bf16 tolerance, and the IEEE expf + division cost ~40 instructions per output in
// the GEMM epilogues. x -> -inf: __expf(-x) = inf, x / inf = -0 (silu's limit); x > 88: exactly x.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.f + __expf(-x)); }

__device__ __forceinline__ float act_single(int act, float x) {
  return act == 0 ? silu(x) : act_single_other(act, x);
}
// Gated: act(g) * u, or gpt-oss's clamped SwiGLU. Ungated callers use act_single.
__device__ __forceinline__ float act_gated(const ActParams& p, float g, float u) {
  if (p.act == 0) return silu(g) * u;
  if (p.act == 4) return act_swiglu_oai(g, u, p.limit, p.alpha);
  return act_single_other(p.act, g) * u;
}

// ---- PTX wrappers (sm_80+) ----
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy global -> shared; src_bytes = 0 zero-fills without reading.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                            uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
template <class T>
__device__ __forceinline__ void mma_16816(float* c, const uint32_t* a, const uint32_t* b);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float* c, const uint32_t* a,
                                                         const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace moex::cuda
