// Portable C++ kernels over the packed layouts (kernels.hpp): the fallback for any CPU and the
// reading of the layouts that the vector kernels must agree with. The loop is gemm_loop.hpp's,
// one row at a time, without a target region.
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/kernels/gemm_loop.hpp"
#include "cpu/kernels/kernels.hpp"
#include "moex/dtype.hpp"

namespace moex::cpu::kernels {
namespace {

// Four columns as a GCC/Clang generic vector: plain C++ that the compiler maps onto one register
// of the baseline SSE2. Per lane it is the same multiply, then add, as a scalar loop; scalar
// lanes ran 3-5x slower (not vectorized), 16-lane vectors 5x slower (spilled to the stack).
using V4 = float __attribute__((vector_size(16)));
using U4 = uint32_t __attribute__((vector_size(16)));

struct Portable {
  using Acc = V4;
  static constexpr int kLanes = 4, kPassCols = kBlockCols, kMaxRows = 1;
  static constexpr int kPrefetchBytes = 0;
  static Acc zero() { return V4{}; }
  static void store(float* c, Acc v) { std::memcpy(c, &v, sizeof v); }
};

struct PortableF32 : Portable {
  using Elem = float;
  static constexpr int kKPerStep = 1;
  using A = float;
  using B = V4;
  static B load_b(const float* p) {
    V4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static A load_a(const float* p) { return *p; }
  static Acc madd(Acc acc, A a, B b) { return acc + a * b; }
};

// A pair row: the 32-bit lane of column i holds (even k, odd k) as bf16; the even value widens by
// a 16-bit left shift, the odd one by masking the low half (as in gemm_avx512.cpp).
struct PortableBf16 : Portable {
  using Elem = uint16_t;
  static constexpr int kKPerStep = 2;
  struct Pair {
    float even, odd;
  };
  struct Pairs {
    V4 even, odd;
  };
  using A = Pair;
  using B = Pairs;
  static B load_b(const uint16_t* p) {
    U4 u;
    std::memcpy(&u, p, sizeof u);
    const U4 even = u << 16, odd = u & 0xffff0000u;
    Pairs r;
    std::memcpy(&r.even, &even, sizeof even);
    std::memcpy(&r.odd, &odd, sizeof odd);
    return r;
  }
  static A load_a(const uint16_t* p) { return {bf16_to_float(p[0]), bf16_to_float(p[1])}; }
  static Acc madd(Acc acc, A a, B b) { return (acc + a.even * b.even) + a.odd * b.odd; }
};

}  // namespace

void gemm_bf16_portable(const GemmArgs& g) { loop::gemm<PortableBf16>(g); }
void gemm_f32_portable(const GemmArgs& g) { loop::gemm<PortableF32>(g); }

}  // namespace moex::cpu::kernels
