// Quantized (FP8 e4m3 / FP4 e2m1) experts: every CPU backend against the float64 reference of the
// quantized math (moex/quant.hpp, the QuantScheme contract in moex/experts.hpp), the boundary
// errors, and the memory held.
//
// Tolerance. The activation quantizer is a step function: a backend's float32 intermediate that
// differs from the reference's double one by an ulp can round to the neighbouring e4m3 value.
// The reference (experts_reference_f64_bounded) therefore estimates the float32 error of every
// intermediate element, flags the ones whose error interval reaches an e4m3 rounding midpoint and
// returns an absolute L2 bound of what their flips can change. A case passes when
//   ||out - ref|| <= experts_tolerance(dtype, max(H, I)) x ||ref|| + crossing_bound,
// which is the plain ~1e-5 float32 comparison wherever no element is near a midpoint (most cases
// here flag none; FlaggedElementsAreRare checks the bound stays small). The backends themselves
// share one kernel whose every output element is computed the same way however the work is split,
// so they must agree with each other bit for bit (BackendsAgreeExactly): a grouping or threading
// bug cannot hide inside the tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <fstream>
#include <string>
#include <unistd.h>
#include <xmmintrin.h>

#include "cpu/engine.hpp"
#include "cpu/kernels/kernels.hpp"
#include "moex/bench.hpp"
#include "moex/check.hpp"
#include "moex/error.hpp"
#include "moex/experts.hpp"
#include "moex/quant.hpp"
#include "support/test_support.hpp"

using namespace moex;
using namespace moex::test;

namespace {

const std::vector<std::string> kCpuBackends = {"eager", "batched_mm", "grouped_mm"};

ExpertsSpec fp8(DType sd, int64_t E, int64_t H, int64_t I, bool gated = true) {
  return quantized_spec(QuantScheme::Kind::kFp8E4M3, sd, E, H, I, gated);
}
ExpertsSpec fp4(int64_t E, int64_t H, int64_t I, bool gated = true) {
  return quantized_spec(QuantScheme::Kind::kFp4E2M1, DType::kF8E8M0, E, H, I, gated);
}

double l2(const Tensor& a, const Tensor* b = nullptr) {
  const std::vector<float> x = a.to_float_vector();
  const std::vector<float> y = b ? b->to_float_vector() : std::vector<float>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = double(x[i]) - (b ? double(y[i]) : 0.0);
    s += d * d;
  }
  return std::sqrt(s);
}

struct CaseResult {
  int64_t near = 0, elements = 0;
};

