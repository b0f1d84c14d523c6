// AVX-512 attention kernels (attention_kernels.hpp), compiled in a target region (see
// src/cpu/kernels/target.hpp) and reached only after cpuid reported AVX-512.
//
// exp is evaluated in double (a degree-11 polynomial after the ln 2 reduction, error near 1e-15)
// and rounded to float once: the result is the correctly rounded float exp but for inputs within
// ~1e-15 of a rounding midpoint, i.e. what std::exp(float) returns, at 16 lanes per step.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cpu/kernels/target.hpp"
#include "ops/cpu/attention_kernels.hpp"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() values as ignored sources of unmasked
// intrinsics and then warn about them (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma")

namespace moex::ops::cpu {
namespace {

__mmask16 first_lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// 16x16 transpose: rows r[0..15] of 16 floats -> r[i][j] = old r[j][i].
void transpose16(__m512 r[16]) {
  __m512 t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  // u[4a + c] holds column c (and c + 4, 8, 12 in its other 128-bit quarters) of rows 4a .. 4a+3.
  for (int a = 0; a < 2; ++a)
    for (int c = 0; c < 4; ++c) {
      t[8 * a + c] = _mm512_shuffle_f32x4(u[8 * a + c], u[8 * a + 4 + c], 0x88);
      t[8 * a + 4 + c] = _mm512_shuffle_f32x4(u[8 * a + c], u[8 * a + 4 + c], 0xdd);
    }
  for (int c = 0; c < 8; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xdd);
  }
}

// Key rows lie a whole cache row apart (kv_heads * head_dim_k floats), too many concurrent
// streams for the hardware prefetcher when a decode step reads them from DRAM: each 16-key
// tile asks for the next one's rows while it transposes its own.
void pack_keys(const float* k, int64_t stride, int64_t nk, int64_t dk, float* kt) {
  const int64_t d16 = dk / 16 * 16;
  for (int64_t j0 = 0; j0 < kKeyBlock; j0 += 16) {
    for (int64_t j = j0 + 16; j < std::min(nk, j0 + 32); ++j)
      for (int64_t d = 0; d < dk; d += 16) _mm_prefetch(reinterpret_cast<const char*>(k + j * stride + d), _MM_HINT_T0);
    for (int64_t d0 = 0; d0 < d16; d0 += 16) {
      __m512 r[16];
      for (int64_t j = 0; j < 16; ++j)
        r[j] = j0 + j < nk ? _mm512_loadu_ps(k + (j0 + j) * stride + d0) : _mm512_setzero_ps();
      transpose16(r);
      for (int64_t d = 0; d < 16; ++d) _mm512_storeu_ps(kt + (d0 + d) * kKeyBlock + j0, r[d]);
    }
  }
  for (int64_t d0 = d16; d0 < dk; ++d0) {
    float* row = kt + d0 * kKeyBlock;
    for (int64_t j = 0; j < nk; ++j) row[j] = k[j * stride + d0];
    std::fill(row + nk, row + kKeyBlock, 0.0f);
  }
}

// NR query rows x kKeyBlock keys: NR * 4 accumulators stay in registers over the whole of dk.
template <int NR>
void scores_rows(const float* const* q, const float* kt, int64_t dk, float scale, float* s,
                 int64_t s_stride) {
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  for (int64_t d = 0; d < dk; ++d) {
    const float* kd = kt + d * kKeyBlock;
    const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16),
                 k2 = _mm512_loadu_ps(kd + 32), k3 = _mm512_loadu_ps(kd + 48);
    for (int r = 0; r < NR; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r][d]);
      acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
      acc[r][2] = _mm512_fmadd_ps(qb, k2, acc[r][2]);
      acc[r][3] = _mm512_fmadd_ps(qb, k3, acc[r][3]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) _mm512_storeu_ps(s + r * s_stride + 16 * i, _mm512_mul_ps(acc[r][i], sc));
}

void scores(const float* const* q, int64_t rows, const float* kt, int64_t dk, float scale, float* s,
            int64_t s_stride) {
  int64_t r = 0;
  for (; r + 6 <= rows; r += 6) scores_rows<6>(q + r, kt, dk, scale, s + r * s_stride, s_stride);
  switch (rows - r) {
    case 5: scores_rows<5>(q + r, kt, dk, scale, s + r * s_stride, s_stride); break;
    case 4: scores_rows<4>(q + r, kt, dk, scale, s + r * s_stride, s_stride); break;
    case 3: scores_rows<3>(q + r, kt, dk, scale, s + r * s_stride, s_stride); break;
    case 2: scores_rows<2>(q + r, kt, dk, scale, s + r * s_stride, s_stride); break;
    case 1: scores_rows<1>(q + r, kt, dk, scale, s + r * s_stride, s_stride); break;
    default: break;
  }
}

// exp(x) for x <= 0 in double: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor series to r^11.
__m512d exp_pd(__m512d x) {
  x = _mm512_max_pd(x, _mm512_set1_pd(-800.0));  // exp underflows to 0 well before; keeps n finite
  const __m512d n = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(1.4426950408889634)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(n, _mm512_set1_pd(6.93147180369123816490e-01), x);
  r = _mm512_fnmadd_pd(n, _mm512_set1_pd(1.90821492927058770002e-10), r);
  static constexpr double kInvFact[12] = {1.0,
                                          1.0,
                                          1.0 / 2,
                                          1.0 / 6,
                                          1.0 / 24,
                                          1.0 / 120,
                                          1.0 / 720,
                                          1.0 / 5040,
                                          1.0 / 40320,
                                          1.0 / 362880,
                                          1.0 / 3628800,
                                          1.0 / 39916800};
  __m512d p = _mm512_set1_pd(kInvFact[11]);
  for (int i = 10; i >= 0; --i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[i]));
  return _mm512_scalef_pd(p, n);
}

