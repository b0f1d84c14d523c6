// AVX512-BF16 kernel: VDPBF16PS multiplies the (even, odd) bf16 pairs of a broadcast A value
// with one pair row of a packed panel and adds both products to 16 fp32 lanes. This is the
// decode kernel (m <= a few rows: the loop is bound by streaming the weights, and it needs no
// tile setup) and the fallback where AMX is missing. The loop is gemm_loop.hpp's.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/target.hpp"

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")
#include "cpu/kernels/gemm_loop.hpp"

namespace moex::cpu::kernels {
namespace {

struct Avx512Bf16Dot {
  using Elem = uint16_t;
  using Acc = __m512;
  using A = __m512bh;
  using B = __m512bh;
  static constexpr int kLanes = 16, kPassCols = 32, kKPerStep = 2, kMaxRows = 12;
  static constexpr int kFlopsPerMadd = 4 * kLanes;  // two products and two adds per lane
  // As in gemm_avx512.cpp: keeps both weight streams ahead of use when few rows hide no latency.
  static constexpr int kPrefetchBytes = 1024;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc splat(float v) { return _mm512_set1_ps(v); }
  static void store(float* c, Acc v) { _mm512_storeu_ps(c, v); }
  static B load_b(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static A load_a(const uint16_t* p) {
    uint32_t pair;
    __builtin_memcpy(&pair, p, 4);
    return (__m512bh)_mm512_set1_epi32(int(pair));
  }
  static Acc madd(Acc acc, A a, B b) { return _mm512_dpbf16_ps(acc, a, b); }
};

}  // namespace

void gemm_bf16_avx512bf16(const GemmArgs& g) { loop::gemm<Avx512Bf16Dot>(g); }

double peak_loop_avx512bf16(int64_t iters) {
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // (1.0, 1.0)
  const __m512bh y = (__m512bh)_mm512_set1_epi32(0x38003800);  // tiny, keeps values finite
  return loop::peak<Avx512Bf16Dot, 24>(iters, x, y);
}

}  // namespace moex::cpu::kernels
MOEX_TARGET_END
