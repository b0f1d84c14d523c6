// AVX512-BF16 kernel: VDPBF16PS multiplies the (even, odd) bf16 pairs of a broadcast A value
// with one pair row of a packed panel and adds both products to 16 fp32 lanes. This is the
// decode kernel (m <= a few rows: the loop is bound by streaming the weights, and it needs no
// tile setup) and the fallback where AMX is missing.
#include <immintrin.h>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/row_chunks.hpp"

#define MOEX_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))

namespace moex::cpu::kernels {
namespace {

// See gemm_avx512.cpp: keeps both weight streams ahead of use when few rows hide no latency.
constexpr int kPrefetchBytes = 1024;

template <int MR>
MOEX_TARGET_AVX512BF16 void dp_rows(const uint16_t* a, int64_t lda, const uint16_t* b0,
                                    const uint16_t* b1, int64_t k, float* c, int64_t ldc) {
  __m512 acc[MR][2];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k / 2; ++p) {
    const uint16_t* r0 = b0 + p * 2 * kPanelCols;
    const uint16_t* r1 = b1 + p * 2 * kPanelCols;
    _mm_prefetch(reinterpret_cast<const char*>(r0) + kPrefetchBytes, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(r1) + kPrefetchBytes, _MM_HINT_T0);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(r0);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(r1);
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      uint32_t pair;
      __builtin_memcpy(&pair, a + r * lda + 2 * p, 4);
      const __m512bh ap = (__m512bh)_mm512_set1_epi32(int(pair));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ap, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ap, w1);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + kPanelCols, acc[r][1]);
  }
}

template <int MR>
struct DpRows {
  static void run(const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1,
                  int64_t k, float* c, int64_t ldc) {
    dp_rows<MR>(a, lda, b0, b1, k, c, ldc);
  }
};

}  // namespace

void gemm_bf16_avx512bf16(const GemmArgs& g) { run_row_chunks<12, uint16_t, DpRows>(g); }

MOEX_TARGET_AVX512BF16 double peak_loop_avx512bf16(int64_t iters) {
  __m512 acc[24];
  #pragma GCC unroll 32
  for (int i = 0; i < 24; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0)
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x38003800);  // tiny, keeps values finite
  for (int64_t it = 0; it < iters; ++it) {
    #pragma GCC unroll 32
    for (int i = 0; i < 24; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
  }
  #pragma GCC unroll 32
  for (int i = 1; i < 24; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  float sink[16];
  _mm512_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return double(iters) * 24 * 64;
}

}  // namespace moex::cpu::kernels