__m512 round_bf16_ps(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i v = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
  return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))));
}

double softmax(float* s, int64_t n, float init_max, bool bf16, float* max_out) {
  __m512 mv = _mm512_set1_ps(init_max);
  for (int64_t j = 0; j < n; j += 16)
    mv = _mm512_mask_max_ps(mv, first_lanes(n - j), mv, _mm512_maskz_loadu_ps(first_lanes(n - j), s + j));
  const float m = _mm512_reduce_max_ps(mv);
  const __m512 mb = _mm512_set1_ps(m);
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 mask = first_lanes(n - j);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), mb);
    const __m512d elo = exp_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    const __m512d ehi = exp_pd(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
    const __m512 e = _mm512_maskz_mov_ps(
        mask, _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(elo)), _mm512_cvtpd_ps(ehi), 1));
    // Lanes past n hold +0 and add nothing.
    lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    _mm512_mask_storeu_ps(s + j, mask, bf16 ? round_bf16_ps(e) : e);
  }
  *max_out = m;
  // Fixed tree: lanes (l, l + 8), then halves of 4, 2, 1.
  const __m512d t8 = _mm512_add_pd(lo, hi);
  const __m256d t4 = _mm256_add_pd(_mm512_castpd512_pd256(t8), _mm512_extractf64x4_pd(t8, 1));
  const __m128d t2 = _mm_add_pd(_mm256_castpd256_pd128(t4), _mm256_extractf128_pd(t4, 1));
  return _mm_cvtsd_f64(_mm_add_sd(t2, _mm_unpackhi_pd(t2, t2)));
}

// NR rows x 64 columns of the accumulators stay in registers over all keys: per key, 4 value
// loads and NR broadcasts feed 4 * NR independent FMA chains (one row alone would leave the FMA
// latency exposed and load the values once per row).
template <int NR>
void pv_rows(const float* p, int64_t p_stride, int64_t n, const float* v, int64_t stride,
             const __mmask16 mask[4], float* acc, int64_t acc_stride) {
  __m512 a[NR][4];
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) a[r][i] = _mm512_maskz_loadu_ps(mask[i], acc + r * acc_stride + 16 * i);
  for (int64_t j = 0; j < n; ++j) {
    const float* vj = v + j * stride;
    // Value rows are strided like the keys (see pack_keys); 8 keys ahead covers DRAM latency.
    if (j + 8 < n)
      for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(vj + 8 * stride + 16 * i), _MM_HINT_T0);
    const __m512 v0 = _mm512_maskz_loadu_ps(mask[0], vj), v1 = _mm512_maskz_loadu_ps(mask[1], vj + 16),
                 v2 = _mm512_maskz_loadu_ps(mask[2], vj + 32), v3 = _mm512_maskz_loadu_ps(mask[3], vj + 48);
    for (int r = 0; r < NR; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * p_stride + j]);
      a[r][0] = _mm512_fmadd_ps(w, v0, a[r][0]);
      a[r][1] = _mm512_fmadd_ps(w, v1, a[r][1]);
      a[r][2] = _mm512_fmadd_ps(w, v2, a[r][2]);
      a[r][3] = _mm512_fmadd_ps(w, v3, a[r][3]);
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(acc + r * acc_stride + 16 * i, mask[i], a[r][i]);
}

void pv(const float* p, int64_t p_stride, int64_t rows, int64_t n, const float* v, int64_t stride,
        int64_t dv, float* acc, int64_t acc_stride) {
  for (int64_t i0 = 0; i0 < dv; i0 += 64) {
    __mmask16 mask[4];
    for (int i = 0; i < 4; ++i) mask[i] = dv - i0 - 16 * i <= 0 ? __mmask16(0) : first_lanes(dv - i0 - 16 * i);
    int64_t r = 0;
    for (; r + 6 <= rows; r += 6)
      pv_rows<6>(p + r * p_stride, p_stride, n, v + i0, stride, mask, acc + r * acc_stride + i0, acc_stride);
    const float* pr = p + r * p_stride;
    float* ar = acc + r * acc_stride + i0;
    switch (rows - r) {
      case 5: pv_rows<5>(pr, p_stride, n, v + i0, stride, mask, ar, acc_stride); break;
      case 4: pv_rows<4>(pr, p_stride, n, v + i0, stride, mask, ar, acc_stride); break;
      case 3: pv_rows<3>(pr, p_stride, n, v + i0, stride, mask, ar, acc_stride); break;
      case 2: pv_rows<2>(pr, p_stride, n, v + i0, stride, mask, ar, acc_stride); break;
      case 1: pv_rows<1>(pr, p_stride, n, v + i0, stride, mask, ar, acc_stride); break;
      default: break;
    }
  }
}

}  // namespace

const AttentionKernels& attention_kernels_avx512() {
  static const AttentionKernels k{pack_keys, scores, softmax, pv};
  return k;
}

}  // namespace moex::ops::cpu
MOEX_TARGET_END
