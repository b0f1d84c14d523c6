// AVX-512 pieces of the quantized linears (quant_linear_kernels.hpp), compiled in a target
// region and reached only after cpuid reported AVX-512.
//
// e4m3fn decodes without a table: for |code| >= 8 (normal numbers) the float32 bits are
// (|code| << 20) + (120 << 23) (exponent rebiased from 7 to 127); for |code| < 8 (zero and
// subnormals) the value is |code| * 2^-9, converted exactly. Code 0x7f / 0xff (NaN) decodes to a
// large finite value instead; hub checkpoints hold no NaN weights.
#include <immintrin.h>

#include "cpu/kernels/target.hpp"
#include "cpu/quant_linear_kernels.hpp"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma")

namespace moex::cpu::quant_kernels {
namespace {

inline __m512 decode16_fp8(__m128i bytes) {
  const __m512i v = _mm512_cvtepu8_epi32(bytes);
  const __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7f));
  const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  const __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
  const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / 512.0f));
  const __mmask16 is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
  const __m512 m = _mm512_mask_blend_ps(is_sub, _mm512_castsi512_ps(normal), sub);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(m), sign));
}

void decode_fp8_avx512(const uint8_t* codes, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, decode16_fp8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i))));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, decode16_fp8(_mm_maskz_loadu_epi8(m, codes + i)));
  }
}

// 8 packed bytes -> 16 nibble indices: nibble 2i = low nibble of byte i.
inline __m512i nibbles(__m128i bytes8) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(bytes8, bytes8));  // b0 b0 b1 b1 ...
  const __m512i shift = _mm512_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4);
  return _mm512_and_si512(_mm512_srlv_epi32(b, shift), _mm512_set1_epi32(0xf));
}

void decode_fp4_avx512(const uint8_t* packed, int64_t n, float* out) {
  const __m512 lut = _mm512_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f,
                                    -2.f, -3.f, -4.f, -6.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + i / 2));
    _mm512_storeu_ps(out + i, _mm512_permutexvar_ps(nibbles(bytes), lut));
  }
  if (i < n) {
    const int64_t left = n - i;  // even, < 16
    const __m128i bytes = _mm_maskz_loadu_epi8(__mmask16((1u << (left / 2)) - 1), packed + i / 2);
    _mm512_mask_storeu_ps(out + i, __mmask16((1u << left) - 1), _mm512_permutexvar_ps(nibbles(bytes), lut));
  }
}

// Every dot below sums in the same order (two 16-lane accumulators over 32-wide steps, a masked
// 16-wide tail into the first, one reduction), so the direct and the tiled paths give the same
// bits: a row's result does not depend on how many rows share the call.
template <class Load>
inline float dot_in_order(const float* x, int64_t n, Load w16) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k), w16(k, __mmask16(0xffff)), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + k + 16), w16(k + 16, __mmask16(0xffff)), acc1);
  }
  for (; k < n; k += 16) {
    const __mmask16 m = n - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - k)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + k), w16(k, m), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

// Weight loaders of dot_in_order: 16 values from k on, lanes outside `m` zero. (Structs, not
// lambdas: GCC does not carry the target region into a lambda's call operator.)
struct FloatWeights {
  const float* w;
  __m512 operator()(int64_t k, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, w + k); }
};
struct Fp8Weights {
  const uint8_t* codes;
  __m512 operator()(int64_t k, __mmask16 m) const { return decode16_fp8(_mm_maskz_loadu_epi8(m, codes + k)); }
};
// k is even at every step (steps of 16 from 0), so each step starts on a byte.
struct Fp4Weights {
  const uint8_t* packed;
  __m512 operator()(int64_t k, __mmask16 m) const {
    const __m512 lut = _mm512_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f,
                                      -2.f, -3.f, -4.f, -6.f);
    const int lanes = __builtin_popcount(unsigned(m));
    const __mmask16 bytes = __mmask16((1u << ((lanes + 1) / 2)) - 1);  // one byte per two lanes
    return _mm512_maskz_mov_ps(m, _mm512_permutexvar_ps(nibbles(_mm_maskz_loadu_epi8(bytes, packed + k / 2)), lut));
  }
};

float dot_avx512(const float* a, const float* b, int64_t n) { return dot_in_order(a, n, FloatWeights{b}); }
float dot_fp8_avx512(const float* x, const uint8_t* codes, int64_t n) { return dot_in_order(x, n, Fp8Weights{codes}); }
float dot_fp4_avx512(const float* x, const uint8_t* packed, int64_t n) { return dot_in_order(x, n, Fp4Weights{packed}); }

}  // namespace

const QuantKernels& avx512_kernels() {
  static const QuantKernels k{decode_fp8_avx512, decode_fp4_avx512, dot_avx512, dot_fp8_avx512, dot_fp4_avx512};
  return k;
}

}  // namespace moex::cpu::quant_kernels

MOEX_TARGET_END
