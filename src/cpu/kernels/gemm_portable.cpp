// Portable C++ kernels over the packed layouts (kernels.hpp): the fallback for any CPU and the
// reading of the layouts that the vector kernels must agree with. The loop is gemm_loop.hpp's
// with scalar "vectors" of one lane, one row at a time, without a target region.
#include <cstdint>
#include <utility>

#include "cpu/kernels/gemm_loop.hpp"
#include "cpu/kernels/kernels.hpp"
#include "moex/dtype.hpp"

namespace moex::cpu::kernels {
namespace {

struct Scalar {
  using Acc = float;
  static constexpr int kLanes = 1, kPassCols = kBlockCols, kMaxRows = 1, kPrefetchBytes = 0;
  static Acc zero() { return 0.f; }
  static void store(float* c, Acc v) { *c = v; }
};

struct PortableF32 : Scalar {
  using Elem = float;
  static constexpr int kKPerStep = 1;
  using A = float;
  using B = float;
  static B load_b(const float* p) { return *p; }
  static A load_a(const float* p) { return *p; }
  static Acc madd(Acc acc, A a, B b) { return acc + a * b; }
};

struct PortableBf16 : Scalar {
  using Elem = uint16_t;
  static constexpr int kKPerStep = 2;
  struct Pair {
    float even, odd;
  };
  using A = Pair;
  using B = Pair;
  static Pair load_b(const uint16_t* p) { return {bf16_to_float(p[0]), bf16_to_float(p[1])}; }
  static Pair load_a(const uint16_t* p) { return {bf16_to_float(p[0]), bf16_to_float(p[1])}; }
  static Acc madd(Acc acc, A a, B b) { return (acc + a.even * b.even) + a.odd * b.odd; }
};

}  // namespace

void gemm_bf16_portable(const GemmArgs& g) { loop::gemm<PortableBf16>(g); }
void gemm_f32_portable(const GemmArgs& g) { loop::gemm<PortableF32>(g); }

}  // namespace moex::cpu::kernels
