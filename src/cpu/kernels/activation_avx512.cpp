// Vectorized gated SiLU of one packed [16 gate | 16 up] row (the gate_up epilogue of the Qwen,
// Mixtral, DeepSeek, OLMoE experts). Scalar expf cost a quarter of the whole gate_up phase at
// prefill sizes (docs/cpu.md). exp uses the Cephes range reduction and degree-6 polynomial
// (about 1 ulp) and _mm512_scalef_ps for the power of two, which saturates cleanly.
#include <immintrin.h>

#include "cpu/kernels/kernels.hpp"

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

}  // namespace

MOEX_TARGET_AVX512 void gated_silu_row_avx512(const float* c, const float* bias, float* out) {
  __m512 g = _mm512_loadu_ps(c);
  __m512 u = _mm512_loadu_ps(c + kPanelCols);
  if (bias) {
    g = _mm512_add_ps(g, _mm512_loadu_ps(bias));
    u = _mm512_add_ps(u, _mm512_loadu_ps(bias + kPanelCols));
  }
  const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g)));
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_div_ps(g, den), u));
}

}  // namespace moex::cpu::kernels
