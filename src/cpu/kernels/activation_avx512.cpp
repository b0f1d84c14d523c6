// Vectorized epilogues of the experts engine: the gated SiLU of [16 gate | 16 up] result rows
// (Qwen, Mixtral, DeepSeek, OLMoE experts), written straight to the activation dtype, and the
// combine of a token's slot rows. Scalar expf cost a quarter of the gate_up phase at prefill
// sizes, and the scalar per-element bf16 conversion after it about half (docs/cpu.md). exp uses
// the Cephes range reduction and degree-6 polynomial (about 1 ulp) and _mm512_scalef_ps for the
// power of two, which saturates cleanly.
#include <immintrin.h>

#include "cpu/kernels/kernels.hpp"

// GCC 12 reports '__Y may be used uninitialized' inside its own avx512fintrin.h for
// _mm512_max_ps / _mm512_scalef_ps inlined here (the masked builtins take an _mm512_undefined_ps()
// pass-through operand); a known false positive of the header, not of this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define MOEX_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

namespace moex::cpu::kernels {
namespace {

MOEX_TARGET_AVX512 inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.3762626647949f)),
                    _mm512_set1_ps(88.3762626647949f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, fx);
}

// Rounds 16 floats to bf16 exactly like float_to_bf16: NaN -> quiet NaN (payload kept),
// else round to nearest even on the bit pattern.
MOEX_TARGET_AVX512 inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

MOEX_TARGET_AVX512 inline __m512 gated_silu(const float* c, const float* bias) {
  __m512 g = _mm512_loadu_ps(c);
  __m512 u = _mm512_loadu_ps(c + kPanelCols);
  if (bias) {
    g = _mm512_add_ps(g, _mm512_loadu_ps(bias));
    u = _mm512_add_ps(u, _mm512_loadu_ps(bias + kPanelCols));
  }
  const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g)));
  return _mm512_mul_ps(_mm512_div_ps(g, den), u);
}

}  // namespace

MOEX_TARGET_AVX512 void gated_silu_rows_bf16_avx512(const float* c, int m, const float* bias,
                                                    int valid, void* out, int64_t ldo) {
  const __mmask16 keep = valid >= kPanelCols ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
  auto* o = static_cast<uint16_t*>(out);
  for (int r = 0; r < m; ++r) {
    const __m512 v = _mm512_maskz_mov_ps(keep, gated_silu(c + r * kBlockCols, bias));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + r * ldo), to_bf16(v));
  }
}

MOEX_TARGET_AVX512 void gated_silu_rows_f32_avx512(const float* c, int m, const float* bias,
                                                   int valid, void* out, int64_t ldo) {
  const __mmask16 keep = valid >= kPanelCols ? __mmask16(0xffff) : __mmask16((1u << valid) - 1);
  auto* o = static_cast<float*>(out);
  for (int r = 0; r < m; ++r)
    _mm512_storeu_ps(o + r * ldo, _mm512_maskz_mov_ps(keep, gated_silu(c + r * kBlockCols, bias)));
}

// The combine: a token's slot rows summed in slot order, one rounding at the end.
template <bool kBf16>
MOEX_TARGET_AVX512 inline void sum_rows(const float* const* rows, int n, int64_t len, void* out) {
  int64_t i = 0;
  for (; i < len; i += 16) {
    const __mmask16 mk = len - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (len - i)) - 1);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < n; ++j) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(mk, rows[j] + i));
    if constexpr (kBf16)
      _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, mk, to_bf16(acc));
    else
      _mm512_mask_storeu_ps(static_cast<float*>(out) + i, mk, acc);
  }
}

MOEX_TARGET_AVX512 void sum_rows_bf16_avx512(const float* const* rows, int n, int64_t len,
                                             void* out) {
  sum_rows<true>(rows, n, len, out);
}
MOEX_TARGET_AVX512 void sum_rows_f32_avx512(const float* const* rows, int n, int64_t len,
                                            void* out) {
  sum_rows<false>(rows, n, len, out);
}

}  // namespace moex::cpu::kernels
