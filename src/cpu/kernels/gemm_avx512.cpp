// AVX-512F kernels: fp32 weights (panel layout, FMA) and bf16 weights widened to fp32 in
// registers (pair layout; for AVX-512 CPUs without the BF16 extension, e.g. Skylake-X/Ice Lake).
// Register blocking: MR rows x 32 columns of accumulators (2 zmm per row), MR <= 12 / 10 so that
// accumulators + B vectors + broadcasts fit the 32 zmm registers.
#include <immintrin.h>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/row_chunks.hpp"

#define MOEX_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

namespace moex::cpu::kernels {
namespace {

// Streams of weights are sequential; a software prefetch this far ahead keeps two streams (one
// per panel) in flight at decode sizes where the FMAs cannot hide DRAM latency.
constexpr int kPrefetchBytes = 1024;

template <int MR>
MOEX_TARGET_AVX512 void f32_rows(const float* a, int64_t lda, const float* b0, const float* b1,
                                 int64_t k, float* c, int64_t ldc) {
  __m512 acc[MR][2];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    _mm_prefetch(reinterpret_cast<const char*>(b0 + kk * kPanelCols) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b1 + kk * kPanelCols) + kPrefetchBytes, _MM_HINT_T0);
    const __m512 w0 = _mm512_loadu_ps(b0 + kk * kPanelCols);
    const __m512 w1 = _mm512_loadu_ps(b1 + kk * kPanelCols);
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + kk]);
      acc[r][0] = _mm512_fmadd_ps(av, w0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, w1, acc[r][1]);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + kPanelCols, acc[r][1]);
  }
}

template <int MR>
MOEX_TARGET_AVX512 void bf16_rows(const uint16_t* a, int64_t lda, const uint16_t* b0,
                                  const uint16_t* b1, int64_t k, float* c, int64_t ldc) {
  // A pair row of the packed panel holds (even k, odd k) bf16 per column in one 32-bit lane:
  // the even value widens by a 16-bit left shift, the odd one by masking the low half.
  const __m512i hi_mask = _mm512_set1_epi32(int(0xffff0000u));
  __m512 acc[MR][2];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k / 2; ++p) {
    const uint16_t* r0 = b0 + p * 2 * kPanelCols;
    const uint16_t* r1 = b1 + p * 2 * kPanelCols;
    _mm_prefetch(reinterpret_cast<const char*>(r0) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(r1) + kPrefetchBytes, _MM_HINT_T0);
    const __m512i v0 = _mm512_loadu_si512(r0);
    const __m512i v1 = _mm512_loadu_si512(r1);
    const __m512 e0 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), v0, 16));
    const __m512 o0 = _mm512_castsi512_ps(_mm512_and_si512(v0, hi_mask));
    const __m512 e1 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), v1, 16));
    const __m512 o1 = _mm512_castsi512_ps(_mm512_and_si512(v1, hi_mask));
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      uint32_t pair;
      __builtin_memcpy(&pair, a + r * lda + 2 * p, 4);
      const __m512i ap = _mm512_set1_epi32(int(pair));
      const __m512 ae = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), ap, 16));
      const __m512 ao = _mm512_castsi512_ps(_mm512_and_si512(ap, hi_mask));
      acc[r][0] = _mm512_fmadd_ps(ae, e0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ae, e1, acc[r][1]);
      acc[r][0] = _mm512_fmadd_ps(ao, o0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ao, o1, acc[r][1]);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + kPanelCols, acc[r][1]);
  }
}

template <int MR>
struct F32Rows {
  static void run(const float* a, int64_t lda, const float* b0, const float* b1, int64_t k,
                  float* c, int64_t ldc) {
    f32_rows<MR>(a, lda, b0, b1, k, c, ldc);
  }
};
template <int MR>
struct Bf16Rows {
  static void run(const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1,
                  int64_t k, float* c, int64_t ldc) {
    bf16_rows<MR>(a, lda, b0, b1, k, c, ldc);
  }
};

}  // namespace

void gemm_f32_avx512(const GemmArgs& g) { run_row_chunks<12, float, F32Rows>(g); }
void gemm_bf16_avx512(const GemmArgs& g) { run_row_chunks<10, uint16_t, Bf16Rows>(g); }

MOEX_TARGET_AVX512 double peak_loop_avx512_f32(int64_t iters) {
  // 24 independent accumulator chains cover the FMA latency x throughput product (4 x 2).
  __m512 acc[24];
  #pragma GCC unroll 32
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_set1_ps(float(i) * 1e-3f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
    #pragma GCC unroll 32
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
  }
  #pragma GCC unroll 32
  for (int i = 1; i < 24; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float sink[16];
  _mm512_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return double(iters) * 24 * 32;
}

}  // namespace moex::cpu::kernels