CaseResult check_quant_case(const std::string& backend, const ExpertsSpec& s, const ExpertsWeights& w,
                            DType act, int64_t T, int64_t k, RoutingCase rc, uint64_t seed) {
  SCOPED_TRACE(backend + " " + s.str() + " " + std::string(dtype_name(act)) + " T=" +
               std::to_string(T) + " k=" + std::to_string(k) + " " + routing_case_name(rc) +
               " seed=" + std::to_string(seed));
  Routing r = random_routing(s, T, k, act, seed, rc);
  QuantizedReference ref =
      experts_reference_f64_bounded(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  Tensor out = experts_forward(backend, s, w, r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_EQ(out.dtype(), act);
  EXPECT_EQ(out.shape(), (Shape{T, s.hidden}));
  const double err = l2_diff(out, ref.out), norm = l2_f64(ref.out);
  const double tol = experts_tolerance(act, std::max(s.hidden, s.intermediate));
  EXPECT_LE(err, tol * norm + ref.crossing_bound)
      << "relative error " << (norm > 0 ? err / norm : err) << ", tolerance " << tol
      << ", elements near an e4m3 midpoint " << ref.near_midpoints << " of " << ref.elements
      << " (bound " << ref.crossing_bound << ")";
  return {ref.near_midpoints, ref.elements};
}

class QuantExperts : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantExperts, Fp8TokenCountsAndUglyShapes) {
  uint64_t seed = 100;
  // H = 160 / 288 are not multiples of 128; I = 200 makes ragged fused scale rows (gate's last
  // block row is 72 rows, and up's scale rows start at ceil(200 / 128) = 2, not at 200 / 128).
  for (DType sd : {DType::kF32, DType::kF8E8M0})
    for (auto [H, I] : {std::pair<int64_t, int64_t>{160, 200}, {288, 96}}) {
      const ExpertsSpec s = fp8(sd, 6, H, I);
      const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
      for (DType act : {DType::kF32, DType::kBF16})
        for (int64_t T : {0, 1, 7, 64})
          check_quant_case(GetParam(), s, w, act, T, 3, RoutingCase::kRandom, ++seed);
    }
}

TEST_P(QuantExperts, Fp8ManyTokens) {
  const ExpertsSpec s = fp8(DType::kF32, 8, 160, 136);
  const ExpertsWeights w = random_quantized_experts_weights(s, 7);
  check_quant_case(GetParam(), s, w, DType::kF32, 1000, 2, RoutingCase::kRandom, 8);
  check_quant_case(GetParam(), s, w, DType::kBF16, 1000, 2, RoutingCase::kRandom, 9);
}

TEST_P(QuantExperts, Fp4) {
  uint64_t seed = 200;
  for (auto [H, I] : {std::pair<int64_t, int64_t>{96, 160}, {288, 32}}) {
    const ExpertsSpec s = fp4(5, H, I);
    const ExpertsWeights w = random_quantized_experts_weights(s, ++seed);
    for (DType act : {DType::kF32, DType::kBF16})
      for (int64_t T : {0, 1, 7, 64})
        check_quant_case(GetParam(), s, w, act, T, 2, RoutingCase::kRandom, ++seed);
  }
  const ExpertsSpec s = fp4(8, 160, 96);
  const ExpertsWeights w = random_quantized_experts_weights(s, 250);
  check_quant_case(GetParam(), s, w, DType::kF32, 1000, 2, RoutingCase::kRandom, 251);
}

TEST_P(QuantExperts, RoutingCasesAndUngated) {
  uint64_t seed = 300;
  for (bool gated : {true, false})
    for (RoutingCase rc : {RoutingCase::kEveryExpert, RoutingCase::kEmptyExperts,
                           RoutingCase::kDuplicates, RoutingCase::kSentinels})
      for (int64_t T : {1, 7, 64}) {
        const ExpertsSpec s8 = fp8(DType::kF8E8M0, 7, 160, 200, gated);
        check_quant_case(GetParam(), s8, random_quantized_experts_weights(s8, ++seed), DType::kF32,
                         T, 4, rc, ++seed);
        const ExpertsSpec s4 = fp4(7, 64, 96, gated);
        check_quant_case(GetParam(), s4, random_quantized_experts_weights(s4, ++seed),
                         DType::kBF16, T, 4, rc, ++seed);
      }
}

TEST_P(QuantExperts, Float16Activations) {
  const ExpertsSpec s = fp8(DType::kF32, 4, 160, 200);
  check_quant_case(GetParam(), s, random_quantized_experts_weights(s, 401), DType::kF16, 16, 2,
                   RoutingCase::kRandom, 402);
}

// A wrong kernel must fail: one down weight moved by a few e4m3 steps in the backend's input only.
TEST_P(QuantExperts, HarnessDetectsAPerturbedWeight) {
  const ExpertsSpec s = fp8(DType::kF32, 4, 160, 200);
  const ExpertsWeights w = random_quantized_experts_weights(s, 501);
  Routing r = random_routing(s, 16, 2, DType::kF32, 502, RoutingCase::kEveryExpert);
  QuantizedReference ref = experts_reference_f64_bounded(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  ExpertsWeights bad = w;
  bad.down = w.down.clone();
  // The largest code of the down projection gets its second exponent bit flipped: that weight
  // becomes 16x smaller (or larger), a change far past the tolerance whatever the seed's codes.
  uint8_t* b = static_cast<uint8_t*>(bad.down.raw());
  int64_t at = 0;
  for (int64_t i = 1; i < int64_t(bad.down.numel()); ++i)
    if (std::fabs(f8e4m3_to_float(b[i])) > std::fabs(f8e4m3_to_float(b[at]))) at = i;
  b[at] = uint8_t(b[at] ^ 0x20);
  Tensor out = experts_forward(GetParam(), s, bad, r.hidden, r.top_k_index, r.top_k_weights);
  const double tol = experts_tolerance(DType::kF32, 200);
  EXPECT_GT(l2_diff(out, ref.out), tol * l2_f64(ref.out) + ref.crossing_bound);
}

INSTANTIATE_TEST_SUITE_P(Cpu, QuantExperts, ::testing::ValuesIn(kCpuBackends),
                         [](const auto& info) { return info.param; });

// Same kernel, same per-element arithmetic: every split of the work gives the same bits.
TEST(QuantExpertsCpu, BackendsAgreeExactly) {
  for (const ExpertsSpec& s : {fp8(DType::kF32, 8, 288, 200), fp4(8, 96, 160)}) {
    const ExpertsWeights w = random_quantized_experts_weights(s, 601);
    for (DType act : {DType::kF32, DType::kBF16}) {
      Routing r = random_routing(s, 300, 3, act, 602, RoutingCase::kDuplicates);
      Tensor base = experts_forward("eager", s, w, r.hidden, r.top_k_index, r.top_k_weights);
      for (const std::string& b : {"batched_mm", "grouped_mm"}) {
        Tensor o = experts_forward(b, s, w, r.hidden, r.top_k_index, r.top_k_weights);
        EXPECT_EQ(l2(o, &base), 0.0) << b << " " << s.str() << " " << dtype_name(act);
      }
    }
  }
}

// The bound is not vacuous: few elements are ever near a midpoint in float32 (0.15 % here), and
// what they could change together (~1.4e-3 of the output here: one e4m3 step is 1/8 of an
// element) stays far below any real bug, such as the perturbed weight above (~1e-1).
TEST(QuantExpertsCpu, FlaggedElementsAreRare) {
  const ExpertsSpec s = fp8(DType::kF32, 8, 288, 200);
  const ExpertsWeights w = random_quantized_experts_weights(s, 701);
  Routing r = random_routing(s, 200, 4, DType::kF32, 702, RoutingCase::kRandom);
  QuantizedReference ref = experts_reference_f64_bounded(s, w, r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_EQ(ref.elements, 200 * 4 * 200);
  EXPECT_LT(double(ref.near_midpoints), 0.01 * double(ref.elements));
  EXPECT_LT(ref.crossing_bound, 5e-3 * l2_f64(ref.out)) << ref.near_midpoints << " of " << ref.elements;
}

// The reference itself, on one hand-checkable element: one expert, H = I = 1 row block, weights
// and activations exactly representable, so every quantization is exact.
TEST(QuantExpertsCpu, ReferenceMatchesHandComputedValue) {
  ExpertsSpec s = fp8(DType::kF32, 1, 2, 1, /*gated=*/false);
  s.act = Activation::kRelu;
  ExpertsWeights w;
  w.gate_up = Tensor::empty({1, 1, 2}, DType::kF8E4M3);
  w.down = Tensor::empty({1, 2, 1}, DType::kF8E4M3);
  w.gate_up_scale = Tensor::from_floats({0.5f}, {1, 1, 1});
  w.down_scale = Tensor::from_floats({2.f}, {1, 1, 1});
  uint8_t* gu = static_cast<uint8_t*>(w.gate_up.raw());
  uint8_t* dn = static_cast<uint8_t*>(w.down.raw());
  gu[0] = float_to_f8e4m3(2.f), gu[1] = float_to_f8e4m3(-1.f);
  dn[0] = float_to_f8e4m3(1.5f), dn[1] = float_to_f8e4m3(-3.f);
  // x = [448, 224]: scale 1, codes exact. gate_up: 0.5 * (2*448 - 224) = 336; relu 336; its
  // block scale 336/448 = 0.75, code 448 exactly; down: 2 * 1.5 * 336 = 1008, 2 * -3 * 336 = -2016.
  Tensor hidden = Tensor::from_floats({448.f, 224.f}, {1, 2});
  Tensor idx = Tensor::from_ints({0}, {1, 1});
  Tensor tw = Tensor::from_floats({0.5f}, {1, 1});
  Tensor ref = experts_reference_f64(s, w, hidden, idx, tw);
  EXPECT_DOUBLE_EQ(ref.data<double>()[0], 0.5 * 1008);
  EXPECT_DOUBLE_EQ(ref.data<double>()[1], 0.5 * -2016);
  for (const std::string& b : kCpuBackends) {
    std::vector<float> o = experts_forward(b, s, w, hidden, idx, tw).to_float_vector();
    EXPECT_EQ(o[0], 504.f) << b;
    EXPECT_EQ(o[1], -1008.f) << b;
  }
}

// The kernel tier on its own, one test per variant (the backends run only the one this CPU's
// features pick; a variant this CPU lacks is reported as skipped): every output of a ragged row
// range, for rows read through an index list, against the same sums in double; FP8 K = 200 and
// 160 end in the second and the first half of a 128 block, FP4 K = 96 inside one (three
// 32-blocks); FP4 K = 80 ends inside a 32 block, which only the kernels that also serve dense
// linears take (the experts' K is a multiple of 32). Codes are uniform over all but NaN, so about one in sixteen is an e4m3 subnormal
// (which the bf16 kernel adds outside VDPBF16PS).
class QuantKernelVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantKernelVariant, MatchesDoubleSums) {
  namespace k = moex::cpu::kernels;
  const std::string name = GetParam();
  const auto& f = moex::cpu::detect_cpu_features();
  if ((name == "avx512" && !f.avx512) || (name == "avx512bf16" && !f.avx512bf16) ||
      (name == "avx2" && !(f.avx2_fma && f.f16c)))
    GTEST_SKIP() << "this CPU has no " << name;
  const k::BlockScaledFn fn = name == "portable" ? k::gemm_block_scaled_portable
                              : name == "avx2"   ? k::gemm_block_scaled_avx2
                              : name == "avx512" ? k::gemm_block_scaled_avx512
                                                 : k::gemm_block_scaled_avx512bf16;
  std::mt19937_64 rng(1001);
  const auto no_nan = [](uint64_t r) { return uint8_t((r & 0x7f) == 0x7f ? r & 0xfe : r); };
  for (const auto& [is_fp4, K] : {std::pair<bool, int64_t>{false, 200}, {false, 160}, {true, 96}, {true, 80}}) {
    if (K % 32 && name != "avx2" && name != "avx512bf16") continue;
    const int64_t N = 37, M = 11, nb = (K + 127) / 128;
    const int64_t row_bytes = is_fp4 ? K / 2 : K, scols = is_fp4 ? (K + 31) / 32 : nb;
    const int64_t srows = is_fp4 ? N : (N + 127) / 128;
    std::vector<uint8_t> w(static_cast<size_t>(N * row_bytes)), scale(static_cast<size_t>(srows * scols));
    for (auto& b : w) b = is_fp4 ? uint8_t(rng()) : no_nan(rng());
    for (auto& b : scale) b = uint8_t(120 + rng() % 10);             // UE8M0 2^-7 .. 2^2
    std::vector<float> xq(static_cast<size_t>(M * nb * 128), 0.f), xs(static_cast<size_t>(M * nb));
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t c = 0; c < K; ++c) xq[size_t(m * nb * 128 + c)] = f8e4m3_to_float(no_nan(rng()));
      for (int64_t b = 0; b < nb; ++b) xs[size_t(m * nb + b)] = float(rng() % 1000 + 1) * 1e-3f;
    }
    std::vector<int64_t> rows(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) rows[size_t(m)] = (m * 7) % M;
    k::BlockScaledArgs a;
    a.fp4 = is_fp4, a.w = w.data(), a.row_bytes = row_bytes, a.k = K;
    a.scale = scale.data(), a.scale_dtype = DType::kF8E8M0, a.scale_cols = scols;
    a.fused_rows = N, a.bn = is_fp4 ? 1 : 128;
    a.xq = xq.data(), a.xs = xs.data(), a.x_ld = nb * 128, a.nb = nb, a.x_rows = rows.data();
    a.m = int(M), a.n0 = 3, a.n1 = 30, a.ldy = N;
    // The bf16 kernel's rows: packed from the columns in order (FP4's xq is evens-then-odds).
    std::vector<uint16_t> xb(xq.size());
    std::vector<float> natural(size_t(nb * 128));
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t c = 0; c < nb * 128; ++c) {
        const int64_t r = c % 32, pos = is_fp4 ? c - r + (r % 2 ? 16 + r / 2 : r / 2) : c;
        natural[size_t(c)] = xq[size_t(m * nb * 128 + pos)];
      }
      k::pack_activation_bf16(natural.data(), nb * 128, &xb[size_t(m * nb * 128)]);
    }
    {
      a.xb = name == "avx512bf16" ? xb.data() : nullptr;
      // Activation-row counts on each side of the weight-row pairing's threshold, under both
      // thresholds (a CPU's backends run one of them).
      for (const int mm : {1, 2, 3, int(M)}) {
        std::vector<float> from_one;
        for (const int pair_from : {1, 3}) {
          a.m = mm;
          a.pair_from_rows = pair_from;
          std::vector<float> y(static_cast<size_t>(M * N), -7.f);
          a.y = y.data();
          fn(a);
          // The pairing changes which loads are shared, never a sum: the same bits.
          if (pair_from == 1) from_one = y;
          else EXPECT_EQ(std::memcmp(from_one.data(), y.data(), sizeof(float) * y.size()), 0)
              << name << " m=" << mm << ": pairs from 1 and from 3 rows differ";
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              if (n < 3 || n >= 30 || m >= mm) {
                EXPECT_EQ(y[size_t(m * N + n)], -7.f) << "wrote outside its rows";
                continue;
              }
              // Activation columns are stored evens-then-odds per 32 block for FP4.
              double want = 0, mag = 0;  // float32 error scales with the sum of |terms|
              for (int64_t c = 0; c < K; ++c) {
                const int64_t r = c % 32, pos = is_fp4 ? c - r + (r % 2 ? 16 + r / 2 : r / 2) : c;
                const double wv = is_fp4 ? double(quant::fp4_weight(w.data() + n * row_bytes, c)) *
                                               e8m0_to_float(scale[size_t(n * scols + c / 32)])
                                         : double(f8e4m3_to_float(w[size_t(n * row_bytes + c)])) *
                                               e8m0_to_float(scale[size_t(c / 128)]);
                const int64_t xr = rows[size_t(m)];
                const double term = wv * xq[size_t(xr * nb * 128 + pos)] * xs[size_t(xr * nb + c / 128)];
                want += term;
                mag += std::fabs(term);
              }
              EXPECT_NEAR(y[size_t(m * N + n)], want, 1e-6 * mag)
                  << name << (is_fp4 ? " fp4" : " fp8") << " m=" << m << " of " << mm << " n=" << n
                  << " pairs from " << pair_from;
            }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(QuantExpertsCpu, QuantKernelVariant,
                         ::testing::Values("portable", "avx2", "avx512", "avx512bf16"),
                         [](const auto& info) { return info.param; });

// The AVX2 kernel decodes e4m3 subnormals to float subnormals: a caller that flushes denormals
// (MXCSR FTZ | DAZ, as torch.set_flush_denormal(True) does) must get the same bits as one that
// does not, and its mode back. Every weight code here is a subnormal (exponent 0).
TEST(QuantExpertsCpu, Avx2KernelKeepsSubnormalCodesUnderFlushToZero) {
  namespace k = moex::cpu::kernels;
  const auto& f = moex::cpu::detect_cpu_features();
  if (!(f.avx2_fma && f.f16c)) GTEST_SKIP() << "this CPU has no avx2";
  const int64_t N = 5, K = 256, nb = 2;
  std::vector<uint8_t> w(static_cast<size_t>(N * K));
  for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t((i % 7 + 1) | (i % 3 ? 0 : 0x80));
  const std::vector<float> scale = {0.5f, 0.25f};  // float scales, one 128 x 128 block row
  std::vector<float> xq(static_cast<size_t>(K)), xs = {1.f, 2.f};
  for (int64_t c = 0; c < K; ++c) xq[size_t(c)] = f8e4m3_to_float(uint8_t(c % 5 + 1));  // subnormal too
  k::BlockScaledArgs a;
  a.w = w.data(), a.row_bytes = K, a.k = K, a.scale = scale.data(), a.scale_dtype = DType::kF32;
  a.scale_cols = nb, a.fused_rows = N, a.bn = 128, a.xq = xq.data(), a.xs = xs.data(), a.x_ld = K;
  a.nb = nb, a.m = 1, a.n0 = 0, a.n1 = N, a.ldy = N;
  std::vector<float> ieee(static_cast<size_t>(N)), flushed(static_cast<size_t>(N));
  a.y = ieee.data();
  k::gemm_block_scaled_avx2(a);
  const unsigned caller = _mm_getcsr();
  _mm_setcsr(caller | 0x8040u);
  a.y = flushed.data();
  k::gemm_block_scaled_avx2(a);
  const unsigned after = _mm_getcsr();
  _mm_setcsr(caller);
  EXPECT_EQ(after, caller | 0x8040u) << "the caller's MXCSR was not restored";
  EXPECT_EQ(std::memcmp(ieee.data(), flushed.data(), sizeof(float) * ieee.size()), 0);
  for (int64_t n = 0; n < N; ++n) {
    double want = 0;
    for (int64_t c = 0; c < K; ++c)
      want += double(f8e4m3_to_float(w[size_t(n * K + c)])) * xq[size_t(c)] * xs[size_t(c / 128)] *
              scale[size_t(c / 128)];
    EXPECT_NE(want, 0.0);
    EXPECT_NEAR(ieee[size_t(n)], want, 1e-6 * std::fabs(want)) << "row " << n;
  }
}

// ---- boundary errors ----

std::string invalid_message(const ExpertsSpec& s, const ExpertsWeights& w) {
  try {
    validate_experts_weights(s, w);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(QuantExpertsCpu, BoundaryErrorsNameTheProblem) {
  const ExpertsSpec s = fp8(DType::kF32, 3, 160, 200);
  const ExpertsWeights good = random_quantized_experts_weights(s, 801);
  EXPECT_EQ(invalid_message(s, good), "(accepted)");
  {
    ExpertsWeights w = good;
    w.down_scale = Tensor();
    EXPECT_NE(invalid_message(s, w).find("'down_scale' is missing"), std::string::npos);
  }
  {
    ExpertsWeights w = good;  // one scale row short
    w.gate_up_scale = Tensor::zeros({3, 3, 2}, DType::kF32);
    const std::string m = invalid_message(s, w);
    EXPECT_NE(m.find("'gate_up_scale' has shape [3, 3, 2], expected [3, 4, 2]"), std::string::npos) << m;
  }
  {
    ExpertsWeights w = good;
    w.gate_up_scale = Tensor::zeros({3, 4, 2}, DType::kF8E8M0);
    const std::string m = invalid_message(s, w);
    EXPECT_NE(m.find("'gate_up_scale' has dtype float8_e8m0fnu, expected float32"), std::string::npos) << m;
  }
  {
    ExpertsWeights w = good;
    w.down = Tensor::zeros({3, 160, 200}, DType::kBF16);
    const std::string m = invalid_message(s, w);
    EXPECT_NE(m.find("'down_proj' has dtype bfloat16, expected float8_e4m3fn"), std::string::npos) << m;
  }
  {
    ExpertsSpec b = s;
    b.has_bias = true;
    const std::string m = invalid_message(b, good);
    EXPECT_NE(m.find("without biases"), std::string::npos) << m;
  }
  {
    ExpertsSpec b = s;
    b.is_transposed = true;
    EXPECT_NE(invalid_message(b, good).find("untransposed"), std::string::npos);
  }
  {
    ExpertsSpec b = s;
    b.quant.block_k = 64;
    EXPECT_NE(invalid_message(b, good).find("128 x 128"), std::string::npos);
  }
  {
    const ExpertsSpec f = fp4(2, 48, 64);
    ExpertsWeights w;  // the check on H comes before any tensor is looked at
    const std::string m = invalid_message(f, w);
    EXPECT_NE(m.find("multiples of 32"), std::string::npos) << m;
    EXPECT_NE(m.find("H=48"), std::string::npos) << m;
  }
  {
    const ExpertsSpec f = fp4(2, 64, 64);
    ExpertsWeights w = random_quantized_experts_weights(f, 802);
    w.down_scale = Tensor::zeros({2, 64, 2}, DType::kF32);
    const std::string m = invalid_message(f, w);
    EXPECT_NE(m.find("'down_scale' has dtype float32, expected float8_e8m0fnu"), std::string::npos) << m;
    ExpertsSpec f32 = f;
    f32.quant.scale_dtype = DType::kF32;
    EXPECT_NE(invalid_message(f32, w).find("UE8M0"), std::string::npos);
  }
  {
    // Scales without a quantized spec are a mistake too.
    ExpertsSpec plain;
    plain.num_experts = 2, plain.hidden = 8, plain.intermediate = 4;
    ExpertsWeights w = random_experts_weights(plain, DType::kF32, 803);
    w.down_scale = Tensor::zeros({2, 1, 1}, DType::kF32);
    EXPECT_NE(invalid_message(plain, w).find("not quantized"), std::string::npos);
  }
  // Hidden of a non-float dtype is refused at the call.
  Routing r = random_routing(s, 2, 1, DType::kF32, 804, RoutingCase::kRandom);
  Tensor ints = Tensor::zeros({2, 160}, DType::kI32);
  EXPECT_THROW(experts_forward("eager", s, good, ints, r.top_k_index, r.top_k_weights), InvalidInput);
}

// A backend that does not declare quantized_weights (a user's own backend, say) is
// refused at the boundary with a message naming the reason, never run on FP8 bytes.
TEST(QuantExpertsCpu, BackendsWithoutQuantizedCapsRefuseClearly) {
  struct PlainOnly final : ExpertsBackend {
    BackendCaps caps() const override {
      BackendCaps c;
      c.devices = {DeviceKind::kCPU};
      c.dtypes = {DType::kF32, DType::kBF16};
      c.description = "test: unquantized only";
      return c;
    }
    void forward(const ExpertsProblem&, Tensor&, const ExecContext&) const override {
      ADD_FAILURE() << "must not run";
    }
  };
  register_experts_backend("test_plain_only", std::make_shared<PlainOnly>());
  const ExpertsSpec s = fp8(DType::kF32, 2, 160, 64);
  const ExpertsWeights w = random_quantized_experts_weights(s, 1101);
  Routing r = random_routing(s, 3, 1, DType::kF32, 1102, RoutingCase::kRandom);
  try {
    experts_forward("test_plain_only", s, w, r.hidden, r.top_k_index, r.top_k_weights);
    ADD_FAILURE() << "accepted quantized weights";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("does not accept quantized (FP8 / FP4) expert weights"),
              std::string::npos) << e.what();
  }
}

// ---- memory ----

int64_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * int64_t(sysconf(_SC_PAGE_SIZE));
}

TEST(QuantExpertsCpu, HoldsNoFullPrecisionCopy) {
  const ExpertsSpec s = fp8(DType::kF32, 8, 1024, 1024);
  Experts experts(s, random_quantized_experts_weights(s, 901));
  const int64_t E = 8, H = 1024, I = 1024, weights = E * 3 * H * I;
  const int64_t scales = E * (2 * 8 * 8 + 8 * 8) * 4;
  // The held size is the stored one: 1 byte per FP8 weight plus the scales.
  EXPECT_EQ(experts.stored_weights().nbytes(), weights + scales);
  Routing r = random_routing(s, 16, 4, DType::kBF16, 902, RoutingCase::kEveryExpert);
  (void)experts.forward("eager", r.hidden, r.top_k_index, r.top_k_weights);  // warm the allocator
  const int64_t before = resident_bytes();
  for (const std::string& b : kCpuBackends) {
    experts.prepare(b);
    (void)experts.forward(b, r.hidden, r.top_k_index, r.top_k_weights);
  }
  // A bf16 copy of the experts would add 2x the weight bytes, a float32 one 4x.
  EXPECT_LT(resident_bytes() - before, weights / 4);

  const ExpertsSpec f = fp4(8, 1024, 1024);
  Experts e4(f, random_quantized_experts_weights(f, 903));
  EXPECT_EQ(e4.stored_weights().nbytes(), weights / 2 + E * 3 * H * I / 32);
}

// kB of transparent huge pages (smaps "AnonHugePages") in the mappings that overlap [p, p + n).
int64_t anon_huge_kb(const void* p, size_t n) {
  std::ifstream f("/proc/self/smaps");
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  bool inside = false;
  int64_t kb = 0;
  for (std::string line; std::getline(f, line);) {
    unsigned long a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      inside = a < hi && b > lo;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      kb += std::atoll(line.c_str() + 14);
    }
  }
  return kb;
}

// prepare() moves the codes onto huge pages in place: the same bytes, the same results, the 2 MiB
// pages inside each code tensor backed by huge pages where the kernel collapses (Linux 6.1+, THP
// not "never"; elsewhere the check of the pages is skipped, the rest still holds).
TEST(QuantExpertsCpu, PrepareMovesCodesOntoHugePages) {
  const ExpertsSpec s = fp8(DType::kF32, 8, 1024, 1024);
  const ExpertsWeights w = random_quantized_experts_weights(s, 905);
  const Tensor codes_before = w.gate_up.clone();
  const int64_t huge_before = anon_huge_kb(w.gate_up.raw(), w.gate_up.nbytes());
  Routing r = random_routing(s, 9, 4, DType::kBF16, 906, RoutingCase::kEveryExpert);
  // The result on a copy of the codes (experts_forward prepares the weights it is given).
  ExpertsWeights copy = w;
  copy.gate_up = w.gate_up.clone();
  copy.down = w.down.clone();
  const Tensor before = experts_forward("grouped_mm", s, copy, r.hidden, r.top_k_index, r.top_k_weights);
  Experts experts(s, w);  // shares the storage
  experts.prepare("grouped_mm");
  EXPECT_EQ(std::memcmp(codes_before.raw(), w.gate_up.raw(), w.gate_up.nbytes()), 0);
  const Tensor after = experts.forward("grouped_mm", r.hidden, r.top_k_index, r.top_k_weights);
  EXPECT_EQ(l2(after, &before), 0.0);
  // An undefined tensor has no memory to collapse.
  EXPECT_FALSE(Tensor().collapse_to_huge_pages());
  // A probe of the same size says whether this kernel collapses at all.
  const Tensor probe = w.gate_up.clone();
  if (!probe.collapse_to_huge_pages()) GTEST_SKIP() << "this kernel does not collapse to huge pages";
  // Whole 2 MiB pages inside the 16 MiB gate_up: at least 7.
  EXPECT_GE(anon_huge_kb(w.gate_up.raw(), w.gate_up.nbytes()) - huge_before, 7 * 2048);
}

}  // namespace
