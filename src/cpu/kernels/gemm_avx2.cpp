// AVX2 + FMA kernels for x86-64 CPUs without AVX-512. The loop is gemm_loop.hpp's; with 16 ymm
// registers one 16-column panel is computed per pass over K (the two panels of a block one after
// the other): fp32 MR = 6 rows x 2 ymm, bf16 (widened in registers, as in gemm_avx512.cpp)
// MR = 4 rows x 2 ymm. No software prefetch: none has been measured on an AVX2-only machine.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/target.hpp"

MOEX_TARGET_BEGIN("avx2,fma")
#include "cpu/kernels/gemm_loop.hpp"

namespace moex::cpu::kernels {
namespace {

struct Avx2 {
  using Acc = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kPassCols = 16;
  static constexpr int kPrefetchBytes = 0;
  static Acc zero() { return _mm256_setzero_ps(); }
  static Acc splat(float v) { return _mm256_set1_ps(v); }
  static void store(float* c, Acc v) { _mm256_storeu_ps(c, v); }
};

struct Avx2F32 : Avx2 {
  using Elem = float;
  static constexpr int kKPerStep = 1, kMaxRows = 6, kFlopsPerMadd = 2 * kLanes;
  using A = __m256;
  using B = __m256;
  static B load_b(const float* p) { return _mm256_loadu_ps(p); }
  static A load_a(const float* p) { return _mm256_broadcast_ss(p); }
  static Acc madd(Acc acc, A a, B b) { return _mm256_fmadd_ps(a, b, acc); }
};

// 32 bytes of a pair row = 8 columns x (even k, odd k); widened as in gemm_avx512.cpp.
struct Avx2Bf16Widened : Avx2 {
  using Elem = uint16_t;
  static constexpr int kKPerStep = 2, kMaxRows = 4;
  struct Pair {
    __m256 even, odd;
  };
  using A = Pair;
  using B = Pair;
  static B load_b(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u))))};
  }
  static A load_a(const uint16_t* p) {
    uint32_t pair;
    __builtin_memcpy(&pair, p, 4);
    return {_mm256_castsi256_ps(_mm256_set1_epi32(int(pair << 16))),
            _mm256_castsi256_ps(_mm256_set1_epi32(int(pair & 0xffff0000u)))};
  }
  static Acc madd(Acc acc, A a, B b) {
    return _mm256_fmadd_ps(a.odd, b.odd, _mm256_fmadd_ps(a.even, b.even, acc));
  }
};

}  // namespace

void gemm_f32_avx2(const GemmArgs& g) { loop::gemm<Avx2F32>(g); }
void gemm_bf16_avx2(const GemmArgs& g) { loop::gemm<Avx2Bf16Widened>(g); }

double peak_loop_avx2_f32(int64_t iters) {
  // 12 chains cover the FMA latency x throughput product (4 x 2) with registers to spare.
  return loop::peak<Avx2F32, 12>(iters, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-4f));
}

}  // namespace moex::cpu::kernels
MOEX_TARGET_END
