// AVX-512F kernels: fp32 weights (panel layout, FMA) and bf16 weights widened to fp32 in
// registers (pair layout; for AVX-512 CPUs without the BF16 extension, e.g. Skylake-X/Ice Lake).
// The loop is gemm_loop.hpp's; register blocking: MR rows x 32 columns of accumulators (2 zmm per
// row, one per panel), MR = 12 / 10 so that accumulators + B vectors + broadcasts fit the 32 zmm
// registers.
#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "cpu/kernels/kernels.hpp"
#include "cpu/kernels/target.hpp"

MOEX_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,fma")
#include "cpu/kernels/gemm_loop.hpp"

namespace moex::cpu::kernels {
namespace {

struct Avx512 {
  using Acc = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kPassCols = 32;
  // Weight streams are sequential; a software prefetch this far ahead keeps both panel streams
  // in flight at decode sizes, where the FMAs cannot hide DRAM latency.
  static constexpr int kPrefetchBytes = 1024;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Acc splat(float v) { return _mm512_set1_ps(v); }
  static void store(float* c, Acc v) { _mm512_storeu_ps(c, v); }
};

struct Avx512F32 : Avx512 {
  using Elem = float;
  static constexpr int kKPerStep = 1, kMaxRows = 12, kFlopsPerMadd = 2 * kLanes;
  using A = __m512;
  using B = __m512;
  static B load_b(const float* p) { return _mm512_loadu_ps(p); }
  static A load_a(const float* p) { return _mm512_set1_ps(*p); }
  static Acc madd(Acc acc, A a, B b) { return _mm512_fmadd_ps(a, b, acc); }
};

// A pair row of the packed panel holds (even k, odd k) bf16 per column in one 32-bit lane: the
// even value widens by a 16-bit left shift, the odd one by masking the low half.
struct Avx512Bf16Widened : Avx512 {
  using Elem = uint16_t;
  static constexpr int kKPerStep = 2, kMaxRows = 10;
  struct Pair {
    __m512 even, odd;
  };
  using A = Pair;
  using B = Pair;
  static Pair widen(__m512i v) {
    return {_mm512_castsi512_ps(_mm512_maskz_slli_epi32(__mmask16(0xffff), v, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u))))};
  }
  static B load_b(const uint16_t* p) { return widen(_mm512_loadu_si512(p)); }
  static A load_a(const uint16_t* p) {
    uint32_t pair;
    __builtin_memcpy(&pair, p, 4);
    return widen(_mm512_set1_epi32(int(pair)));
  }
  static Acc madd(Acc acc, A a, B b) {
    return _mm512_fmadd_ps(a.odd, b.odd, _mm512_fmadd_ps(a.even, b.even, acc));
  }
};

}  // namespace

void gemm_f32_avx512(const GemmArgs& g) { loop::gemm<Avx512F32>(g); }
void gemm_bf16_avx512(const GemmArgs& g) { loop::gemm<Avx512Bf16Widened>(g); }

double peak_loop_avx512_f32(int64_t iters) {
  // 24 independent accumulator chains cover the FMA latency x throughput product (4 x 2).
  return loop::peak<Avx512F32, 24>(iters, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-4f));
}

}  // namespace moex::cpu::kernels
MOEX_TARGET_END
