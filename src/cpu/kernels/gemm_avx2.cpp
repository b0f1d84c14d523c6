// AVX2 + FMA kernels for x86-64 CPUs without AVX-512. With 16 ymm registers one 16-column panel
// is computed at a time (the two panels of a block one after the other): fp32 MR = 6 rows x 2 ymm,
// bf16 (widened in registers, as in gemm_avx512.cpp) MR = 4 rows x 2 ymm.
#include <immintrin.h>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/row_chunks.hpp"

#define MOEX_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace moex::cpu::kernels {
namespace {

template <int MR>
MOEX_TARGET_AVX2 void f32_panel(const float* a, int64_t lda, const float* b, int64_t k, float* c,
                                int64_t ldc) {
  __m256 acc[MR][2];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m256 w0 = _mm256_loadu_ps(b + kk * kPanelCols);
    const __m256 w1 = _mm256_loadu_ps(b + kk * kPanelCols + 8);
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r * lda + kk);
      acc[r][0] = _mm256_fmadd_ps(av, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, w1, acc[r][1]);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

// A pair row (64 bytes) = 2 ymm of 8 columns x (even k, odd k); see gemm_avx512.cpp for widening.
template <int MR>
MOEX_TARGET_AVX2 void bf16_panel(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t k,
                                 float* c, int64_t ldc) {
  const __m256i hi_mask = _mm256_set1_epi32(int(0xffff0000u));
  __m256 acc[MR][2];
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t p = 0; p < k / 2; ++p) {
    const uint16_t* row = b + p * 2 * kPanelCols;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 16));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hi_mask));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    const __m256 o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hi_mask));
    #pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      uint32_t pair;
      __builtin_memcpy(&pair, a + r * lda + 2 * p, 4);
      const __m256 ae = _mm256_castsi256_ps(_mm256_set1_epi32(int(pair << 16)));
      const __m256 ao = _mm256_castsi256_ps(_mm256_set1_epi32(int(pair & 0xffff0000u)));
      acc[r][0] = _mm256_fmadd_ps(ae, e0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ae, e1, acc[r][1]);
      acc[r][0] = _mm256_fmadd_ps(ao, o0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ao, o1, acc[r][1]);
    }
  }
  #pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

template <int MR>
struct F32Rows {
  static void run(const float* a, int64_t lda, const float* b0, const float* b1, int64_t k,
                  float* c, int64_t ldc) {
    f32_panel<MR>(a, lda, b0, k, c, ldc);
    f32_panel<MR>(a, lda, b1, k, c + kPanelCols, ldc);
  }
};
template <int MR>
struct Bf16Rows {
  static void run(const uint16_t* a, int64_t lda, const uint16_t* b0, const uint16_t* b1,
                  int64_t k, float* c, int64_t ldc) {
    bf16_panel<MR>(a, lda, b0, k, c, ldc);
    bf16_panel<MR>(a, lda, b1, k, c + kPanelCols, ldc);
  }
};

}  // namespace

void gemm_f32_avx2(const GemmArgs& g) { run_row_chunks<6, float, F32Rows>(g); }
void gemm_bf16_avx2(const GemmArgs& g) { run_row_chunks<4, uint16_t, Bf16Rows>(g); }

MOEX_TARGET_AVX2 double peak_loop_avx2_f32(int64_t iters) {
  __m256 acc[12];
  #pragma GCC unroll 32
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(float(i) * 1e-3f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-4f);
  for (int64_t it = 0; it < iters; ++it) {
    #pragma GCC unroll 32
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
    __asm__ volatile("" : "+x"(acc[0]), "+x"(acc[1]), "+x"(acc[2]), "+x"(acc[3]));
  }
  #pragma GCC unroll 32
  for (int i = 1; i < 12; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  float sink[8];
  _mm256_storeu_ps(sink, acc[0]);
  __asm__ volatile("" : : "r"(sink) : "memory");
  return double(iters) * 12 * 16;
}

}  // namespace moex::cpu::kernels
